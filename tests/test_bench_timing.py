"""The probes' variants (``benchmarks/timing.py``): module constants of the package set
for a block and restored after it, whatever happens, with the plans built inside the block
following them."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from timing import constants, parse_variant  # noqa: E402

from mamba_align import kernels as K  # noqa: E402
from mamba_align.kernels import copy as kc  # noqa: E402


def test_a_variant_is_named_and_parsed():
    assert parse_variant("t1k:kernels.copy.TEMPORAL_PROGRAMS=1024,kernels.bookkeeping.WARPS=2") \
        == ("t1k", {"kernels.copy.TEMPORAL_PROGRAMS": 1024, "kernels.bookkeeping.WARPS": 2})
    for bad in (":kernels.copy.TEMPORAL_PROGRAMS=1", "current:kernels.copy.TEMPORAL_PROGRAMS=1"):
        with pytest.raises(ValueError):
            parse_variant(bad)


def test_constants_reach_the_plans_and_are_restored():
    pool, err = K.ArraySpec.row_major((2, 9, 64), "float32"), K.ArraySpec.row_major((2,), "int32")
    ids = K.ArraySpec.row_major((64,), "int64")
    before, own = kc.TEMPORAL_PROGRAMS, K.plan_copy_temporal(pool, err, ids, ids).grid
    with constants({"kernels.copy.TEMPORAL_PROGRAMS": 2}):
        assert kc.TEMPORAL_PROGRAMS == 2
        assert K.plan_copy_temporal(pool, err, ids, ids).grid != own  # not a cached plan
    assert kc.TEMPORAL_PROGRAMS == before and K.plan_copy_temporal(pool, err, ids, ids).grid == own
    # a constant that does not exist changes nothing, even after one that does
    with pytest.raises(AttributeError):
        with constants({"kernels.copy.TEMPORAL_PROGRAMS": 2, "kernels.copy.NO_SUCH": 1}):
            pass
    assert kc.TEMPORAL_PROGRAMS == before
    # a failure inside the block restores too
    with pytest.raises(RuntimeError):
        with constants({"kernels.copy.TEMPORAL_PROGRAMS": 2}):
            raise RuntimeError
    assert kc.TEMPORAL_PROGRAMS == before and K.plan_copy_temporal(pool, err, ids, ids).grid == own

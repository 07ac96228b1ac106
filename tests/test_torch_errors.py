"""The torch backend rejects bad arguments with clear errors (dtype, shape, device, layout)
and, since it never reads values on the host, its kernels ignore out-of-range ids rather
than writing outside a pool or the bookkeeping arrays."""

import pytest
import torch

from mamba_align.backends.torch import StateRunner
from mamba_align.core import CacheConfig, ConvSpec, TemporalSpec

DEV = "cuda" if torch.cuda.is_available() else "cpu"
ops = torch.ops.mamba_align


def ids(*v, dtype=torch.int64):
    return torch.tensor(v, dtype=dtype, device=DEV)


@pytest.fixture
def pool():
    return torch.arange(2 * 6 * 3 * 4, dtype=torch.float32, device=DEV).view(2, 6, 3, 4)


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda p: ops.copy_temporal_(p, ids(1).float(), ids(2)), TypeError, "src must have dtype"),
        (lambda p: ops.copy_temporal_(p, ids(1, 2), ids(3)), ValueError, "dst must have shape"),
        (lambda p: ops.copy_temporal_(p, ids(1).view(1, 1), ids(3)), ValueError, "src must have shape"),
        (lambda p: ops.copy_temporal_(p, ids(1, 2, 3, 4)[::2], ids(3, 4)), ValueError, "contiguous"),
        (lambda p: ops.copy_temporal_(p.transpose(2, 3), ids(1), ids(2)), ValueError, "inner block"),
        (lambda p: ops.copy_conv_(p, ids(1), ids(2), ids(0), "XY"), ValueError, "layout"),
        (lambda p: ops.copy_conv_(p[0], ids(1), ids(2), ids(0), "SD"), ValueError, "pool must be"),
        (lambda p: ops.copy_conv_(p, ids(1), ids(2), ids(0, 1), "SD"), ValueError, "shift must have shape"),
        (lambda p: ops.copy_conv_(p, ids(1), ids(2), ids(True, dtype=torch.bool), "SD"), TypeError,
         "shift must have dtype"),
    ],
)
def test_copy_argument_errors(pool, call, exc, match):
    before = pool.clone()
    with pytest.raises(exc, match=match):
        call(pool)
    assert torch.equal(pool, before)  # nothing written on bad input


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device kind")
def test_copy_on_mixed_devices_is_rejected(pool):
    with pytest.raises(ValueError, match="one device"):
        ops.copy_temporal_(pool, ids(1).cpu(), ids(2).cpu())


def test_out_of_range_block_ids_write_nothing(pool):
    before = pool.clone()
    ops.copy_temporal_(pool, ids(1, 99, 2), ids(6, 3, -5))
    ops.copy_conv_(pool, ids(1, 2, 3), ids(7, 4, 5), ids(0, 9, -1), "SD")  # shift out of range
    assert torch.equal(pool, before)


def runner():
    cfg = CacheConfig(4, 1, 1, {"conv": ConvSpec(3, 4), "ssm": TemporalSpec((2, 2))})
    r = StateRunner(cfg, 4, DEV, index_dtype=torch.int64)
    pools = {n: torch.zeros(cfg.pool_shape(n, 12), device=DEV).to(
        torch.bfloat16 if n == "conv" else torch.float32) for n in cfg.states}
    return r, pools


def test_runner_argument_errors():
    r, pools = runner()
    bt = torch.arange(16, device=DEV).view(4, 4)
    idx, q, spec = ids(0, 1), ids(2, 2), torch.ones(2, dtype=torch.bool, device=DEV)
    with pytest.raises(KeyError, match="ssm"):
        r.preprocess({"conv": pools["conv"]}, idx, q, spec, bt)
    with pytest.raises(ValueError, match="layers"):
        r.preprocess(dict(pools, ssm=torch.cat([pools["ssm"]] * 2)), idx, q, spec, bt)
    with pytest.raises(ValueError, match="query_len must have shape"):
        r.preprocess(pools, idx, ids(1), spec, bt)
    with pytest.raises(TypeError, match="idx_mapping must have dtype"):
        r.preprocess(pools, idx.float(), q, spec, bt)
    with pytest.raises(ValueError, match="block_table must have shape"):
        r.preprocess(pools, idx, q, spec, bt[0])
    with pytest.raises(TypeError, match="is_spec must have dtype"):
        r.preprocess(pools, idx, q, spec.float(), bt)
    with pytest.raises(ValueError, match="num_sampled must have shape"):
        r.postprocess(pools, idx, q, spec, ids(1), bt)
    with pytest.raises(ValueError, match="mode"):
        StateRunner(r.config, 4, DEV, mode="lazy")
    with pytest.raises(TypeError, match="index_dtype"):
        StateRunner(r.config, 4, DEV, index_dtype=torch.float32)


def test_out_of_range_slots_touch_nothing():
    r, pools = runner()
    bt = torch.arange(1, 17, device=DEV).view(4, 4)
    r.add_requests(ids(0, 7), ids(5, 9))  # slot 7 does not exist: ignored
    assert r.state_idx.tolist() == [1, -1, -1, -1] and r.num_computed.tolist() == [5, 0, 0, 0]
    spec = torch.ones(2, dtype=torch.bool, device=DEV)
    s = r.preprocess(pools, ids(9, 0), ids(2, 2), spec, bt)  # row 0 maps to a missing slot
    assert s.state_idx.tolist() == [-1, 1] and s.temporal_read.tolist()[0] == -1
    assert r.state_idx.tolist() == [1, -1, -1, -1]


def test_overlapping_pool_strides_are_rejected_and_transposed_layouts_accepted():
    base = torch.zeros(10_000, device=DEV)
    overlapping = base.as_strided((2, 5, 3, 4), (24, 12, 4, 1))  # layer 1 = layer 0, block 2
    with pytest.raises(ValueError, match="overlap"):
        ops.copy_temporal_(overlapping, ids(1), ids(2))
    blocks_first = torch.zeros(5, 2, 3, 4, device=DEV).transpose(0, 1)  # [L, NB] view of [NB, L]
    blocks_first[:, 1] = 7.0
    ops.copy_temporal_(blocks_first, ids(1), ids(3))
    assert (blocks_first[:, 3] == 7.0).all() and (blocks_first[:, 2] == 0).all()

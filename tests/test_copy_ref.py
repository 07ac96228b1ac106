"""The copy reference (SPEC.md §2 ``copy_block``) against an element-by-element reading of
the SPEC text: byte-exact, untouched blocks keep their sentinel, in-place shifts behave
like memmove, negative sources do nothing."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mamba_align.core import (
    CacheConfig,
    ConvSpec,
    CopyPlan,
    TemporalSpec,
    apply_conv_copy,
    apply_copy,
    apply_temporal_copy,
)

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]


def random_pool(rng, shape, dtype):
    """Random bits (NaN payloads included): equality must be on bytes, not on values."""
    itemsize = np.dtype(dtype).itemsize
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape).copy()


def same_bytes(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def plan(t_src, c_src, dst, shift):
    return CopyPlan(*(np.array(x, dtype=np.int64) for x in (t_src, c_src, dst, shift)))


def loop_conv(pool, p, layout):
    """SPEC text, element by element, reading the source as it was before the copy."""
    out = pool.copy()
    before = pool.copy()
    w = pool.shape[2] if layout == "SD" else pool.shape[3]
    for r in range(len(p.dst)):
        if p.csrc[r] < 0 or p.dst[r] < 0:
            continue
        for i in range(w - p.bias[r]):
            if layout == "SD":
                out[:, p.dst[r], i] = before[:, p.csrc[r], i + p.bias[r]]
            else:
                out[:, p.dst[r], :, i] = before[:, p.csrc[r], :, i + p.bias[r]]
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_temporal_copy_is_a_bit_copy_and_leaves_others(dtype):
    rng = np.random.default_rng(0)
    pool = random_pool(rng, (3, 9, 2, 4, 4), dtype)
    before = pool.copy()
    p = plan([5, -1, 2, 7], [4, -1, 2, 1], [1, 8, 2, 3], [1, 0, 0, 2])
    apply_temporal_copy(pool, p)
    assert same_bytes(pool[:, 1], before[:, 5])
    assert same_bytes(pool[:, 3], before[:, 7])
    assert same_bytes(pool[:, 2], before[:, 2])  # self-copy
    untouched = [b for b in range(9) if b not in (1, 3)]
    assert same_bytes(pool[:, untouched], before[:, untouched])  # block 8: source was -1


@pytest.mark.parametrize("layout", ["SD", "DS"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shift", [0, 1, 2, 3])
def test_conv_copy_matches_spec_elementwise(layout, dtype, shift):
    rng = np.random.default_rng(shift)
    w, d = 5, 6  # K = 3, S = 3
    shape = (2, 8, w, d) if layout == "SD" else (2, 8, d, w)
    pool = random_pool(rng, shape, dtype)
    p = plan([1, 3, -1], [1, 3, -1], [4, 3, 6], [shift, shift, 0])  # row 1 shifts in place
    want = loop_conv(pool, p, layout)
    apply_conv_copy(pool, p, layout)
    assert same_bytes(pool, want)


def test_conv_in_place_shift_is_memmove():
    pool = np.arange(2 * 3 * 6 * 1, dtype=np.float32).reshape(2, 3, 6, 1)
    before = pool.copy()
    apply_conv_copy(pool, plan([1], [1], [1], [2]), "SD")
    # rows 0..3 take rows 2..5 as they were; rows 4, 5 stay as they were
    assert np.array_equal(pool[:, 1, :4], before[:, 1, 2:])
    assert np.array_equal(pool[:, 1, 4:], before[:, 1, 4:])


@settings(max_examples=100)
@given(st.data())
def test_random_plans_match_elementwise_reading(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    layout = data.draw(st.sampled_from(["SD", "DS"]))
    nb = data.draw(st.integers(4, 12))
    k, s = data.draw(st.integers(2, 4)), data.draw(st.integers(0, 3))
    w = k - 1 + s
    rows = data.draw(st.integers(1, nb // 2))
    blocks = rng.permutation(np.arange(1, nb))
    dst = blocks[:rows]
    in_place = data.draw(st.lists(st.booleans(), min_size=rows, max_size=rows))
    src_pool = blocks[rows:]
    c_src = [int(dst[r]) if in_place[r] else int(rng.choice(src_pool)) for r in range(rows)]
    off = [data.draw(st.booleans()) for _ in range(rows)]
    c_src = [-1 if o else c for o, c in zip(off, c_src)]
    shift = [data.draw(st.integers(0, s)) for _ in range(rows)]
    p = plan(c_src, c_src, dst, shift)
    shape = (2, nb, w, 3) if layout == "SD" else (2, nb, 3, w)
    pool = random_pool(rng, shape, np.float32)
    want = loop_conv(pool, p, layout)
    apply_conv_copy(pool, p, layout)
    assert same_bytes(pool, want)


def test_apply_copy_dispatches_per_state_kind():
    cfg = CacheConfig(4, 1, 2, {"conv": ConvSpec(3, 4, "DS"), "ssm": TemporalSpec((2, 3))})
    rng = np.random.default_rng(1)
    pools = {n: random_pool(rng, cfg.pool_shape(n, 6), np.float32) for n in cfg.states}
    before = {n: p.copy() for n, p in pools.items()}
    p = plan([3], [2], [4], [1])
    apply_copy(pools, cfg, p)
    assert same_bytes(pools["ssm"][:, 4], before["ssm"][:, 3])
    assert same_bytes(pools["conv"][:, 4, :, :2], before["conv"][:, 2, :, 1:])
    assert same_bytes(pools["conv"][:, 4, :, 2:], before["conv"][:, 4, :, 2:])


def test_rows_that_race_are_rejected():
    pool = np.zeros((1, 6, 2), np.float32)
    with pytest.raises(ValueError, match="same destination"):
        apply_temporal_copy(pool, plan([1, 2], [1, 2], [3, 3], [0, 0]))
    with pytest.raises(ValueError, match="another row reads"):
        apply_temporal_copy(pool, plan([1, 3], [1, 3], [3, 4], [0, 0]))

"""Bad bookkeeping input on the device path (no host checks of values are possible there):
torch and JAX give the same answer, and it never names a block the row does not own."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from mamba_align import kernels as K
from mamba_align.backends import jax as mj
from mamba_align.backends.torch import ops as tops

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore:.*called outside jax.jit")
BT = np.arange(10, 26).reshape(4, 4)  # slot r owns blocks 10 + 4r .. 13 + 4r


def both(fn_torch, fn_jax, *arrays, **kw):
    t = fn_torch(*[torch.tensor(a, device=DEV) for a in arrays], **kw)  # copies: in place
    j = fn_jax(*[jnp.asarray(a, jnp.int32) for a in arrays], **kw)
    t = [x.cpu().numpy() for x in t]
    j = [np.asarray(x) for x in j]
    for a, b in zip(t, j):
        assert np.array_equal(a.astype(np.int64), b.astype(np.int64))
    return t


def resolve_t(*a, num_spec):
    return tops.call("resolve", *a, num_spec, False)


def resolve_j(*a, num_spec):
    return mj.ops.resolve(*a, num_spec, "pre-copy")


def test_fresh_row_with_no_tokens_writes_nowhere():
    # slot 1 fresh (new column -1) with query_len 0: no window, so no write slot at all
    idx, q, spec = np.array([1, 2]), np.array([0, 1]), np.array([0, 1])
    src_col, src_bias, run_col = np.array([-1, -1]), np.array([0, 0]), np.array([-1, -3])
    acc = np.ones(4, np.int64)
    out = both(resolve_t, resolve_j, idx, q, spec, BT, src_col, src_bias, run_col, acc,
               num_spec=1)
    t_write, c_write = out[3], out[4]
    assert (t_write == -1).all() and (c_write == -1).all()


def test_is_spec_is_any_nonzero_value_in_both_backends():
    idx, q, spec = np.array([0]), np.array([2]), np.array([256])
    out = both(resolve_t, resolve_j, idx, q, spec, BT, np.array([0]), np.array([0]),
               np.array([0]), np.ones(4, np.int64), num_spec=1)
    assert out[3].tolist() == [[10, 11]]


def post_t(*a, block_size):
    return tops.call("postprocess_", *a, block_size)


def post_j(*a, block_size):
    out = mj.ops.postprocess(*a, block_size)
    return [out[n] for n in ("cache_col", "copy_tsrc", "copy_csrc", "copy_dst", "copy_bias")]


@pytest.mark.parametrize(
    "state_idx,acc,nc,q,ns",
    [
        (-1, 1, 0, 4, 4),  # post-process without preprocess: no running column
        (2, 1, 3, 9, 2),  # boundary far behind the window (query_len > 1 + S)
        (0, 1, 2, 2, 50),  # num_sampled > query_len: clamped, never trusted
    ],
)
def test_inconsistent_postprocess_copies_and_caches_nothing_foreign(state_idx, acc, nc, q, ns):
    st = [np.array([state_idx, -1, -1, -1]), np.array([acc, 1, 1, 1]), np.array([nc, 0, 0, 0])]
    out = both(post_t, post_j, *st, np.array([0]), np.array([q]), np.array([1]),
               np.array([ns]), BT, block_size=4)
    cache, tsrc, csrc, dst = (int(x[0]) for x in out[:4])
    for blk in (tsrc, csrc, dst):
        assert blk == -1 or 10 <= blk <= 13  # only slot 0's own blocks
    assert cache in (-1, state_idx, state_idx - 1)


def test_bad_static_scalars_and_short_block_tables_are_rejected():
    si, acc, nc = (torch.zeros(4, dtype=torch.int64, device=DEV) for _ in range(3))
    idx = torch.zeros(1, dtype=torch.int64, device=DEV)
    bt = torch.as_tensor(BT, device=DEV)
    with pytest.raises(ValueError, match="block_size"):
        tops.call("preprocess_", si, acc, nc, idx, idx + 1, bt, 0)
    with pytest.raises(ValueError, match="block_size"):
        mj.ops.preprocess(*(jnp.zeros(4, jnp.int32),) * 3, jnp.zeros(1, jnp.int32),
                          jnp.ones(1, jnp.int32), jnp.asarray(BT, jnp.int32), 0)
    with pytest.raises(ValueError, match="num_spec"):
        tops.call("resolve", idx, idx + 1, idx, bt, idx, idx, idx, acc, -1, False)
    with pytest.raises(ValueError, match="fewer than the 4 slots"):
        tops.call("preprocess_", si, acc, nc, idx, idx + 1, bt[:2], 4)
    with pytest.raises(ValueError, match="fewer than the 4 slots"):
        mj.ops.preprocess(*(jnp.zeros(4, jnp.int32),) * 3, jnp.zeros(1, jnp.int32),
                          jnp.ones(1, jnp.int32), jnp.asarray(BT[:2], jnp.int32), 4)


def test_conv_copy_plan_stays_in_the_grid_limits_and_multi_tile_programs_copy_right():
    plan = K.plan_copy_conv(1, 1, 3, 70_000_000, 2, "SD")
    assert plan.grid[1] <= 65_535 and plan.constexprs["TILES_PER_PROGRAM"] >= 2
    # the same kernel with two channel tiles per program, on a small pool
    pool = torch.arange(2 * 5 * 4 * 100, dtype=torch.int32, device=DEV).view(2, 5, 4, 100)
    want = pool.clone()
    want[:, 3, :3] = pool[:, 1, 1:]
    want[:, 2, :2] = pool[:, 2, 2:]  # in place
    small = K.plan_copy_conv(2, 2, 4, 100, 4, "SD")
    tile_d = small.constexprs["TILE_D"]
    tiles = -(-100 // tile_d)
    two = dataclasses.replace(small, grid=(small.grid[0], -(-tiles // 2)),
                              constexprs=dict(small.constexprs, TILES_PER_PROGRAM=2))
    src, dst, shift = (torch.tensor(v, device=DEV) for v in ([1, 2], [3, 2], [1, 2]))
    tops._launch(two, {"pool": pool, "src": src, "dst": dst, "shift": shift},
                 K.pool_scalars(tuple(pool.shape), pool.stride(), "SD"))
    assert torch.equal(pool, want)


def test_empty_pools_are_a_no_op():
    pool = torch.zeros((0, 4, 8), device=DEV)
    tops.call("copy_temporal_", pool, torch.tensor([1], device=DEV), torch.tensor([2], device=DEV))
    out = mj.ops.copy_temporal(jnp.zeros((0, 4, 8)), jnp.array([1]), jnp.array([2]))
    assert out.shape == (0, 4, 8)

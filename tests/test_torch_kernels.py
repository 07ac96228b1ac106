"""The copy kernels launched from torch equal the core reference byte for byte on random
pools and plans (the bookkeeping kernels are checked step by step against the core, for
torch and JAX at once, in ``test_equivalence.py``). On CPU the kernels run in Triton's
interpreter; on the GPU machine the same tests run compiled (``make gpu``)."""

import ml_dtypes
import numpy as np
import pytest
import torch

import mamba_align.backends.torch  # noqa: F401  (registers torch.ops.mamba_align)
from mamba_align.core import CopyPlan, apply_conv_copy, apply_temporal_copy

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SENTINEL = 0x5A


def to_np(t):
    return t.detach().cpu().numpy()


def random_pool(gen, shape, dtype):
    """Random bits; bf16/fp16/fp32 NaN payloads included. Compared as bytes."""
    return torch.randint(-(2**15), 2**15, shape, generator=gen, dtype=torch.int32).to(
        torch.int16 if dtype in (torch.bfloat16, torch.float16) else torch.int32
    ).view(dtype)


def np_view(t):
    """A NumPy *copy* of a torch pool with the same bytes (bf16 through ml_dtypes); on the
    CPU ``.numpy()`` shares memory, and the reference must not write into the kernel's pool."""
    a = to_np(t.view(torch.int16) if t.dtype == torch.bfloat16 else t).copy()
    return a.view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else a


def same_bytes(t, a):
    return np.array_equal(to_np(t).view(np.uint8) if t.dtype != torch.bfloat16
                          else to_np(t.view(torch.int16)).view(np.uint8), a.view(np.uint8))


def random_copy_plan(rng, rows, nb, max_shift):
    """Rows with distinct destinations: plain copies, self-copies / in-place shifts,
    sources < 0 and skipped (-1) rows."""
    blocks = rng.permutation(np.arange(1, nb))
    dst = blocks[:rows].copy()
    spare = blocks[rows:]
    kind = rng.integers(0, 4, rows)  # 0 copy, 1 in place, 2 src -1, 3 skipped row
    tsrc = np.where(kind == 1, dst, rng.choice(spare, rows))
    csrc = np.where(kind == 1, dst, rng.choice(spare, rows))
    tsrc[kind >= 2] = -1
    csrc[kind >= 2] = -1
    dst[kind == 3] = -1
    shift = rng.integers(0, max_shift + 1, rows)
    return CopyPlan(tsrc.astype(np.int64), csrc.astype(np.int64), dst.astype(np.int64),
                    shift.astype(np.int64))


@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("block", [(4, 8, 8), (3, 5, 7)])  # aligned whole tiles / neither
def test_temporal_copy_kernel_is_byte_exact(rows, dtype, index_dtype, block):
    gen = torch.Generator().manual_seed(rows)
    rng = np.random.default_rng(rows)
    nb = 2 * rows + 3
    pool = random_pool(gen, (3, nb) + block, dtype)
    plan = random_copy_plan(rng, rows, nb, 0)
    want = np_view(pool)
    apply_temporal_copy(want, plan)
    t = pool.to(DEVICE, copy=True)
    idx = lambda a: torch.as_tensor(a, dtype=index_dtype, device=DEVICE)  # noqa: E731
    torch.ops.mamba_align.copy_temporal_(t, idx(plan.tsrc), idx(plan.dst))
    assert same_bytes(t, want)


@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize("layout", ["SD", "DS"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("S", [0, 1, 3])
@pytest.mark.parametrize("D", [40, 64])  # a partial channel tile / whole tiles
def test_conv_copy_kernel_is_byte_exact(rows, layout, dtype, S, D):
    gen = torch.Generator().manual_seed(7 * rows + S)
    rng = np.random.default_rng(7 * rows + S)
    nb, K = 2 * rows + 3, 4
    W = K - 1 + S
    shape = (2, nb, W, D) if layout == "SD" else (2, nb, D, W)
    pool = random_pool(gen, shape, dtype)
    plan = random_copy_plan(rng, rows, nb, S)
    want = np_view(pool)
    apply_conv_copy(want, plan, layout)
    t = pool.to(DEVICE, copy=True)
    i64 = lambda a: torch.as_tensor(a, device=DEVICE)  # noqa: E731
    torch.ops.mamba_align.copy_conv_(t, i64(plan.csrc), i64(plan.dst), i64(plan.bias), layout)
    assert same_bytes(t, want)


def test_copies_leave_untouched_blocks_and_padded_strides_alone():
    # A page-padded pool: blocks live inside a larger allocation; the padding must survive.
    base = torch.full((2, 6, 3 * 8 + 5), SENTINEL, dtype=torch.int32, device=DEVICE)
    pool = base[:, :, : 3 * 8].view(2, 6, 3, 8)  # block stride 29, layer stride 174
    pool[:, 2] = torch.arange(48, dtype=torch.int32, device=DEVICE).view(2, 3, 8)
    before = base.clone()
    i64 = lambda a: torch.tensor(a, device=DEVICE)  # noqa: E731
    torch.ops.mamba_align.copy_conv_(pool.view(torch.float32), i64([2]), i64([4]), i64([1]), "SD")
    torch.ops.mamba_align.copy_temporal_(pool.view(torch.float32), i64([2]), i64([5]))
    changed = (base != before).any(dim=-1).any(dim=0)
    assert changed.tolist() == [False, False, False, False, True, True]
    assert torch.equal(base[:, :, 24:], before[:, :, 24:])  # padding untouched
    assert torch.equal(pool[:, 4, :2], pool[:, 2, 1:]) and torch.equal(pool[:, 4, 2], before[:, 4, 16:24])
    assert torch.equal(pool[:, 5], pool[:, 2])


def test_copy_grids_stay_near_the_target_program_count():
    # An empty decode step launches every program: the grid must not grow with rows x
    # layers x block size (it used to: 1.2 M programs, 713 us, at 256 rows of 36 x 2 MiB).
    from mamba_align.kernels import copy as kc

    numel = 32 * 128 * 128
    for rows in (1, 8, 64, 256, 4096):
        plan = kc.plan_copy_temporal(rows, 36, numel, 4, 16)
        tiles, layers, groups = plan.grid
        # one program per tile and layer (per 1024 rows for huge batches)
        assert (tiles, layers) == (512, 36) and groups == -(-rows // kc.MAX_ROWS_PER_PROGRAM)
        assert tiles * layers * groups <= 512 * 36 * -(-rows // kc.MAX_ROWS_PER_PROGRAM)
        assert groups * plan.constexprs["ROWS_PER_PROGRAM"] >= rows and plan.constexprs["EVEN"]
        conv = kc.plan_copy_conv(rows, 36, 3, 8192, 2, "SD", 16)
        assert conv.grid[0] * conv.grid[1] <= max(2 * kc.CONV_PROGRAMS, rows * 36)
        assert conv.grid[1] * conv.constexprs["TILES_PER_PROGRAM"] * conv.constexprs["TILE_D"] >= 8192
    # small blocks: rows spread over programs up to the target
    plan = kc.plan_copy_temporal(64, 2, 4096, 4, 16)
    assert plan.grid == (4, 2, 64) and plan.constexprs["ROWS_PER_PROGRAM"] == 1
    plan = kc.plan_copy_temporal(10_000, 2, 4096, 4, 16)
    assert plan.grid[0] * plan.grid[1] * plan.grid[2] <= kc.TEMPORAL_PROGRAMS
    # a huge batch: rows per program capped (they live in registers), groups stay in the grid
    plan = kc.plan_copy_temporal(3_000_000, 36, numel, 4, 16)
    assert plan.constexprs["ROWS_PER_PROGRAM"] == kc.MAX_ROWS_PER_PROGRAM
    assert plan.grid[2] * kc.MAX_ROWS_PER_PROGRAM >= 3_000_000 and plan.grid[2] <= 65_535


@pytest.mark.parametrize("rows_per_program", [1, 4, 16, 1024])
def test_temporal_copy_with_row_groups_and_a_ragged_block(rows_per_program):
    import dataclasses

    from mamba_align.backends.torch import ops as tops
    from mamba_align.kernels import plan_copy_temporal, pool_scalars

    numel = 3 * 1024 + 37  # four 4 KiB tiles, the last one partial
    gen = torch.Generator().manual_seed(9)
    rows, nb = 11, 26
    pool = random_pool(gen, (2, nb, numel), torch.float32).to(DEVICE)
    rng = np.random.default_rng(rows_per_program)
    plan = random_copy_plan(rng, rows, nb, 0)
    want = np_view(pool)
    apply_temporal_copy(want, plan)
    base = plan_copy_temporal(rows, 2, numel, 4)
    assert not base.constexprs["EVEN"]
    grouped = dataclasses.replace(
        base, grid=base.grid[:2] + (-(-rows // rows_per_program),),
        constexprs=dict(base.constexprs, ROWS_PER_PROGRAM=rows_per_program))
    bits = pool.view(torch.int32)
    idx = lambda a: torch.as_tensor(a, device=DEVICE)  # noqa: E731
    tops._launch(grouped, {"pool": bits, "src": idx(plan.tsrc), "dst": idx(plan.dst)},
                 dict(pool_scalars(tuple(bits.shape), bits.stride()), num_rows=rows))
    assert same_bytes(pool, want)


def test_pool_align_is_the_largest_power_of_two_dividing_the_strides():
    from mamba_align.kernels import pool_align

    t = {"layer_stride": 6 * 40, "block_stride": 40}
    assert pool_align(t) == 8 and pool_align(dict(t, block_stride=44, layer_stride=88)) == 4
    assert pool_align({"layer_stride": 29 * 6, "block_stride": 29}) == 1
    assert pool_align({"layer_stride": 1 << 20, "block_stride": 1 << 12}) == 16  # capped
    sd = {"layer_stride": 3 * 64 * 5, "block_stride": 3 * 64, "dim": 12, "width": 3}
    assert pool_align(sd, "SD") == 4 and pool_align(sd, "DS") == 16  # DS: dim not involved


@pytest.mark.parametrize("numel", [512, 520])  # one whole tile / a partial one; align 4
def test_copies_with_strides_aligned_to_four_elements_only(numel):
    # ALIGN = 4 promises the compiler 16-byte alignment for fp32 but not more: on the GPU a
    # wrong promise would fault or copy the wrong bytes (the interpreter ignores it).
    from mamba_align.kernels import plan_copy_temporal, pool_align, pool_scalars

    gen = torch.Generator().manual_seed(numel)
    base = random_pool(gen, (2, 7, numel + 4), torch.float32).to(DEVICE)
    pool = base[:, :, :numel]  # block stride numel + 4: a multiple of 4, not of 16
    scal = pool_scalars(tuple(pool.shape), pool.stride())
    assert pool_align(scal) == 4
    assert plan_copy_temporal(3, 2, numel, 4, 4).constexprs["EVEN"] == (numel == 512)
    want = np_view(base)
    plan = CopyPlan(np.array([1, 3, -1]), np.array([1, 3, -1]), np.array([5, 2, 6]),
                    np.zeros(3, np.int64))
    apply_temporal_copy(want[:, :, :numel], plan)
    torch.ops.mamba_align.copy_temporal_(pool, torch.tensor([1, 3, -1], device=DEVICE),
                                         torch.tensor([5, 2, 6], device=DEVICE))
    assert same_bytes(base, want)

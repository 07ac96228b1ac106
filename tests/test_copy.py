"""State-block copies (docs/semantics.md §2 ``copy_block``), checked three ways (core,
torch, JAX) against an element-by-element reading of the rule: byte-exact on random bits,
untouched blocks keep their bytes, in-place shifts behave like memmove, negative sources
do nothing. Then what only the kernels have: their grids, alignment and strides, and what
they do with ids the core would reject. On CPU the kernels run in Triton's interpreter; on
the GPU machine the same tests run compiled (``make gpu``)."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import make_backend
from copy_oracles import (copy_plan, loop_conv, loop_temporal, random_copy_plan, random_pool,
                          same_bytes)

from mamba_align import kernels as K
from mamba_align.core import (NO_ROW, CacheConfig, ConvSpec, Fault, TemporalSpec, apply_conv_copy,
                               apply_copy, apply_temporal_copy, copy_faults, flag_of, new_errors)
from mamba_align.kernels import copy as kc

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]


# -- the rule, three ways -------------------------------------------------------------------
@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("block", [(4, 8, 8), (3, 5, 7)])  # aligned whole tiles / neither
def test_temporal_copy_is_byte_exact(backend, rows, dtype, block):
    rng = np.random.default_rng(rows)
    nb = 2 * rows + 3
    pool = random_pool(rng, (3, nb) + block, dtype)
    p = random_copy_plan(rng, rows, nb, 0)
    got, errors = backend.copy_temporal(pool, p.tsrc, p.dst)
    assert same_bytes(got, loop_temporal(pool, p)) and errors[0] == 0


@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize("layout", ["SD", "DS"])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("S", [0, 1, 3])
@pytest.mark.parametrize("D", [40, 64])  # a partial channel tile / whole tiles
def test_conv_copy_is_byte_exact(backend, rows, layout, dtype, S, D):
    rng = np.random.default_rng(7 * rows + S)
    nb, W = 2 * rows + 3, 4 - 1 + S
    pool = random_pool(rng, (2, nb, W, D) if layout == "SD" else (2, nb, D, W), dtype)
    p = random_copy_plan(rng, rows, nb, S)
    got, errors = backend.copy_conv(pool, p.csrc, p.dst, p.bias, layout)
    assert same_bytes(got, loop_conv(pool, p, layout)) and errors[0] == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_temporal_copy_leaves_other_blocks_alone(backend, dtype):
    rng = np.random.default_rng(0)
    pool = random_pool(rng, (3, 9, 2, 4, 4), dtype)
    got, _ = backend.copy_temporal(pool, [5, -1, 2, 7], [1, 8, 2, 3])
    assert same_bytes(got[:, 1], pool[:, 5]) and same_bytes(got[:, 3], pool[:, 7])
    untouched = [b for b in range(9) if b not in (1, 3)]  # 2: a self-copy; 8: source -1
    assert same_bytes(got[:, untouched], pool[:, untouched])


def test_conv_in_place_shift_is_memmove(backend):
    pool = np.arange(2 * 3 * 6 * 1, dtype=np.float32).reshape(2, 3, 6, 1)
    got, _ = backend.copy_conv(pool, [1], [1], [2], "SD")
    # rows 0..3 take rows 2..5 as they were; rows 4, 5 stay as they were
    assert np.array_equal(got[:, 1, :4], pool[:, 1, 2:])
    assert np.array_equal(got[:, 1, 4:], pool[:, 1, 4:])
    assert np.array_equal(got[:, [0, 2]], pool[:, [0, 2]])


def test_random_plans_match_the_elementwise_reading(backend):
    @settings(max_examples=backend.examples(100))
    @given(st.data())
    def run(data):
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
        layout = data.draw(st.sampled_from(["SD", "DS"]))
        nb = data.draw(st.integers(4, 12))
        k, s = data.draw(st.integers(2, 4)), data.draw(st.integers(0, 3))
        w = k - 1 + s
        p = random_copy_plan(rng, data.draw(st.integers(1, (nb - 1) // 2)), nb, s)
        pool = random_pool(rng, (2, nb, w, 3) if layout == "SD" else (2, nb, 3, w), np.float32)
        got, errors = backend.copy_conv(pool, p.csrc, p.dst, p.bias, layout)
        assert same_bytes(got, loop_conv(pool, p, layout)) and errors[0] == 0

    run()


def test_copy_plan_dispatch_per_state_kind(backend):
    # the runners apply a step's copy plan to each pool by its kind (kernels.pool_copies;
    # the core's apply_copy): temporal whole blocks, conv shifted by the bias
    cfg = CacheConfig(4, 1, 2, {"conv": ConvSpec(3, 4, "DS", "float32"),
                                "ssm": TemporalSpec((2, 3), "float32")})
    rng = np.random.default_rng(1)
    pools = {n: random_pool(rng, cfg.pool_shape(n, 6), np.float32) for n in cfg.states}
    plan = {"copy_tsrc": [3], "copy_csrc": [2], "copy_dst": [4], "copy_bias": [1]}
    if backend.name == "reference":
        got = {n: p.copy() for n, p in pools.items()}
        apply_copy(got, cfg, copy_plan(*plan.values()))
    else:
        got = backend.copy_pools(pools, cfg.copy_kinds(), plan)
    assert same_bytes(got["ssm"][:, 4], pools["ssm"][:, 3])
    assert same_bytes(got["conv"][:, 4, :, :2], pools["conv"][:, 2, :, 1:])
    assert same_bytes(got["conv"][:, 4, :, 2:], pools["conv"][:, 4, :, 2:])
    for n in pools:
        others = [b for b in range(6) if b != 4]
        assert same_bytes(got[n][:, others], pools[n][:, others])


def test_the_reference_rejects_rows_that_race():
    pool = np.zeros((1, 6, 2), np.float32)
    with pytest.raises(ValueError, match="same destination"):
        apply_temporal_copy(pool, copy_plan([1, 2], [1, 2], [3, 3], [0, 0]))
    with pytest.raises(ValueError, match="another row reads"):
        apply_temporal_copy(pool, copy_plan([1, 3], [1, 3], [3, 4], [0, 0]))


# -- ids the core rejects: skipped and flagged; empty launches do nothing ------------------
def test_out_of_range_block_ids_and_biases_copy_nothing_and_are_flagged(backend):
    pool = np.arange(2 * 6 * 3 * 4, dtype=np.float32).reshape(2, 6, 3, 4)
    got, errors = backend.copy_temporal(pool, [1, 99, 2], [6, 3, -5])
    assert same_bytes(got, pool)
    assert errors.tolist() == [Fault.BAD_COPY, 0]  # row 0: destination 6 = NB
    got, errors = backend.copy_conv(pool, [1, 2, 3], [4, 4, 5], [3, 9, -1], "SD")
    assert same_bytes(got, pool) and errors.tolist() == [Fault.BAD_COPY, 0]  # bias 3 = W
    # among good rows: the good rows copy, the flag names the lowest bad row
    src, dst, bias = [-1, 2, 0, -7, 3], [3, 1, 4, 2, 5], [9, 1, 0, 0, 2]
    got, errors = backend.copy_conv(pool, src, dst, bias, "SD")
    assert errors.tolist() == [Fault.BAD_COPY, 3]  # -1 with bias 9 is no copy, not a fault
    want = pool.copy()
    want[:, 1, :2], want[:, 4], want[:, 5, :1] = pool[:, 2, 1:], pool[:, 0], pool[:, 3, 2:]
    assert same_bytes(got, want)
    assert copy_faults(src, dst, 6, bias, 3).tolist() == [0, 0, 0, Fault.BAD_COPY, 0]


def test_random_bad_ids_are_skipped_and_flagged_like_the_reference(device_backend):
    # good rows (distinct destinations) with some rows made bad: an id below -1 or >= NB,
    # or a bias outside [0, W) on valid ids; bad rows copy nothing, so no race appears
    ref = make_backend("reference")

    @settings(max_examples=device_backend.examples(60))
    @given(st.data())
    def run(data):
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
        layout = data.draw(st.sampled_from(["SD", "DS"]))
        nb, w = data.draw(st.integers(4, 12)), data.draw(st.integers(1, 5))
        rows = data.draw(st.integers(1, (nb - 1) // 2))
        p = random_copy_plan(rng, rows, nb, w - 1)
        src, dst, bias = p.csrc.copy(), p.dst.copy(), p.bias.copy()
        for r in np.flatnonzero(rng.random(rows) < 0.4):
            what = rng.integers(0, 3)
            bad = rng.choice([-3, -2, nb, nb + 1])
            if what == 0:
                src[r] = bad
            elif what == 1:
                dst[r] = bad
            else:
                bias[r] = rng.choice([-2, -1, w, w + 1])
        pool = random_pool(rng, (2, nb, w, 3) if layout == "SD" else (2, nb, 3, w), np.float32)
        want, want_flag = ref.copy_conv(pool, src, dst, bias, layout)
        got, flag = device_backend.copy_conv(pool, src, dst, bias, layout)
        assert same_bytes(got, want) and flag.tolist() == want_flag.tolist()
        assert flag.tolist() == flag_of(copy_faults(src, dst, nb, bias, w)).tolist()
        want, want_flag = ref.copy_temporal(pool, src, dst)
        got, flag = device_backend.copy_temporal(pool, src, dst)
        assert same_bytes(got, want) and flag.tolist() == want_flag.tolist()

    run()


def test_the_reference_raises_on_what_the_kernels_flag():
    pool = np.zeros((1, 6, 3, 2), np.float32)
    with pytest.raises(ValueError, match="< -1"):
        apply_temporal_copy(pool, copy_plan([-2], [-2], [3], [0]))
    with pytest.raises(ValueError, match="< -1"):
        apply_temporal_copy(pool, copy_plan([1], [1], [-4], [0]))
    with pytest.raises(ValueError, match=">= pool blocks"):
        apply_temporal_copy(pool, copy_plan([6], [6], [3], [0]))
    for bias in (-1, 3):
        with pytest.raises(ValueError, match=r"bias must be in \[0, W = 3\)"):
            apply_conv_copy(pool, copy_plan([1], [1], [2], [bias]), "SD")


def test_empty_pools_and_empty_plans_are_a_no_op(device_backend):
    empty = np.zeros((0, 4, 8), np.float32)
    got, errors = device_backend.copy_temporal(empty, [1], [2])
    assert got.shape == (0, 4, 8) and errors[0] == 0
    pool = np.ones((1, 4, 8), np.float32)
    assert same_bytes(device_backend.copy_temporal(pool, [], [])[0], pool)
    for layout, shape in (("SD", (2, 4, 3, 0)), ("DS", (2, 4, 0, 3))):  # D = 0 or W = 0
        plan = K.plan_copy_conv(K.ArraySpec.row_major(shape, "bfloat16"), ERR, ids(2), ids(2),
                                ids(2), layout=layout)
        assert plan.skip


# -- the kernels' grids, tiling and alignment (plans, then launches of modified plans) ------
def spec(shape, dtype="float32", strides=None):
    s = K.ArraySpec.row_major(shape, dtype)
    return dataclasses.replace(s, strides=tuple(strides)) if strides else s


def ids(n):
    return spec((n,), "int64")


ERR = spec((2,), "int32")  # the error flag


def test_copy_grids_stay_near_the_target_program_count():
    # An empty decode step launches every program: the grid must not grow with rows x
    # layers x block size (it used to: 1.2 M programs, 713 us, at 256 rows of 36 x 2 MiB).
    numel = 32 * 128 * 128
    for rows in (1, 8, 64, 256, 4096):
        plan = K.plan_copy_temporal(spec((36, 600, 32, 128, 128)), ERR, ids(rows), ids(rows))
        tiles, layers, groups = plan.grid
        # one program per tile and layer (per 1024 rows for huge batches)
        assert (tiles, layers) == (512, 36) and groups == -(-rows // kc.MAX_ROWS_PER_PROGRAM)
        assert groups * plan.constexprs["ROWS_PER_PROGRAM"] >= rows and plan.constexprs["EVEN"]
        assert plan.views == {"pool": "int32"}
        assert plan.aliases == {"pool": "pool", "errors": "errors"}
        conv = K.plan_copy_conv(spec((36, 600, 3, 8192), "bfloat16"), ERR, ids(rows),
                                ids(rows), ids(rows), layout="SD")
        assert conv.grid[0] * conv.grid[1] <= max(2 * kc.CONV_PROGRAMS, rows * 36)
        assert conv.grid[1] * conv.constexprs["TILES_PER_PROGRAM"] * conv.constexprs["TILE_D"] >= 8192
        assert conv.views == {"pool": "int16"}
    # small blocks: rows spread over programs up to the target
    assert kc.temporal_tiling(64, 2, 4096, 4, 16)["grid"] == (4, 2, 64)
    t = kc.temporal_tiling(10_000, 2, 4096, 4, 16)
    assert t["grid"][0] * t["grid"][1] * t["grid"][2] <= kc.TEMPORAL_PROGRAMS
    # a huge batch: rows per program capped (they live in registers), groups stay in the grid
    t = kc.temporal_tiling(3_000_000, 36, numel, 4, 16)
    assert t["constexprs"]["ROWS_PER_PROGRAM"] == kc.MAX_ROWS_PER_PROGRAM
    assert t["grid"][2] * kc.MAX_ROWS_PER_PROGRAM >= 3_000_000 and t["grid"][2] <= 65_535
    # a huge conv dim: channel tiles run per program, axis 1 stays within 65 535
    c = kc.conv_tiling(1, 1, 3, 70_000_000, 2, "SD")
    assert c["grid"][1] <= 65_535 and c["constexprs"]["TILES_PER_PROGRAM"] >= 2
    # an empty batch launches nothing
    assert K.plan_copy_temporal(spec((2, 4, 8)), ERR, ids(0), ids(0)).skip


def launch_modified(backend, plan, arrays):
    """Launch ``plan`` as changed by a test (a grid the planner would not choose) through
    the backend's generic launcher. Returns the pool and the error flag."""
    arrays = dict(arrays, errors=new_errors())
    op = K.Op("probe", tuple(arrays), (), lambda **_: plan, ("pool", "errors"), (), "")
    state = ("pool", "errors")
    if backend.name == "torch":
        t = {n: backend.pool(a) if n in state else backend.ids(a) for n, a in arrays.items()}
        backend.ops.launch(op, t, {})
        return backend.host(t["pool"]), backend.host(t["errors"]).tolist()
    j = {n: backend.jnp.asarray(a) if n in state else backend.ids(a) for n, a in arrays.items()}
    out = backend.ops.launch(op, j, {})
    return np.asarray(out["pool"]), np.asarray(out["errors"]).tolist()


@pytest.mark.parametrize("rows_per_program", [1, 4, 16, 1024])
def test_temporal_copy_with_row_groups_and_a_ragged_block(device_backend, rows_per_program):
    numel = 3 * 1024 + 37  # four 4 KiB tiles, the last one partial
    rng = np.random.default_rng(rows_per_program)
    rows, nb = 11, 26
    pool = random_pool(rng, (2, nb, numel), np.float32)
    p = random_copy_plan(rng, rows, nb, 0)
    base = K.plan_copy_temporal(spec(pool.shape), ERR, ids(rows), ids(rows))
    assert not base.constexprs["EVEN"]
    grouped = dataclasses.replace(
        base, grid=base.grid[:2] + (-(-rows // rows_per_program),),
        constexprs=dict(base.constexprs, ROWS_PER_PROGRAM=rows_per_program))
    got, errors = launch_modified(device_backend, grouped,
                                  {"pool": pool, "src": p.tsrc, "dst": p.dst})
    assert same_bytes(got, loop_temporal(pool, p)) and errors == [0, NO_ROW]
    # a bad source in row 9 (a masked tail in most groupings): that row alone is skipped,
    # and the one program of its group that flags names it
    bad = p.tsrc.copy()
    bad[9] = nb + 1
    got, errors = launch_modified(device_backend, grouped, {"pool": pool, "src": bad, "dst": p.dst})
    good = copy_plan(np.where(bad > nb, -1, bad), p.csrc, p.dst, p.bias)
    assert same_bytes(got, loop_temporal(pool, good)) and errors == [Fault.BAD_COPY, 9]
    # bad destinations of rows with good sources: skipped in every tile and layer (only the
    # flagging program reads all the destinations; the others skip them when visited)
    # (and a destination of -1 with a good source: no copy, no fault)
    with_src = np.flatnonzero(p.tsrc >= 0)
    assert len(with_src) >= 3
    big, neg, none = with_src[:3]
    bad_dst = p.dst.copy()
    bad_dst[[big, neg, none]] = [nb + 2, -3, -1]
    got, errors = launch_modified(device_backend, grouped,
                                  {"pool": pool, "src": p.tsrc, "dst": bad_dst})
    good = copy_plan(np.where(np.isin(np.arange(rows), [big, neg, none]), -1, p.tsrc), p.csrc,
                     p.dst, p.bias)
    assert same_bytes(got, loop_temporal(pool, good))
    assert errors == [Fault.BAD_COPY, min(big, neg)]


def test_conv_programs_with_several_channel_tiles_copy_right(device_backend):
    pool = np.arange(2 * 5 * 4 * 100, dtype=np.int32).reshape(2, 5, 4, 100)
    p = copy_plan([1, 2], [1, 2], [3, 2], [1, 2])  # row 1 in place
    small = K.plan_copy_conv(spec(pool.shape, "int32"), ERR, ids(2), ids(2), ids(2),
                             layout="SD")
    tiles = -(-100 // small.constexprs["TILE_D"])
    two = dataclasses.replace(small, grid=(small.grid[0], -(-tiles // 2)),
                              constexprs=dict(small.constexprs, TILES_PER_PROGRAM=2,
                                              EVEN_D=False))
    got, errors = launch_modified(device_backend, two,
                                  {"pool": pool, "src": p.csrc, "dst": p.dst, "bias": p.bias})
    assert same_bytes(got, loop_conv(pool, p, "SD")) and errors == [0, NO_ROW]


def test_pool_align_is_the_largest_power_of_two_dividing_the_strides():
    t = {"layer_stride": 6 * 40, "block_stride": 40}
    assert K.pool_align(t) == 8 and K.pool_align(dict(t, block_stride=44, layer_stride=88)) == 4
    assert K.pool_align({"layer_stride": 29 * 6, "block_stride": 29}) == 1
    assert K.pool_align({"layer_stride": 1 << 20, "block_stride": 1 << 12}) == 16  # capped
    sd = {"layer_stride": 3 * 64 * 5, "block_stride": 3 * 64, "dim": 12, "width": 3}
    assert K.pool_align(sd, "SD") == 4 and K.pool_align(sd, "DS") == 16  # DS: dim not involved


# -- torch only: pools that are views of larger allocations (JAX arrays are contiguous) ---
@pytest.fixture
def torch_backend():
    from support import Torch

    return Torch()


def test_copies_leave_padded_strides_alone(torch_backend):
    torch, ops, dev = torch_backend.torch, torch_backend.ops, torch_backend.device
    # a page-padded pool: blocks live inside a larger allocation; the padding must survive
    base = torch.full((2, 6, 3 * 8 + 5), 0x5A, dtype=torch.int32, device=dev)
    pool = base[:, :, : 3 * 8].view(2, 6, 3, 8)  # block stride 29, layer stride 174
    pool[:, 2] = torch.arange(48, dtype=torch.int32, device=dev).view(2, 3, 8)
    before = base.clone()
    i64 = lambda a: torch.tensor(a, device=dev)  # noqa: E731
    err = torch.from_numpy(new_errors()).to(dev)
    ops.copy_conv_(pool.view(torch.float32), err, i64([2]), i64([4]), i64([1]), layout="SD")
    ops.copy_temporal_(pool.view(torch.float32), err, i64([2]), i64([5]))
    assert int(err[0]) == 0
    changed = (base != before).any(dim=-1).any(dim=0)
    assert changed.tolist() == [False, False, False, False, True, True]
    assert torch.equal(base[:, :, 24:], before[:, :, 24:])  # padding untouched
    assert torch.equal(pool[:, 4, :2], pool[:, 2, 1:]) and torch.equal(pool[:, 4, 2], before[:, 4, 16:24])
    assert torch.equal(pool[:, 5], pool[:, 2])


@pytest.mark.parametrize("numel", [512, 520])  # one whole tile / a partial one; align 4
def test_copies_with_strides_aligned_to_four_elements_only(torch_backend, numel):
    # ALIGN = 4 promises the compiler 16-byte alignment for fp32 but not more: on the GPU a
    # wrong promise would fault or copy the wrong bytes (the interpreter ignores it).
    rng = np.random.default_rng(numel)
    base = random_pool(rng, (2, 7, numel + 4), np.float32)
    t = torch_backend.pool(base)
    pool = t[:, :, :numel]  # block stride numel + 4: a multiple of 4, not of 16
    s = torch_backend.ops.spec("pool", pool)
    assert K.pool_align(K.pool_scalars(s)) == 4
    plan = K.plan_copy_temporal(s, ERR, ids(3), ids(3))
    assert plan.constexprs["ALIGN"] == 4 and plan.constexprs["EVEN"] == (numel == 512)
    p = copy_plan([1, 3, -1], [1, 3, -1], [5, 2, 6], [0, 0, 0])
    want = base.copy()
    want[:, :, :numel] = loop_temporal(base[:, :, :numel], p)
    err = torch_backend.torch.from_numpy(new_errors())
    err = err.to(torch_backend.device)
    torch_backend.ops.copy_temporal_(pool, err, torch_backend.ids(p.tsrc), torch_backend.ids(p.dst))
    assert same_bytes(torch_backend.host(t), want) and err.tolist() == [0, NO_ROW]


def test_overlapping_pool_strides_are_rejected_and_transposed_layouts_accepted(torch_backend):
    torch, ops, dev = torch_backend.torch, torch_backend.ops, torch_backend.device
    i64 = lambda *a: torch.tensor(a, device=dev)  # noqa: E731
    err = torch.from_numpy(new_errors()).to(dev)
    base = torch.zeros(10_000, device=dev)
    overlapping = base.as_strided((2, 5, 3, 4), (24, 12, 4, 1))  # layer 1 = layer 0, block 2
    with pytest.raises(ValueError, match="overlap"):
        ops.copy_temporal_(overlapping, err, i64(1), i64(2))
    blocks_first = torch.zeros(5, 2, 3, 4, device=dev).transpose(0, 1)  # [L, NB] view of [NB, L]
    blocks_first[:, 1] = 7.0
    ops.copy_temporal_(blocks_first, err, i64(1), i64(3))
    assert err.tolist() == [0, NO_ROW]
    assert (blocks_first[:, 3] == 7.0).all() and (blocks_first[:, 2] == 0).all()

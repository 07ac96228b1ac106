"""The gated delta rule by chunks (``algorithm="chunked"``, kernels/gdn_chunked.py) against
the float64 reference, from torch and JAX: rows of several chunks (CHUNK tokens each), a ragged
last chunk, spec rows, one-token and empty rows in one launch. fp32: relative 1e-5 on
outputs and states; bf16: 3e-2. torch and JAX run the same kernel: bit-identical."""

import ml_dtypes
import numpy as np
import pytest
from gdn_cases import CASES, L, NB, chunked_plan, close, gdn_inputs
from support import make_backend

from mamba_align.core import Fault, new_errors
from mamba_align.kernels import ArraySpec, plan_gated_delta_rule
from mamba_align.kernels.gdn_chunked import CHUNK

# rows: a prefill of 70 tokens (two whole chunks and a ragged one) from a read block; one
# token from a zero state; a spec row of 3 candidates reading one of its write blocks; an
# empty row; a prefill of exactly one chunk, reading and writing the same block; a row of
# a chunk and one token with no write block
CU = np.array([0, 70, 71, 74, 74, 74 + CHUNK, 75 + 2 * CHUNK])
RB = np.array([3, -1, 4, 9, 2, 10])
WBS = np.array([[1, -1, -1], [5, -1, -1], [6, 4, 7], [8, -1, -1], [2, -1, -1], [-1, -1, -1]])
SPEC = np.array([0, 0, 1, 0, 0, 0])
WRITTEN = [1, 2, 4, 5, 6, 7]


def inputs(rng, cu, H, HV, K, V, **kw):
    """gdn_cases' inputs with keys of about unit length, as a model's are: raw normal keys
    make the delta rule grow without bound over rows this long (without l2norm)."""
    pool, q, k, v, gates = gdn_inputs(rng, int(cu[-1]), H, HV, K, V, **kw)
    return pool, q, (k.astype(np.float32) * K ** -0.5).astype(k.dtype), v, gates


def run(backend, pool, q, k, v, gates, cu=CU, rb=RB, wbs=WBS, spec=SPEC, **opts):
    return backend.gdn(pool, q, k, v, gates, cu, rb, wbs, spec, algorithm="chunked", **opts)


# and a key tile wider than one MMA step (K = 48: 64 columns, masked), as at K = 128
@pytest.mark.parametrize("H,HV,K,V,layout,fused,l2norm,scale",
                         CASES + [(1, 2, 48, 40, "VK", False, False, 0.0)])
def test_matches_the_reference(device_backend, H, HV, K, V, layout, fused, l2norm, scale):
    rng = np.random.default_rng(K + V)
    pool, q, k, v, gates = inputs(rng, CU, H, HV, K, V, layout=layout, fused=fused)
    opts = dict(layer=1, scale=scale, use_qk_l2norm=l2norm, layout=layout)
    o, out, err = run(device_backend, pool, q, k, v, gates, **opts)
    ro, rout, rerr = make_backend("reference").gdn(pool, q, k, v, gates, CU, RB, WBS, SPEC,
                                                   **opts)
    close(o, ro, 1e-5)
    close(out, rout, 1e-5)
    assert err.tolist() == rerr.tolist() == [0, 2**31 - 1]
    kept = [b for b in range(NB) if b not in WRITTEN]
    assert (out[0] == pool[0]).all() and (out[1, kept] == pool[1, kept]).all()
    assert not (out[1, WRITTEN] == pool[1, WRITTEN]).all(axis=(1, 2, 3)).any()


def mixed(g):  # every 8th token a decay of e^-500, the others almost none
    g = np.full_like(g, -1e-3)
    g[::8] = -500
    return g


def infinite(g):  # one token forgets the state whole (g = -inf)
    g = g.copy()
    g[5] = -np.inf
    return g


@pytest.mark.parametrize("g_range,change", [((0.0, 1e-3), None), ((2.0, 8.0), None),
                                            ((0.0, 1.0), mixed), ((0.0, 1.0), infinite)],
                         ids=["no decay", "strong decay", "mixed decays", "infinite decay"])
def test_long_rows_with_little_or_much_decay(device_backend, g_range, change):
    # no decay and beta near 1 make (I + M) the least diagonal; strong decay underflows
    # exp(G) within a chunk; a large decay next to small ones, or an infinite one, is
    # exact only when each decay is summed by itself (not as a difference of running sums)
    rng = np.random.default_rng(7)
    cu = np.array([0, 3 * CHUNK + 5])
    pool, q, k, v, gates = inputs(rng, cu, 1, 1, 16, 16, g_range=g_range)
    gates["beta"] = np.clip(gates["beta"] + 0.5, 0, 1).astype(np.float32)
    if change is not None:
        gates["g"] = change(gates["g"])
    args = (pool, q, k, v, gates, cu, [2], [[3, -1, -1]], [0])
    o, out, err = run(device_backend, *args, layer=0, use_qk_l2norm=True)
    ro, rout, _ = make_backend("reference").gdn(*args, layer=0, use_qk_l2norm=True)
    assert np.isfinite(o).all() and np.isfinite(out).all()
    close(o, ro, 1e-5)
    close(out, rout, 1e-5)


def test_a_long_row_does_not_drift(device_backend):
    # 1024 tokens (64 chunks) of little decay: the state carried from chunk to chunk keeps
    # the reference within a few 1e-7 of its largest value (the token-by-token kernel's
    # order of error; 5e-6 leaves room for the GPU's fp32 sums)
    rng = np.random.default_rng(3)
    cu = np.array([0, 1024])
    pool, q, k, v, gates = inputs(rng, cu, 1, 2, 16, 16, g_range=(0.0, 1e-3))
    args = (pool, q, k, v, gates, cu, [2], [[3, -1, -1]], [0])
    o, out, _ = run(device_backend, *args, layer=0, use_qk_l2norm=True)
    ro, rout, _ = make_backend("reference").gdn(*args, layer=0, use_qk_l2norm=True)
    for got, want in ((o, ro), (out[0, 3], rout[0, 3])):
        assert np.abs(got - want).max() < 5e-6 * np.abs(want).max()


def test_spec_rows_longer_than_a_chunk(device_backend):
    # a window of 20 write blocks: spec rows of 20 and 17 tokens, each candidate's state
    # from the chunk that holds its token
    rng = np.random.default_rng(9)
    win = 20
    cu = np.array([0, win, win + 17])
    pool, q, k, v, gates = inputs(rng, cu, 1, 2, 16, 16)
    pool = np.concatenate([pool] * 4, axis=1)  # 48 blocks
    wbs = np.array([np.arange(1, 1 + win), np.r_[np.arange(24, 24 + 17), [-1] * 3]])
    args = (pool, q, k, v, gates, cu, [0, 44], wbs, [1, 1])
    o, out, err = run(device_backend, *args, layer=1, use_qk_l2norm=True)
    ro, rout, _ = make_backend("reference").gdn(*args, layer=1, use_qk_l2norm=True)
    assert err.tolist() == [0, 2**31 - 1]
    close(o, ro, 1e-5)
    close(out, rout, 1e-5)


def test_one_write_block_a_launch(device_backend):
    # write blocks [N, 1] (no drafts): a spec row holds at most one token, its state the final
    # one; the rows without spec give the bits they give beside three write blocks (compiled,
    # the two launches are two binaries)
    rng = np.random.default_rng(12)
    cu = np.array([0, 70, 71, 71, 74 + CHUNK, 76 + CHUNK])
    pool, q, k, v, gates = inputs(rng, cu, 1, 2, 16, 16)
    rb, spec = np.array([3, 4, 5, 2, 9]), np.array([0, 1, 1, 0, 1])
    wbs = np.array([[1], [6], [7], [2], [8]])  # the last row: two tokens, one write block
    args = (pool, q, k, v, gates, cu, rb, wbs, spec)
    o, out, err = run(device_backend, *args, layer=1, use_qk_l2norm=True)
    ro, rout, rerr = make_backend("reference").gdn(*args, layer=1, use_qk_l2norm=True)
    assert err.tolist() == rerr.tolist() == [int(Fault.BAD_QUERY_LEN), 4]
    close(o, ro, 1e-5)
    close(out, rout, 1e-5)
    wide = np.concatenate([wbs, np.full((5, 2), -1)], axis=1)
    o3, out3, _ = run(device_backend, pool, q, k, v, gates, cu, rb, wide, spec, layer=1,
                      use_qk_l2norm=True)
    for r in (0, 3):
        np.testing.assert_array_equal(o[cu[r]:cu[r + 1]], o3[cu[r]:cu[r + 1]])
        np.testing.assert_array_equal(out[1, wbs[r, 0]], out3[1, wbs[r, 0]])


def test_bf16_inputs_and_state(device_backend):
    rng = np.random.default_rng(1)
    bf = ml_dtypes.bfloat16
    pool, q, k, v, gates = inputs(rng, CU, 1, 2, 16, 16, dtype=bf, pool_dtype=bf, fused=True)
    opts = dict(layer=0, use_qk_l2norm=True)
    o, out, _ = run(device_backend, pool, q, k, v, gates, **opts)
    ro, rout, _ = make_backend("reference").gdn(pool, q, k, v, gates, CU, RB, WBS, SPEC, **opts)
    assert o.dtype == bf and out.dtype == bf
    close(o, ro, 3e-2)
    close(out, rout, 3e-2)


def test_torch_and_jax_give_the_same_bits():
    rng = np.random.default_rng(2)
    pool, q, k, v, gates = inputs(rng, CU, 2, 4, 12, 20, fused=True)
    got = [run(make_backend(b), pool, q, k, v, gates, layer=1, use_qk_l2norm=True)
           for b in ("torch", "jax")]
    for a, b in zip(*got):
        np.testing.assert_array_equal(a, b)


def test_a_row_gives_the_same_bits_in_any_batch(device_backend):
    rng = np.random.default_rng(3)
    pool, q, k, v, gates = inputs(rng, CU, 1, 2, 16, 16)
    o, out, _ = run(device_backend, pool, q, k, v, gates, layer=1)
    t0, t1 = CU[0], CU[1]
    o1, out1, _ = run(device_backend, pool, q[t0:t1], k[t0:t1], v[t0:t1],
                      {n: x[t0:t1] for n, x in gates.items()}, [0, t1 - t0], RB[:1], WBS[:1],
                      SPEC[:1], layer=1)
    np.testing.assert_array_equal(o1, o[t0:t1])
    np.testing.assert_array_equal(out1[1, 1], out[1, 1])


@pytest.mark.parametrize("cut", [45, 3 * CHUNK])
def test_a_row_split_over_two_launches(device_backend, cut):
    # chunks start at each launch's first token: a cut inside a chunk gives the reference
    # within rounding, a cut on a chunk's boundary the bits of the whole row (fp32 pool)
    rng = np.random.default_rng(8)
    cu = np.array([0, 85])
    pool, q, k, v, gates = inputs(rng, cu, 1, 1, 16, 16)
    ids = ([2], [[3, -1, -1]], [0])
    whole, out_whole, _ = run(device_backend, pool, q, k, v, gates, cu, *ids, layer=0)
    ro, rout, _ = make_backend("reference").gdn(pool, q, k, v, gates, cu, *ids, layer=0)
    sl = lambda x, a, b: {n: y[a:b] for n, y in x.items()}  # noqa: E731
    o1, mid, _ = run(device_backend, pool, q[:cut], k[:cut], v[:cut], sl(gates, 0, cut),
                     [0, cut], *ids, layer=0)
    o2, out, _ = run(device_backend, mid, q[cut:], k[cut:], v[cut:], sl(gates, cut, 85),
                     [0, 85 - cut], [3], *ids[1:], layer=0)
    o = np.concatenate([o1, o2])
    close(o, ro, 1e-5)
    close(out, rout, 1e-5)
    same = np.array_equal(o, whole) and np.array_equal(out[0, 3], out_whole[0, 3])
    assert same == (cut % CHUNK == 0)


def test_faulty_rows_are_flagged_and_write_nothing(device_backend):
    # a read block past NB (a row of more than a chunk), a write block below -1, a spec row
    # longer than its window, then a good prefill row
    rng = np.random.default_rng(4)
    cu = np.array([0, 40, 41, 45, 85]) + np.array([0, 1, 1, 1, 1]) * (CHUNK + 5)
    bad = int(cu[3])  # the faulty rows' tokens
    pool, q, k, v, gates = inputs(rng, cu, 1, 1, 16, 16)
    rb, wbs = np.array([NB, 1, 2, 3]), np.array([[5, -1, -1], [-4, -1, -1], [5, 6, 7],
                                                 [8, -1, -1]])
    spec = np.array([0, 0, 1, 0])
    o, out, err = run(device_backend, pool, q, k, v, gates, cu, rb, wbs, spec, layer=1)
    ro, rout, rerr = make_backend("reference").gdn(pool, q, k, v, gates, cu, rb, wbs, spec,
                                                   layer=1)
    assert Fault(int(err[0])) == Fault.BAD_BLOCK | Fault.BAD_QUERY_LEN
    assert err.tolist() == rerr.tolist() and err[1] == 0
    assert (o[:bad] == 0).all()
    close(o[bad:], ro[bad:], 1e-5)
    assert (np.delete(out[1], 8, axis=0) == np.delete(pool[1], 8, axis=0)).all()
    close(out[1, 8], rout[1, 8], 1e-5)


def test_torch_compile_and_jax_jit_give_the_eager_bits():
    import jax
    import torch

    from mamba_align.backends.jax import ops as jops
    from mamba_align.backends.torch import ops as tops
    rng = np.random.default_rng(11)
    cu = np.array([0, 2 * CHUNK + 20, 2 * CHUNK + 21])  # two whole chunks and a ragged one
    pool, q, k, v, gates = inputs(rng, cu, 1, 2, 16, 16)
    ids = (cu, np.array([2, -1]), np.array([[3, -1, -1], [4, -1, -1]]), np.array([0, 0]))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    T = lambda a: torch.as_tensor(a, device=dev)  # noqa: E731, N806

    def call(p, *arrays):
        return tops.gated_delta_rule_(p, *arrays, layer=1, algorithm="chunked")["o"]

    arrays = [T(new_errors()), T(q), T(k), T(v), T(gates["g"]), T(gates["beta"])]
    arrays += [T(a) for a in ids]
    pe, pc = T(pool.copy()), T(pool.copy())
    assert torch.equal(call(pe, *arrays), torch.compile(call, fullgraph=True)(
        pc, *[a.clone() for a in arrays]))
    assert torch.equal(pe, pc)
    fn = jax.jit(jops.gated_delta_rule, static_argnames=("layer", "algorithm"),
                 donate_argnums=(0, 1))
    A = jax.numpy.asarray  # noqa: N806
    args = [A(x) for x in (q, k, v, gates["g"], gates["beta"]) + ids]
    eager = jops.gated_delta_rule(A(pool), A(new_errors()), *args, layer=1, algorithm="chunked")
    jitted = fn(A(pool), A(new_errors()), *args, layer=1, algorithm="chunked")
    for name in ("o", "pool", "errors"):
        np.testing.assert_array_equal(np.asarray(eager[name]), np.asarray(jitted[name]))


@pytest.mark.parametrize("fused", [False, True])
def test_views_of_wider_projections(fused):
    # q, k, v and the gates as slices of wider arrays (a model's fused projections): every
    # stride differs from the contiguous one, in both launches
    import torch

    from mamba_align.backends.torch import ops as tops
    rng = np.random.default_rng(13)
    H, HV, K, V = 2, 4, 16, 16  # two qk heads: their stride is used
    pool, q, k, v, gates = inputs(rng, CU, H, HV, K, V, fused=fused)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n = int(CU[-1])
    qk = torch.zeros(n, H + 1, 2 * K + 3, dtype=torch.float32, device=dev)
    qk[:, :H, :K], qk[:, :H, K:2 * K] = torch.as_tensor(q), torch.as_tensor(k)
    vw = torch.zeros(n, HV, V + 5, dtype=torch.float32, device=dev)
    vw[..., :V] = torch.as_tensor(v)
    names = ("a", "b") if fused else ("g", "beta")
    gw = torch.zeros(n, 2, HV + 3, dtype=torch.float32, device=dev)
    for i, name in enumerate(names):
        gw[:, i, :HV] = torch.as_tensor(gates[name])
    views = [qk[:, :H, :K], qk[:, :H, K:2 * K], vw[..., :V], gw[:, 0, :HV], gw[:, 1, :HV]]
    assert not any(x.is_contiguous() for x in views)
    T = lambda a: torch.as_tensor(a, device=dev)  # noqa: E731, N806
    extra = [T(gates["A_log"]), T(gates["dt_bias"])] if fused else []
    op = tops.gated_delta_rule_fused_gates_ if fused else tops.gated_delta_rule_
    out = T(pool.copy())
    o = op(out, T(new_errors()), *views, *extra, T(CU), T(RB), T(WBS), T(SPEC), layer=1,
           use_qk_l2norm=True, algorithm="chunked")["o"]
    ro, rout, _ = make_backend("reference").gdn(pool, q, k, v, gates, CU, RB, WBS, SPEC,
                                                layer=1, use_qk_l2norm=True)
    close(o.cpu().numpy(), ro, 1e-5)
    close(out.cpu().numpy(), rout, 1e-5)


def test_torch_compile_at_several_prefill_lengths_pins_none():
    # the second length makes the token count symbolic in the fakes; step 1's program count
    # must not pin it (one graph per length otherwise)
    import torch

    from mamba_align.backends.torch import ops as tops
    rng = np.random.default_rng(12)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    T = lambda a: torch.as_tensor(a, device=dev)  # noqa: E731, N806

    def call(p, *arrays):
        return tops.gated_delta_rule_(p, *arrays, layer=1, algorithm="chunked")["o"]

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(call, fullgraph=True)
    for n in (20, 37, 53, 70):
        cu = np.array([0, n])
        pool, q, k, v, gates = inputs(rng, cu, 1, 2, 16, 16)
        arrays = [T(new_errors()), T(q), T(k), T(v), T(gates["g"]), T(gates["beta"]), T(cu),
                  T(np.array([2])), T(np.array([[3, -1, -1]])), T(np.array([0]))]
        pe, pc = T(pool.copy()), T(pool.copy())
        assert torch.equal(call(pe, *arrays), compiled(pc, *[a.clone() for a in arrays]))
        assert torch.equal(pe, pc)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2


def test_an_unknown_algorithm_is_refused():
    spec = ArraySpec.row_major
    f32, ids = "float32", spec((1,), "int64")
    with pytest.raises(ValueError, match="algorithm must be one of"):
        plan_gated_delta_rule(spec((L, NB, 1, 8, 8), f32), spec((2,), "int32"),
                              spec((1, 1, 8), f32), spec((1, 1, 8), f32), spec((1, 1, 8), f32),
                              spec((1, 1), f32), spec((1, 1), f32), spec((2,), "int64"), ids,
                              spec((1, 1), "int64"), ids, layer=0, scale=0.0,
                              use_qk_l2norm=False, layout="VK", algorithm="parallel")


# (rows, HV, V): 128 programs, 256, 132 and 133 (one value tile of 32 columns a head)
@pytest.mark.parametrize("rows,HV,V", [(1, 32, 128), (2, 32, 128), (1, 132, 32), (1, 133, 32)])
def test_step_2_takes_more_warps_while_its_grid_fits_one_wave(rows, HV, V):
    from mamba_align.kernels import gdn_chunked
    plan = chunked_plan(64 * rows, rows, 1, HV, 128, V)
    programs = plan.grid[0]
    assert programs == rows * HV * V // gdn_chunked.BV
    few = programs <= gdn_chunked.ONE_WAVE
    assert few == (programs <= 132)
    assert plan.num_warps == (gdn_chunked.FEW_PROGRAMS_WARPS if few else gdn_chunked.NUM_WARPS)
    assert plan.before[0].num_warps == gdn_chunked.PREPARE_WARPS


@pytest.mark.parametrize("H,HV,K,V,layout", [c[:5] for c in CASES]
                         + [(1, 2, 48, 40, "VK"), (2, 2, 64, 32, "KV")])
def test_either_warp_count_gives_the_same_bits(device_backend, monkeypatch, H, HV, K, V, layout):
    # step 2's warps follow its grid, so a row alone and in a large batch run different
    # binaries; its bits must not depend on the batch (docs/semantics.md §4): CU's rows
    # (ragged, spec, one-token, empty) once on each warp count
    from mamba_align.kernels import clear_plan_caches, gdn_chunked
    rng = np.random.default_rng(11)
    pool, q, k, v, gates = inputs(rng, CU, H, HV, K, V, layout=layout)
    got, warps = [], []
    try:
        for one_wave in (10 ** 9, 0):
            monkeypatch.setattr(gdn_chunked, "ONE_WAVE", one_wave)
            clear_plan_caches()
            warps.append(chunked_plan(int(CU[-1]), len(RB), H, HV, K, V, layout).num_warps)
            got.append(run(device_backend, pool, q, k, v, gates, layer=1, layout=layout))
    finally:
        monkeypatch.undo()
        clear_plan_caches()
    assert warps == [gdn_chunked.FEW_PROGRAMS_WARPS, gdn_chunked.NUM_WARPS]
    assert got[0][2].tolist() == got[1][2].tolist() == new_errors().tolist()
    np.testing.assert_array_equal(got[0][0], got[1][0])
    np.testing.assert_array_equal(got[0][1], got[1][1])

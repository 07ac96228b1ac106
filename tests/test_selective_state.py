"""Mamba2's selective state update (kernels/selective_state.py) in three ways: the float64
reference, torch and JAX (docs/semantics.md §4). fp32: relative 1e-5 on outputs and states
(absolute 1e-5 near zero); bf16 inputs or a bf16 state pool: 3e-2. torch and JAX run the
same kernel: bit-identical."""

import ml_dtypes
import numpy as np
import pytest
from seqlens_cases import SEQLENS_CASES, check_seqlens_launch, seqlens_case
from support import SSU_INPUTS, make_backend

from mamba_align.core import Fault, new_errors

L, NB = 2, 12
SENTINEL = -7.25
# the gated delta rule's rows (tests/test_gdn.py): a fresh prefill of 5 tokens; decode
# reading and writing the same block; a spec row of 1 + S candidates reading one of its
# write blocks; a spec row of 1 with its other write blocks -1; an empty row; a non-spec
# row with no write block
CU = np.array([0, 5, 6, 9, 10, 10, 12])
RB = np.array([-1, 2, 4, 7, 3, 9])
WBS = np.array([[1, -1, -1], [2, -1, -1], [5, 4, 6], [8, -1, -1], [3, -1, -1], [-1, -1, -1]])
SPEC = np.array([0, 0, 1, 1, 0, 0])


def inputs(rng, H, G, P, N, T=int(CU[-1]), dtype=np.float32, pool_dtype=np.float32,
           dt_bias=(-1, 1)):
    """``(pool, ins)``: a pool ``[L, NB, H, P, N]`` and the inputs by name (``A``, ``D``
    and ``dt_bias`` fp32, the rest ``dtype``); step sizes around softplus's bend unless
    ``dt_bias`` (a range) says otherwise, decays ``A < 0``."""
    pool = (0.5 * rng.normal(size=(L, NB, H, P, N))).astype(pool_dtype)
    ins = {"x": rng.normal(size=(T, H, P)), "dt": rng.normal(size=(T, H)) - 1,
           "A": -rng.uniform(0.5, 4, H), "B": rng.normal(size=(T, G, N)),
           "C": rng.normal(size=(T, G, N)), "D": rng.normal(size=H),
           "dt_bias": rng.uniform(*dt_bias, H)}
    return pool, {n: a.astype(np.float32 if n in ("A", "D", "dt_bias") else dtype)
                  for n, a in ins.items()}


def tokens(ins, t0, t1):
    """The per-token inputs of tokens ``[t0, t1)``, the per-head ones whole."""
    return {n: a if n in ("A", "D", "dt_bias") else a[t0:t1] for n, a in ins.items()}


def close(a, b, tol):
    np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol)


CASES = [  # H, G, P, N, dt_softplus
    (1, 1, 16, 16, True),
    (4, 2, 12, 20, True),  # groups, odd sizes (masking), two head-dim tiles
    (2, 1, 8, 40, False),  # one group for two heads, N not a power of two, no softplus
    (6, 2, 8, 8, True),  # three heads a group (H / G != G)
    (3, 3, 1, 1, True),  # a group per head, P = N = 1
]
WRITTEN = [1, 2, 4, 5, 6, 8]  # the write blocks the rows above use in layer 1


# the tests that run both algorithms (kernels/selective_state_chunked.py shares the rows,
# blocks and faults; its rows of several chunks are tested at the end of the file); the
# reference, which has one, runs once
BACKEND_ALGORITHMS = pytest.mark.parametrize(
    "backend,algorithm", [("reference", "recurrent"), ("torch", "recurrent"),
                          ("torch", "chunked"), ("jax", "recurrent"), ("jax", "chunked")],
    indirect=["backend"])


@BACKEND_ALGORITHMS
@pytest.mark.parametrize("H,G,P,N,dt_softplus", CASES)
def test_matches_the_reference(backend, H, G, P, N, dt_softplus, algorithm):
    rng = np.random.default_rng(P + N)
    pool, ins = inputs(rng, H, G, P, N)
    if algorithm == "chunked" and not dt_softplus:
        # positive step sizes, as Mamba2's are: with d < 0 the state grows to ~1e11 here,
        # and the chunk's TF32x3 products (about 1e-6 of the terms they sum) miss 1e-5 on
        # its small entries, which the token-by-token kernel's fp32 updates meet
        ins["dt"], ins["dt_bias"] = np.abs(ins["dt"]), np.abs(ins["dt_bias"])
    y, out, err = backend.ssu(pool, ins, CU, RB, WBS, SPEC, layer=1, dt_softplus=dt_softplus,
                              algorithm=algorithm)
    ry, rout, rerr = make_backend("reference").ssu(pool, ins, CU, RB, WBS, SPEC, layer=1,
                                                   dt_softplus=dt_softplus)
    close(y, ry, 1e-5)
    close(out, rout, 1e-5)
    assert err.tolist() == rerr.tolist() == [0, 2**31 - 1]
    kept = np.setdiff1d(np.arange(NB), WRITTEN)  # read only, or untouched
    assert (out[0] == pool[0]).all() and (out[1, kept] == pool[1, kept]).all()
    for b in WRITTEN:
        assert (out[1, b] != pool[1, b]).any(), b


def test_step_sizes_far_below_softplus_bend(device_backend):
    # dt + dt_bias around -9 (Mamba2 initialises dt_bias to -6.9 ... -2.3): a plain fp32
    # log(1 + exp(x)) is off by 1e-3 there, which the outputs of fresh rows would show
    # (so the state's increments are ~1e-4: compared relative to their size, with D = 0)
    rng = np.random.default_rng(13)
    pool, ins = inputs(rng, 2, 1, 8, 8, dt_bias=(-8.5, -7.5))
    ins["D"][:] = 0
    y, out, _ = device_backend.ssu(pool, ins, CU, RB, WBS, SPEC, layer=1)
    ry, rout, _ = make_backend("reference").ssu(pool, ins, CU, RB, WBS, SPEC, layer=1)
    fresh = slice(0, CU[1])  # row 0 starts from a zero state: y and its state are d x B ...
    assert np.abs(y[fresh] - ry[fresh]).max() <= 1e-5 * np.abs(ry[fresh]).max()
    assert np.abs(out[1, 1] - rout[1, 1]).max() <= 1e-5 * np.abs(rout[1, 1]).max()
    close(y, ry, 1e-5)
    close(out, rout, 1e-5)


@pytest.mark.parametrize("dtype,pool_dtype", [(ml_dtypes.bfloat16, np.float32),
                                              (np.float16, np.float32)])
def test_half_inputs_on_an_fp32_pool(backend, dtype, pool_dtype):
    # Mamba2 serving's usual setting: bf16 (or fp16) activations, fp32 state
    rng = np.random.default_rng(14)
    pool, ins = inputs(rng, 4, 2, 8, 16, dtype=dtype, pool_dtype=pool_dtype)
    y, out, _ = backend.ssu(pool, ins, CU, RB, WBS, SPEC, layer=1)
    ry, rout, _ = make_backend("reference").ssu(pool, ins, CU, RB, WBS, SPEC, layer=1)
    assert y.dtype == dtype and out.dtype == pool_dtype
    close(y, ry, 3e-2)
    close(out, rout, 1e-5)  # the state's arithmetic is fp32 on the inputs as given


@BACKEND_ALGORITHMS
def test_bf16_inputs_and_state(backend, algorithm):
    rng = np.random.default_rng(1)
    bf = ml_dtypes.bfloat16
    pool, ins = inputs(rng, 2, 1, 16, 16, dtype=bf, pool_dtype=bf)
    y, out, _ = backend.ssu(pool, ins, CU, RB, WBS, SPEC, layer=0, algorithm=algorithm)
    ry, rout, _ = make_backend("reference").ssu(pool, ins, CU, RB, WBS, SPEC, layer=0)
    assert y.dtype == bf and out.dtype == bf
    close(y, ry, 3e-2)
    close(out, rout, 3e-2)


def test_torch_and_jax_give_the_same_bits():
    rng = np.random.default_rng(2)
    pool, ins = inputs(rng, 4, 2, 12, 20)
    got = [make_backend(b).ssu(pool, ins, CU, RB, WBS, SPEC, layer=1) for b in ("torch", "jax")]
    for a, b in zip(*got):
        np.testing.assert_array_equal(a, b)


def test_a_row_gives_the_same_bits_in_any_batch(device_backend):
    rng = np.random.default_rng(3)
    pool, ins = inputs(rng, 2, 1, 16, 16)
    y, out, _ = device_backend.ssu(pool, ins, CU, RB, WBS, SPEC, layer=1)
    t0, t1 = CU[2], CU[3]
    y1, out1, _ = device_backend.ssu(pool, tokens(ins, t0, t1), [0, t1 - t0], RB[2:3], WBS[2:3],
                                     SPEC[2:3], layer=1)
    np.testing.assert_array_equal(y1, y[t0:t1])
    np.testing.assert_array_equal(out1[1, [4, 5, 6]], out[1, [4, 5, 6]])


@BACKEND_ALGORITHMS
def test_faulty_rows_are_flagged_and_write_nothing(backend, algorithm):
    # a read block past NB; a write block below -1; a spec row of 4 > 1 + S tokens; a good
    # row; two heads of two head-dim tiles each (P = 12): every program of a faulty row
    # must skip it
    rng = np.random.default_rng(4)
    pool, ins = inputs(rng, 2, 1, 12, 8, T=7)
    pool[:] = SENTINEL
    pool[1, 1:4] = rng.normal(size=(3, 2, 12, 8))
    args = (pool, ins, np.array([0, 1, 2, 6, 7]), np.array([NB, 1, 2, 3]),
            np.array([[5, -1, -1], [-4, -1, -1], [5, 6, 7], [8, -1, -1]]), np.array([0, 0, 1, 0]))
    y, out, err = backend.ssu(*args, layer=1, algorithm=algorithm)
    ry, rout, rerr = make_backend("reference").ssu(*args, layer=1)
    assert Fault(int(err[0])) == Fault.BAD_BLOCK | Fault.BAD_QUERY_LEN
    assert err.tolist() == rerr.tolist() and err[1] == 0
    assert (y[:6] == 0).all()  # every head and head-dim row
    close(y[6], ry[6], 1e-5)
    assert (out[0] == pool[0]).all()
    assert (np.delete(out[1], 8, axis=0) == np.delete(pool[1], 8, axis=0)).all()
    close(out[1, 8], rout[1, 8], 1e-5)


@BACKEND_ALGORITHMS
def test_write_blocks_a_row_does_not_use_are_not_checked(backend, algorithm):
    # the columns past what a row writes (a non-spec row's 1.., a spec row's n..) may hold
    # any id: no fault, no write
    rng = np.random.default_rng(6)
    pool, ins = inputs(rng, 1, 1, 8, 8, T=4)
    args = (pool, ins, np.array([0, 1, 2, 4]), np.array([1, 2, 3]),
            np.array([[5, NB + 3, -9], [6, 7, NB], [8, 9, -5]]), np.array([0, 1, 1]))
    y, out, err = backend.ssu(*args, layer=1, algorithm=algorithm)
    ry, rout, rerr = make_backend("reference").ssu(*args, layer=1)
    assert err.tolist() == rerr.tolist() == [0, 2**31 - 1]
    close(y, ry, 1e-5)
    close(out, rout, 1e-5)
    untouched = np.setdiff1d(np.arange(NB), [5, 6, 8, 9])
    np.testing.assert_array_equal(out[1, untouched], pool[1, untouched])


@BACKEND_ALGORITHMS
@pytest.mark.parametrize("changed, bad", SEQLENS_CASES)
def test_a_bad_cu_seqlens_entry_faults_only_the_rows_that_read_it(backend, changed, bad,
                                                                   algorithm):
    # 40 one-token rows: blocks 1-40 read, 41-80 written, a window of one
    cu = seqlens_case(40, changed)
    n = len(cu) - 1
    rng = np.random.default_rng(12)
    _, ins = inputs(rng, 2, 1, 12, 8, T=n)  # two heads, two head-dim tiles
    pool = (0.5 * rng.normal(size=(L, 2 * n + 1, 2, 12, 8))).astype(np.float32)
    wb = np.arange(n + 1, 2 * n + 1)
    args = (cu, np.arange(1, n + 1), wb[:, None], np.zeros(n, int))
    got, ref = (b.ssu(pool, ins, *args, layer=1, algorithm=algorithm)
                for b in (backend, make_backend("reference")))
    check_seqlens_launch(cu, bad, int(Fault.BAD_CU_SEQLENS), pool, wb, got, ref, 1e-5, 1e-5)


@BACKEND_ALGORITHMS
def test_rows_without_tokens_still_flag_bad_ids(backend, algorithm):
    rng = np.random.default_rng(9)
    pool, ins = inputs(rng, 2, 1, 8, 8, T=0)
    _, out, err = backend.ssu(pool, ins, [0, 0], [NB], WBS[:1], [0], layer=1,
                              algorithm=algorithm)
    assert err.tolist() == [int(Fault.BAD_BLOCK), 0]
    np.testing.assert_array_equal(out, pool)


@pytest.mark.parametrize("change,error", [
    (dict(layer=2), "layer"),
    (dict(B=np.zeros((12, 3, 8), np.float32)), "multiple of groups"),
    (dict(C=np.zeros((12, 2, 4), np.float32)), "C must have shape"),
    (dict(dt=np.zeros((12, 3), np.float32)), "dt must have shape"),
    (dict(A=np.zeros(4, np.int32)), "A must have dtype"),
    (dict(D=np.zeros(3, np.float32)), "D must have shape"),
    (dict(dt_bias=np.zeros((4, 1), np.float32)), "dt_bias must have shape"),
    (dict(B=np.zeros((11, 2, 8), np.float32)), "B must have shape"),
    (dict(B=np.zeros((12, 0, 8), np.float32)), "multiple of groups"),
    (dict(B=np.zeros((12, 2, 0), np.float32), C=np.zeros((12, 2, 0), np.float32)),
     "state size must be >= 1"),
    (dict(x=np.zeros((12, 4, 0), np.float32)), "head dim and state size must be >= 1"),
    (dict(wbs=np.zeros((6, 0), np.int64)), "write_blocks must have 1"),
    (dict(pool=np.zeros((L, NB, 4, 8, 8), np.float16)), "pool must have dtype"),
    (dict(pool=np.zeros((L, NB, 4, 8, 4), np.float32)), "pool must have shape"),
])
def test_bad_arguments_raise(device_backend, change, error):
    rng = np.random.default_rng(6)
    pool, ins = inputs(rng, 4, 2, 8, 8)
    change = dict(change)  # (shared by the backends' runs)
    layer = change.pop("layer", 0)
    pool = change.pop("pool", pool)
    wbs = change.pop("wbs", WBS)
    with pytest.raises((ValueError, TypeError), match=error):
        device_backend.ssu(pool, dict(ins, **change), CU, RB, wbs, SPEC, layer=layer)


def test_c_with_other_strides_than_b_is_refused():
    import torch

    from mamba_align.backends.torch import ops
    rng = np.random.default_rng(10)
    pool, ins = inputs(rng, 1, 1, 8, 8)
    t = {n: torch.tensor(a) for n, a in ins.items()}
    t["C"] = torch.zeros(int(CU[-1]), 1, 16)[..., :8]  # strides (16, 16, 1)
    with pytest.raises(ValueError, match="C must have B's strides"):
        ops.selective_state_update_(torch.tensor(pool), torch.tensor(new_errors()),
                                    *(t[n] for n in SSU_INPUTS), torch.tensor(CU),
                                    torch.tensor(RB), torch.tensor(WBS), torch.tensor(SPEC),
                                    layer=0)


def test_torch_compile_and_jax_jit_give_the_eager_bits():
    # the custom op under torch.compile (two row counts: the second is symbolic), and the
    # JAX function under jit with the pool donated
    import jax
    import torch

    from mamba_align.backends.jax import ops as jops
    from mamba_align.backends.torch import ops as tops
    rng = np.random.default_rng(11)
    pool, ins = inputs(rng, 2, 1, 8, 8)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # compiled kernels need CUDA tensors
    T = lambda a: torch.as_tensor(a, device=dev)  # noqa: E731, N806

    def call(p, *arrays):
        return tops.selective_state_update_(p, *arrays, layer=1)["y"]

    compiled = torch.compile(call, fullgraph=True)
    for rows in (6, 4):
        n = int(CU[rows])
        arrays = ([T(new_errors())] + [T(a) for a in tokens(ins, 0, n).values()]
                  + [T(CU[:rows + 1]), T(RB[:rows]), T(WBS[:rows]), T(SPEC[:rows])])
        pe, pc = T(pool.copy()), T(pool.copy())
        assert torch.equal(call(pe, *arrays), compiled(pc, *[a.clone() for a in arrays]))
        assert torch.equal(pe, pc)
    fn = jax.jit(jops.selective_state_update, static_argnames=("layer", "dt_softplus"),
                 donate_argnums=(0, 1))
    A = jax.numpy.asarray  # noqa: N806
    args = [A(ins[n]) for n in SSU_INPUTS] + [A(CU), A(RB), A(WBS), A(SPEC)]
    eager = jops.selective_state_update(A(pool), A(new_errors()), *args, layer=1)
    jitted = fn(A(pool), A(new_errors()), *args, layer=1)
    for name in ("y", "pool", "errors"):
        np.testing.assert_array_equal(np.asarray(eager[name]), np.asarray(jitted[name]))


def test_inputs_as_views_give_the_bits_of_contiguous_ones():
    # x, B and C as views of one conv output (x | B | C per token, odd row stride), dt of a
    # wider projection: the kernel reaches them through their strides (on the GPU the
    # alignment they allow too: tests/test_recurrent_gpu.py)
    import torch

    from mamba_align.backends.torch import ops
    T, H, P, G, N = 5, 4, 12, 2, 16
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(1)
    xbc = torch.randn(T, 1 + H * P + 2 * G * N + 3, generator=g).to(dev)
    x = xbc[:, 1:1 + H * P].unflatten(1, (H, P))
    B = xbc[:, 1 + H * P:1 + H * P + G * N].unflatten(1, (G, N))
    C = xbc[:, 1 + H * P + G * N:1 + H * P + 2 * G * N].unflatten(1, (G, N))
    dt = torch.randn(T, H + 3, generator=g).to(dev)[:, 1:1 + H]
    A, D, dt_bias = (-torch.rand(H, generator=g) - 0.5).to(dev), torch.randn(H).to(dev), \
        torch.randn(H).to(dev)
    init = torch.randn(H, P, N, generator=g).to(dev)
    ids = lambda *v: torch.tensor(v, device=dev)  # noqa: E731

    def run(x, dt, B, C):
        pool = torch.zeros((1, 6, H, P, N), device=dev)
        pool[0, 1] = init
        errors = torch.tensor(new_errors(), device=dev)
        y = ops.selective_state_update_(pool, errors, x, dt, A, B, C, D, dt_bias,
                                        ids(0, 2, T), ids(1, 1), ids([2, 3, 4], [5, -1, -1]),
                                        ids(1, 0), layer=0)["y"]
        assert errors.tolist() == new_errors().tolist()
        return y, pool

    (yv, pv), (yc, pc) = run(x, dt, B, C), run(*(a.contiguous() for a in (x, dt, B, C)))
    assert torch.equal(yv, yc) and torch.equal(pv, pc)
    assert pv[0, 2:6].abs().sum() > 0  # the candidates and the final state were written


def test_unit_dims_of_c_may_have_any_stride():
    # decode (T = 1) with one group: C's strides on its unit dims are never used
    import torch

    from mamba_align.backends.torch import ops
    rng = np.random.default_rng(15)
    pool, ins = inputs(rng, 2, 1, 8, 8, T=1)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    T = lambda a: torch.tensor(np.asarray(a), device=dev)  # noqa: E731, N806
    t = {n: T(a) for n, a in ins.items()}
    t["C"] = T(ins["C"]).as_strided((1, 1, 8), (99, 7, 1))
    args = (T([0, 1]), T(RB[1:2]), T(WBS[1:2]), T(SPEC[1:2]))  # decode in and to block 2
    got, errors = T(pool), T(new_errors())
    y = ops.selective_state_update_(got, errors, *(t[n] for n in SSU_INPUTS), *args,
                                    layer=1)["y"]
    ry, rout, rerr = make_backend("reference").ssu(pool, ins, *(a.cpu().numpy() for a in args),
                                                   layer=1)
    assert errors.tolist() == rerr.tolist() == new_errors().tolist()
    close(y.cpu().numpy(), ry, 1e-5)
    close(got.cpu().numpy(), rout, 1e-5)


# algorithm="chunked" on rows of several chunks (16 tokens each): a prefill of 70 tokens (a
# ragged last chunk) from a read block; one token from a zero state; a spec row of 3; an
# empty row; one chunk exactly, reading and writing its block; a chunk and one token with
# no write block
CHUNK_CU = np.array([0, 70, 71, 74, 74, 90, 107])
CHUNK_RB = np.array([3, -1, 4, 9, 2, 10])
CHUNK_WBS = np.array([[1, -1, -1], [5, -1, -1], [6, 4, 7], [8, -1, -1], [2, -1, -1],
                      [-1, -1, -1]])
CHUNK_SPEC = np.array([0, 0, 1, 0, 0, 0])


@pytest.mark.parametrize("H,G,P,N,dt_softplus", CASES[:3])
def test_chunked_rows_of_several_chunks_match_the_reference(device_backend, H, G, P, N,
                                                            dt_softplus):
    rng = np.random.default_rng(P + N + 1)
    pool, ins = inputs(rng, H, G, P, N, T=int(CHUNK_CU[-1]))
    if not dt_softplus:  # positive step sizes (test_matches_the_reference says why)
        ins["dt"], ins["dt_bias"] = np.abs(ins["dt"]), np.abs(ins["dt_bias"])
    args = (pool, ins, CHUNK_CU, CHUNK_RB, CHUNK_WBS, CHUNK_SPEC)
    y, out, err = device_backend.ssu(*args, layer=1, dt_softplus=dt_softplus,
                                     algorithm="chunked")
    ry, rout, _ = make_backend("reference").ssu(*args, layer=1, dt_softplus=dt_softplus)
    assert err.tolist() == [0, 2**31 - 1]
    close(y, ry, 1e-5)
    close(out, rout, 1e-5)
    kept = np.setdiff1d(np.arange(NB), [1, 2, 4, 5, 6, 7])
    assert (out[1, kept] == pool[1, kept]).all()


@pytest.mark.parametrize("cut", [45, 48])
def test_a_chunked_row_split_on_a_chunk_boundary_keeps_its_bits(device_backend, cut):
    rng = np.random.default_rng(8)
    pool, ins = inputs(rng, 2, 1, 16, 16, T=85)
    ids = ([2], [[3, -1, -1]], [0])
    whole, out_whole, _ = device_backend.ssu(pool, ins, [0, 85], *ids, layer=0,
                                             algorithm="chunked")
    ry, rout, _ = make_backend("reference").ssu(pool, ins, [0, 85], *ids, layer=0)
    y1, mid, _ = device_backend.ssu(pool, tokens(ins, 0, cut), [0, cut], *ids, layer=0,
                                    algorithm="chunked")
    y2, out, _ = device_backend.ssu(mid, tokens(ins, cut, 85), [0, 85 - cut], [3], *ids[1:],
                                    layer=0, algorithm="chunked")
    y = np.concatenate([y1, y2])
    close(y, ry, 1e-5)
    close(out, rout, 1e-5)
    same = np.array_equal(y, whole) and np.array_equal(out[0, 3], out_whole[0, 3])
    assert same == (cut % 16 == 0)


def test_chunked_spec_rows_longer_than_a_chunk(device_backend):
    rng = np.random.default_rng(9)
    pool, ins = inputs(rng, 2, 1, 8, 8, T=37)
    pool = np.concatenate([pool] * 4, axis=1)  # 48 blocks
    wbs = np.array([np.arange(1, 21), np.r_[np.arange(24, 41), [-1] * 3]])
    args = (pool, ins, [0, 20, 37], [0, 44], wbs, [1, 1])
    y, out, err = device_backend.ssu(*args, layer=1, algorithm="chunked")
    ry, rout, _ = make_backend("reference").ssu(*args, layer=1)
    assert err.tolist() == [0, 2**31 - 1]
    close(y, ry, 1e-5)
    close(out, rout, 1e-5)


def test_chunked_torch_and_jax_give_the_same_bits():
    rng = np.random.default_rng(2)
    pool, ins = inputs(rng, 4, 2, 12, 20, T=int(CHUNK_CU[-1]))
    got = [make_backend(b).ssu(pool, ins, CHUNK_CU, CHUNK_RB, CHUNK_WBS, CHUNK_SPEC, layer=1,
                               algorithm="chunked") for b in ("torch", "jax")]
    for a, b in zip(*got):
        np.testing.assert_array_equal(a, b)


def test_a_long_chunked_row_with_mamba2_like_steps(device_backend):
    # Mamba2's initialisation: dt_bias in [-6.9, -2.3] (softplus: steps of 1e-3 ... 0.1), A
    # = -exp(U[0, ln 16]): weak decays, so each chunk's state carries into the next; a
    # head of an infinite decay rate (A = -inf) forgets its state at every token
    rng = np.random.default_rng(14)
    pool, ins = inputs(rng, 4, 2, 16, 16, T=107, dt_bias=(-6.9, -2.3))
    ins["A"] = -np.exp(rng.uniform(0, np.log(16), 4)).astype(np.float32)
    ins["A"][3] = -np.inf
    args = (pool, ins, [0, 90, 107], [2, 3], [[4, -1, -1], [5, -1, -1]], [0, 0])
    y, out, err = device_backend.ssu(*args, layer=1, algorithm="chunked")
    ry, rout, _ = make_backend("reference").ssu(*args, layer=1)
    assert err.tolist() == [0, 2**31 - 1]
    assert np.isfinite(y).all() and np.isfinite(out).all()
    close(y, ry, 1e-5)
    close(out, rout, 1e-5)

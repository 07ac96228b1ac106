"""The fused recurrent gated delta rule (kernels/gdn.py) in three ways: the float64
reference, torch and JAX (docs/semantics.md §4). fp32: relative 1e-5 on outputs and
states (absolute 1e-5 near zero); bf16 inputs or a bf16 state pool: 3e-2. torch and JAX run
the same kernel: bit-identical."""

import ml_dtypes
import numpy as np
import pytest
import triton
import triton.language as tl
from gdn_cases import CASES, L, NB, close, gdn_inputs
from seqlens_cases import SEQLENS_CASES, check_seqlens_launch, seqlens_case
from support import make_backend

from mamba_align.core import Fault, new_errors
from mamba_align.kernels import ArraySpec, plan_gated_delta_rule
from mamba_align.kernels.gdn import STREAM_BELOW
from mamba_align.kernels.recurrent import softplus

S = 2
SENTINEL = -7.25
# rows: a fresh prefill of 5 tokens; decode reading and writing the same block; a spec
# row of 1 + S candidates reading one of its write blocks; a spec row of 1 with its other
# write blocks -1; an empty row; a non-spec row with no write block
CU = np.array([0, 5, 6, 9, 10, 10, 12])
RB = np.array([-1, 2, 4, 7, 3, 9])
WBS = np.array([[1, -1, -1], [2, -1, -1], [5, 4, 6], [8, -1, -1], [3, -1, -1], [-1, -1, -1]])
SPEC = np.array([0, 0, 1, 1, 0, 0])


def inputs(rng, *args, **kw):
    return gdn_inputs(rng, int(CU[-1]), *args, **kw)


@pytest.mark.parametrize("H,HV,K,V,layout,fused,l2norm,scale", CASES)
def test_matches_the_reference(backend, H, HV, K, V, layout, fused, l2norm, scale):
    rng = np.random.default_rng(K + V)
    pool, q, k, v, gates = inputs(rng, H, HV, K, V, layout=layout, fused=fused)
    opts = dict(layer=1, scale=scale, use_qk_l2norm=l2norm, layout=layout)
    o, out, err = backend.gdn(pool, q, k, v, gates, CU, RB, WBS, SPEC, **opts)
    ro, rout, rerr = make_backend("reference").gdn(pool, q, k, v, gates, CU, RB, WBS, SPEC, **opts)
    close(o, ro, 1e-5)
    close(out, rout, 1e-5)
    assert err.tolist() == rerr.tolist() == [0, 2**31 - 1]
    kept = [0, 7, 9, 10, 11]  # read only, or untouched
    assert (out[0] == pool[0]).all() and (out[1, kept] == pool[1, kept]).all()


def test_bf16_inputs_and_state(backend):
    rng = np.random.default_rng(1)
    bf = ml_dtypes.bfloat16
    pool, q, k, v, gates = inputs(rng, 1, 2, 16, 16, dtype=bf, pool_dtype=bf, fused=True)
    opts = dict(layer=0, use_qk_l2norm=True)
    o, out, _ = backend.gdn(pool, q, k, v, gates, CU, RB, WBS, SPEC, **opts)
    ro, rout, _ = make_backend("reference").gdn(pool, q, k, v, gates, CU, RB, WBS, SPEC, **opts)
    assert o.dtype == bf and out.dtype == bf
    close(o, ro, 3e-2)
    close(out, rout, 3e-2)


def test_torch_and_jax_give_the_same_bits():
    rng = np.random.default_rng(2)
    pool, q, k, v, gates = inputs(rng, 2, 4, 12, 20, fused=True)
    got = [make_backend(b).gdn(pool, q, k, v, gates, CU, RB, WBS, SPEC, layer=1,
                               use_qk_l2norm=True) for b in ("torch", "jax")]
    for a, b in zip(*got):
        np.testing.assert_array_equal(a, b)


def test_a_row_gives_the_same_bits_in_any_batch(device_backend):
    """Row 2 alone, and in a batch padded with empty rows to ``STREAM_BELOW`` rows (a
    small batch streams its state with cache hints, a large one does not; a row alone also
    loads its first token's inputs after its checks)."""
    rng = np.random.default_rng(3)
    pool, q, k, v, gates = inputs(rng, 1, 2, 16, 16)
    pad = STREAM_BELOW - len(RB)
    wbs = np.r_[WBS, np.full((pad, WBS.shape[1]), -1)]
    o, out, _ = device_backend.gdn(pool, q, k, v, gates, np.r_[CU, [CU[-1]] * pad],
                                   np.r_[RB, [-1] * pad], wbs, np.r_[SPEC, [0] * pad], layer=1)
    t0, t1 = CU[2], CU[3]
    o1, out1, _ = device_backend.gdn(pool, q[t0:t1], k[t0:t1], v[t0:t1],
                                     {n: x[t0:t1] for n, x in gates.items()}, [0, t1 - t0],
                                     RB[2:3], WBS[2:3], SPEC[2:3], layer=1)
    np.testing.assert_array_equal(o1, o[t0:t1])
    np.testing.assert_array_equal(out1[1, [4, 5, 6]], out[1, [4, 5, 6]])


def faulty_rows():
    """A read block past NB; a write block below -1; a spec row of 4 > 1 + S tokens; a good
    row: ``(pool, q, k, v, gates, cu_seqlens, read blocks, write blocks, is_spec)``."""
    rng = np.random.default_rng(4)
    pool, q, k, v, gates = inputs(rng, 1, 1, 8, 8)
    pool[:] = SENTINEL
    pool[1, 1:4] = rng.normal(size=(3, 1, 8, 8))
    sl = {n: x[:7] for n, x in gates.items()}
    return (pool, q[:7], k[:7], v[:7], sl, np.array([0, 1, 2, 6, 7]), np.array([NB, 1, 2, 3]),
            np.array([[5, -1, -1], [-4, -1, -1], [5, 6, 7], [8, -1, -1]]),
            np.array([0, 0, 1, 0]))


# the fault tests run both algorithms (kernels/gdn_chunked.py shares the rows and faults);
# with the `backend` fixture, the reference (which has one) runs once
ALGORITHMS = pytest.mark.parametrize("algorithm", ["recurrent", "chunked"])
BACKEND_ALGORITHMS = pytest.mark.parametrize(
    "backend,algorithm", [("reference", "recurrent"), ("torch", "recurrent"),
                          ("torch", "chunked"), ("jax", "recurrent"), ("jax", "chunked")],
    indirect=["backend"])


@BACKEND_ALGORITHMS
def test_faulty_rows_are_flagged_and_write_nothing(backend, algorithm):
    pool, q, k, v, sl, cu, rb, wbs, spec = faulty_rows()
    o, out, err = backend.gdn(pool, q, k, v, sl, cu, rb, wbs, spec, layer=1,
                              algorithm=algorithm)
    ro, rout, rerr = make_backend("reference").gdn(pool, q, k, v, sl, cu, rb, wbs, spec,
                                                   layer=1)
    assert Fault(int(err[0])) == Fault.BAD_BLOCK | Fault.BAD_QUERY_LEN
    assert err.tolist() == rerr.tolist() and err[1] == 0
    assert (o[:6] == 0).all()
    close(o[6], ro[6], 1e-5)
    assert (np.delete(out[1], 8, axis=0) == np.delete(pool[1], 8, axis=0)).all()
    close(out[1, 8], rout[1, 8], 1e-5)


def gdn_plan(rows):
    """The plan of a ``rows``-row launch on row-major fp32 arrays (a window of 3)."""
    spec = ArraySpec.row_major
    ids, f32 = spec((rows,), "int64"), "float32"
    return plan_gated_delta_rule(spec((L, NB, 1, 8, 8), f32), spec((2,), "int32"),
                                 spec((rows, 1, 8), f32), spec((rows, 1, 8), f32),
                                 spec((rows, 1, 8), f32), spec((rows, 1), f32),
                                 spec((rows, 1), f32), spec((rows + 1,), "int64"), ids,
                                 spec((rows, 3), "int64"), ids, layer=1, scale=0.0,
                                 use_qk_l2norm=False, layout="VK")


ONE_ROW = {  # case: (row of faulty_rows whose ids it takes, its tokens, its cu_seqlens)
    "bad read": (0, (0, 1), [0, 1]), "bad write": (1, (1, 2), [0, 1]),
    "long spec": (2, (2, 6), [0, 4]), "good": (3, (6, 7), [0, 1]),
    "prefill": (3, (0, 6), [0, 6]), "past the tokens": (3, (0, 2), [0, 5]),
    "backwards": (3, (0, 2), [2, 1])}


@ALGORITHMS
@pytest.mark.parametrize("case", ONE_ROW)
def test_a_one_row_launch_matches_the_reference(device_backend, case, algorithm):
    # a launch of one row loads its first token's inputs after its checks
    # (STATE_FIRST_BELOW): faulty_rows' rows alone, a prefill, bad cu_seqlens
    assert gdn_plan(1).constexprs["STATE_FIRST"] and not gdn_plan(2).constexprs["STATE_FIRST"]
    pool, q, k, v, sl, _, rb, wbs, spec = faulty_rows()
    row, (t0, t1), cu = ONE_ROW[case]
    args = (pool, q[t0:t1], k[t0:t1], v[t0:t1], {n: x[t0:t1] for n, x in sl.items()}, cu,
            rb[row:row + 1], wbs[row:row + 1], spec[row:row + 1])
    o, out, err = device_backend.gdn(*args, layer=1, algorithm=algorithm)
    ro, rout, rerr = make_backend("reference").gdn(*args, layer=1)
    assert err.tolist() == rerr.tolist() and (err[0] != 0) == (case not in ("good", "prefill"))
    if err[0]:
        np.testing.assert_array_equal(out, pool)
    if not err[0] & Fault.BAD_CU_SEQLENS:  # else no token is the row's: o is not written
        close(o, ro, 1e-5)
    close(out, rout, 1e-5)


@BACKEND_ALGORITHMS
def test_write_blocks_a_row_does_not_use_are_not_checked(backend, algorithm):
    # the kernel loads a row's whole window of write blocks; the columns past what the row
    # writes (a non-spec row's 1.., a spec row's n..) may hold any id: no fault, no write
    rng = np.random.default_rng(6)
    pool, q, k, v, gates = inputs(rng, 1, 1, 8, 8)
    cu = np.array([0, 1, 2, 4])
    rb = np.array([1, 2, 3])
    wbs = np.array([[5, NB + 3, -9], [6, 7, NB], [8, 9, -5]])  # non-spec, spec of 1, of 2
    spec = np.array([0, 1, 1])
    sl = {n: x[:4] for n, x in gates.items()}
    o, out, err = backend.gdn(pool, q[:4], k[:4], v[:4], sl, cu, rb, wbs, spec, layer=1,
                              algorithm=algorithm)
    ro, rout, rerr = make_backend("reference").gdn(pool, q[:4], k[:4], v[:4], sl, cu, rb, wbs,
                                                   spec, layer=1)
    assert err.tolist() == rerr.tolist() == [0, 2**31 - 1]
    close(o, ro, 1e-5)
    close(out, rout, 1e-5)
    untouched = np.setdiff1d(np.arange(NB), [5, 6, 8, 9])
    np.testing.assert_array_equal(out[1, untouched], pool[1, untouched])


def seqlens_launch(backend, cu, spec, algorithm):
    """40 one-token rows (blocks 1-40 read, 41-80 written, a window of one) on ``cu``, by
    ``backend`` and by the reference: ``(pool, write blocks, (o, out, err), reference's)``."""
    n = len(cu) - 1
    rng = np.random.default_rng(12)
    pool = (0.5 * rng.normal(size=(L, 2 * n + 1, 1, 8, 8))).astype(np.float32)
    q, k, v = (rng.normal(size=(n, 1, 8)).astype(np.float32) for _ in range(3))
    gates = {"g": -rng.uniform(0.01, 1, (n, 1)).astype(np.float32),
             "beta": rng.uniform(0, 1, (n, 1)).astype(np.float32)}
    wb = np.arange(n + 1, 2 * n + 1)
    args = (cu, np.arange(1, n + 1), wb[:, None], np.full(n, spec))
    got, ref = (b.gdn(pool, q, k, v, gates, *args, layer=1, algorithm=algorithm)
                for b in (backend, make_backend("reference")))
    return pool, wb, got, ref


@BACKEND_ALGORITHMS
@pytest.mark.parametrize("changed, bad", SEQLENS_CASES)
def test_a_bad_cu_seqlens_entry_faults_only_the_rows_that_read_it(backend, changed, bad,
                                                                   algorithm):
    cu = seqlens_case(40, changed)
    check_seqlens_launch(cu, bad, int(Fault.BAD_CU_SEQLENS),
                         *seqlens_launch(backend, cu, 0, algorithm), 1e-5, 1e-5,
                         shared_states=algorithm == "recurrent")


@BACKEND_ALGORITHMS
def test_a_wild_row_length_gives_the_references_bits_on_spec_rows(backend, algorithm):
    # rows 9 and 10 end past T_total, row 11 runs backwards; row 9 (41 tokens) is also a
    # spec row longer than its window
    cu = seqlens_case(40, {10: 50, 11: 50})
    check_seqlens_launch(cu, [9, 10, 11], int(Fault.BAD_CU_SEQLENS | Fault.BAD_QUERY_LEN),
                         *seqlens_launch(backend, cu, 1, algorithm), 1e-5, 1e-5)


@BACKEND_ALGORITHMS
def test_rows_without_tokens_still_flag_bad_ids(backend, algorithm):
    rng = np.random.default_rng(9)
    pool, q, k, v, gates = inputs(rng, 1, 2, 8, 8)
    _, out, err = backend.gdn(pool, q[:0], k[:0], v[:0], {n: x[:0] for n, x in gates.items()},
                              [0, 0], [NB], WBS[:1], [0], layer=1, algorithm=algorithm)
    assert err.tolist() == [int(Fault.BAD_BLOCK), 0]
    np.testing.assert_array_equal(out, pool)


def test_k_with_other_strides_than_q_is_refused():
    from mamba_align.backends.torch import ops  # noqa: F401  (registers the ops)
    import torch
    rng = np.random.default_rng(10)
    pool, q, k, v, gates = inputs(rng, 1, 2, 8, 8)
    wide = torch.zeros(q.shape[0], 1, 16)
    kv = wide[..., :8]  # a view: strides (16, 16, 1), q's are (8, 8, 1)
    with pytest.raises(ValueError, match="k must have q's strides"):
        ops.gated_delta_rule_(torch.tensor(pool), torch.zeros(2, dtype=torch.int32),
                              torch.tensor(q), kv, torch.tensor(v), torch.tensor(gates["g"]),
                              torch.tensor(gates["beta"]), torch.tensor(CU), torch.tensor(RB),
                              torch.tensor(WBS), torch.tensor(SPEC), layer=0)


@pytest.mark.parametrize("change,error", [
    (dict(layer=2), "layer"), (dict(layout="XY"), "layout"),
    (dict(v=np.zeros((12, 3, 8), np.float32)), "multiple"),
    (dict(pool=np.zeros((L, NB, 4, 8, 8), np.float16)), "pool must have dtype"),
    (dict(pool=np.zeros((L, NB, 4, 8, 4), np.float32)), "pool must have shape"),
    (dict(q=np.zeros((12, 2, 9), np.float32)), r"q and k must have the same shape \[T, H, K\], "
                                                r"got q \[12, 2, 9\] and k \[12, 2, 8\]"),
])
def test_bad_arguments_raise(device_backend, change, error):
    rng = np.random.default_rng(6)
    pool, q, k, v, gates = inputs(rng, 2, 4, 8, 8)
    kw = dict(pool=pool, q=q, v=v, layer=0, layout="VK")
    kw.update(change)
    with pytest.raises((ValueError, TypeError), match=error):
        device_backend.gdn(kw["pool"], kw["q"], k, kw["v"], gates, CU, RB, WBS, SPEC,
                           layer=kw["layer"], layout=kw["layout"])


def test_torch_compile_and_jax_jit_give_the_eager_bits():
    # the custom op under torch.compile (two row counts: the second is symbolic), and the
    # JAX function under jit with the pool donated
    import jax
    import torch

    from mamba_align.backends.jax import ops as jops
    from mamba_align.backends.torch import ops as tops
    rng = np.random.default_rng(11)
    pool, q, k, v, gates = inputs(rng, 1, 2, 8, 8)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # compiled kernels need CUDA tensors
    T = lambda a: torch.as_tensor(a, device=dev)  # noqa: E731, N806

    def call(p, *arrays):
        return tops.gated_delta_rule_(p, *arrays, layer=1)["o"]

    compiled = torch.compile(call, fullgraph=True)
    for rows in (6, 4):
        n = int(CU[rows])
        arrays = [T(np.array([0, 2**31 - 1], np.int32)), T(q[:n]), T(k[:n]), T(v[:n]),
                  T(gates["g"][:n]), T(gates["beta"][:n]), T(CU[:rows + 1]), T(RB[:rows]),
                  T(WBS[:rows]), T(SPEC[:rows])]
        pe, pc = T(pool.copy()), T(pool.copy())
        assert torch.equal(call(pe, *arrays), compiled(pc, *[a.clone() for a in arrays]))
        assert torch.equal(pe, pc)
    fn = jax.jit(jops.gated_delta_rule, static_argnames=("layer", "scale", "use_qk_l2norm",
                                                         "layout"), donate_argnums=(0, 1))
    A = jax.numpy.asarray  # noqa: N806
    args = (A(q), A(k), A(v), A(gates["g"]), A(gates["beta"]), A(CU), A(RB), A(WBS), A(SPEC))
    eager = jops.gated_delta_rule(A(pool), A(new_errors()), *args, layer=1)
    jitted = fn(A(pool), A(new_errors()), *args, layer=1)
    for name in ("o", "pool", "errors"):
        np.testing.assert_array_equal(np.asarray(eager[name]), np.asarray(jitted[name]))


def test_the_torch_launcher_passes_the_register_cap(monkeypatch):
    """Both kernels of the gated delta rule carry a register cap (kernels/gdn.py) and
    torch's launcher hands it to Triton (the interpreter ignores it; on the GPU,
    tests/test_recurrent_gpu.py checks the registers of the compiled binary)."""
    import torch

    from mamba_align.backends.torch import ops as tops
    from mamba_align.kernels import gdn

    kernel, seen = gdn.gated_delta_rule_kernel, []
    assert kernel.maxnreg == gdn.gated_delta_rule_fused_gates_kernel.maxnreg == gdn.REGISTER_CAP
    run = kernel.run

    def spy(*args, **kwargs):
        seen.append(kwargs.get("maxnreg"))
        return run(*args, **kwargs)

    monkeypatch.setattr(kernel, "run", spy)
    pool, q, k, v, gates = inputs(np.random.default_rng(5), 1, 2, 8, 8)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    T = lambda a: torch.as_tensor(a, device=dev)  # noqa: E731, N806
    tops.gated_delta_rule_(T(pool), T(new_errors()), T(q), T(k), T(v), T(gates["g"]),
                           T(gates["beta"]), T(CU), T(RB), T(WBS), T(SPEC), layer=1)
    assert seen == [gdn.REGISTER_CAP]



@triton.jit
def _apply_softplus(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(y_ptr + o, softplus(tl.load(x_ptr + o, mask=o < n, other=0)), mask=o < n)


def test_the_kernels_softplus_is_accurate_far_below_zero():
    """The in-kernel gates' softplus (shared with the selective state update) against
    float64 ``log1p(exp(x))``: as accurate as fp32 ``exp`` also where ``1 + exp(x)`` rounds
    ``exp(x)`` away (gate biases are initialised around -7 to -2), ``x`` itself above 20."""
    import torch
    x = np.array([-90, -30, -14, -10, -7, -3, -1e-3, 0, 1e-3, 2, 7, 19.9, 20, 20.5, 40],
                 np.float32)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    xt = torch.tensor(x, device=dev)
    yt = torch.empty_like(xt)
    _apply_softplus[(1,)](xt, yt, len(x), BLOCK=16)
    want = np.where(x > 20, x.astype(np.float64), np.log1p(np.exp(x.astype(np.float64))))
    # the GPU's exp (ex2.approx of x * log2(e)) loses accuracy in proportion to |x|: 7e-6
    # relative at -90 on the H200; 2e-6 from -20 up (the interpreter's is exact)
    got = yt.cpu().numpy()
    np.testing.assert_allclose(got[x >= -20], want[x >= -20], rtol=2e-6, atol=0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=0)


def test_unit_dims_of_k_and_the_gates_may_have_any_stride():
    # decode (T = 1) with one qk head: k's strides and the second gate's row stride on unit
    # dims are never used, so they are not required to match q's / the first gate's
    import torch

    from mamba_align.backends.torch import ops
    rng = np.random.default_rng(16)
    pool, q, k, v, gates = inputs(rng, 1, 2, 8, 8)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    T = lambda a: torch.tensor(np.asarray(a), device=dev)  # noqa: E731, N806
    row = slice(5, 6)  # the decode row reading and writing block 2
    kt = T(k[row]).as_strided((1, 1, 8), (77, 5, 1))
    beta = T(gates["beta"][row]).as_strided((1, 2), (33, 1))
    got, errors = T(pool), T(new_errors())
    args = [T(a) for a in (CU[1:3] - CU[1], RB[1:2], WBS[1:2], SPEC[1:2])]
    o = ops.gated_delta_rule_(got, errors, T(q[row]), kt, T(v[row]), T(gates["g"][row]), beta,
                              *args, layer=1)["o"]
    ro, rout, rerr = make_backend("reference").gdn(
        pool, q[row], k[row], v[row], {n: x[row] for n, x in gates.items()},
        *(a.cpu().numpy() for a in args), layer=1)
    assert errors.tolist() == rerr.tolist() == new_errors().tolist()
    close(o.cpu().numpy(), ro, 1e-5)
    close(got.cpu().numpy(), rout, 1e-5)

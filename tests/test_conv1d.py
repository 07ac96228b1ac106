"""The causal conv1d update (kernels/conv1d.py) in three ways: the float64 reference, torch
and JAX (docs/semantics.md §4). Windows are copies of inputs: bit-exact against the
reference; outputs are fp32 sums: relative 1e-5 (fp32) or 2e-2 (bf16 inputs). torch and
JAX run the same kernel: bit-identical."""

import ml_dtypes
import numpy as np
import pytest
from seqlens_cases import SEQLENS_CASES, check_seqlens_launch, seqlens_case
from support import make_backend

from mamba_align.core import Fault, new_errors
from mamba_align.kernels import conv1d as kconv

L, NB, K, S = 2, 9, 4, 2
W = K - 1 + S
SENTINEL = -7.25
# rows: fresh prefill of 20 tokens (past one token tile); decode reading and writing the
# same block at offset 1 (the pre-copy case); a spec row of 1 + S; a spec row of 1; an
# empty row (padding); a non-spec row reading another block at offset S (copy-free)
CU = np.array([0, 20, 21, 24, 25, 25, 27])
RB = np.array([-1, 2, 3, 4, -1, 5])
OFF = np.array([0, 1, 0, S, 0, S])
WB = np.array([1, 2, 6, 7, 3, -1])
SPEC = np.array([0, 0, 1, 1, 0, 0])


def inputs(rng, D, dtype, layout, pool_dtype=None):
    shape = (L, NB, W, D) if layout == "SD" else (L, NB, D, W)
    pool = rng.normal(size=shape).astype(pool_dtype or dtype)
    T = int(CU[-1])
    x, w, cb = (rng.normal(size=s).astype(dtype) for s in ((T, D), (D, K), (D,)))
    return pool, x, w, cb


def close(a, b, dtype):
    tol = 2e-2 if dtype == ml_dtypes.bfloat16 else 1e-5
    np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("layout", ["SD", "DS"])
@pytest.mark.parametrize("D,activation", [(40, "silu"), (16, "none")])
def test_matches_the_reference(backend, layout, D, activation):
    rng = np.random.default_rng(D)
    pool, x, w, cb = inputs(rng, D, np.float32, layout)
    y, out, err = backend.conv1d_update(pool, x, w, cb, CU, RB, OFF, WB, SPEC, layer=1,
                                        layout=layout, activation=activation)
    ry, rout, rerr = make_backend("reference").conv1d_update(
        pool, x, w, cb, CU, RB, OFF, WB, SPEC, layer=1, layout=layout, activation=activation)
    close(y, ry, np.float32)
    np.testing.assert_array_equal(out, rout)  # windows: copies; other blocks, layer 0: kept
    assert err.tolist() == rerr.tolist() == [0, 2**31 - 1]
    assert (out[0] == pool[0]).all() and (out[1, [0, 3, 4, 5, 8]] == pool[1, [0, 3, 4, 5, 8]]).all()


@pytest.mark.parametrize("layout", ["SD", "DS"])
def test_bf16(backend, layout):
    rng = np.random.default_rng(1)
    bf = ml_dtypes.bfloat16
    pool, x, w, cb = inputs(rng, 24, bf, layout)
    y, out, _ = backend.conv1d_update(pool, x, w, cb, CU, RB, OFF, WB, SPEC, layer=0,
                                      layout=layout)
    ry, rout, _ = make_backend("reference").conv1d_update(pool, x, w, cb, CU, RB, OFF, WB, SPEC,
                                                          layer=0, layout=layout)
    assert y.dtype == bf
    close(y, ry, bf)
    np.testing.assert_array_equal(out.view(np.int16), rout.view(np.int16))


@pytest.mark.parametrize("layout", ["SD", "DS"])
@pytest.mark.parametrize("pool_dtype", [ml_dtypes.bfloat16, np.float16])
def test_a_window_narrowed_into_the_pool_is_rounded_as_the_reference_rounds(device_backend,
                                                                           layout, pool_dtype):
    # fp32 inputs into a 16-bit pool: to nearest even, as compiled kernels round (the CPU
    # interpreter truncated bfloat16 until kernels/interpret.py made it round)
    rng = np.random.default_rng(7)
    pool, x, w, cb = inputs(rng, 24, np.float32, layout, pool_dtype=pool_dtype)
    _, out, _ = device_backend.conv1d_update(pool, x, w, cb, CU, RB, OFF, WB, SPEC, layer=0,
                                             layout=layout)
    _, rout, _ = make_backend("reference").conv1d_update(pool, x, w, cb, CU, RB, OFF, WB, SPEC,
                                                         layer=0, layout=layout)
    np.testing.assert_array_equal(out.view(np.int16), rout.view(np.int16))


def test_torch_and_jax_give_the_same_bits():
    rng = np.random.default_rng(2)
    pool, x, w, cb = inputs(rng, 40, np.float32, "SD")
    got = [make_backend(b).conv1d_update(pool, x, w, cb, CU, RB, OFF, WB, SPEC, layer=1,
                                         layout="SD") for b in ("torch", "jax")]
    for a, b in zip(*got):
        np.testing.assert_array_equal(a, b)


def test_a_row_gives_the_same_bits_in_any_batch(device_backend):
    # batch invariance: row 3 alone equals row 3 among the others
    rng = np.random.default_rng(3)
    pool, x, w, cb = inputs(rng, 40, np.float32, "SD")
    y, out, _ = device_backend.conv1d_update(pool, x, w, cb, CU, RB, OFF, WB, SPEC, layer=1,
                                             layout="SD")
    t0, t1 = CU[3], CU[4]
    y1, out1, _ = device_backend.conv1d_update(pool, x[t0:t1], w, cb, [0, t1 - t0], RB[3:4],
                                               OFF[3:4], WB[3:4], SPEC[3:4], layer=1,
                                               layout="SD")
    np.testing.assert_array_equal(y1, y[t0:t1])
    np.testing.assert_array_equal(out1[1, WB[3]], out[1, WB[3]])


@pytest.mark.parametrize("layout,first,dtype", [("SD", 20, np.float32), ("DS", 20, np.float32),
                                                ("SD", 1, ml_dtypes.bfloat16)])
def test_the_tiles_change_no_bits(device_backend, layout, first, dtype):
    # a batch of SMALL_BATCH rows gets more channels per program than a row alone: twice
    # as many, or DECODE_TILE_SD in an SD decode batch with packed bf16 taps (first = 1);
    # with first = 20, a mean of 3 tokens per row also takes a smaller token tile than the
    # 20-token row alone: same bits
    rng = np.random.default_rng(5)
    n, D = kconv.SMALL_BATCH, 300
    batch, alone = (conv_plan(layout, np.dtype(dtype).name, D, rows, tokens)
                    for rows, tokens in ((n, n + first - 1), (1, first)))
    assert batch.constexprs["W_PACKED"] == (dtype != np.float32)
    want = kconv.DECODE_TILE_SD if first == 1 else 2 * alone.constexprs["TILE_D"]
    assert batch.constexprs["TILE_D"] == want
    cu = np.concatenate([[0, first], first + np.arange(1, n)])
    rb, wb = np.arange(1, n + 1), np.arange(n + 1, 2 * n + 1)
    off, spec = np.ones(n, np.int64), np.zeros(n, np.int64)
    pool = rng.normal(size=(L, 2 * n + 1, W, D)).astype(dtype)
    if layout == "DS":
        pool = np.ascontiguousarray(pool.swapaxes(2, 3))
    x, w, cb = (rng.normal(size=s).astype(dtype) for s in ((cu[-1], D), (D, K), (D,)))
    y, out, _ = device_backend.conv1d_update(pool, x, w, cb, cu, rb, off, wb, spec, layer=1,
                                             layout=layout)
    for r in (0, 5):
        t0, t1 = cu[r], cu[r + 1]
        y1, out1, _ = device_backend.conv1d_update(pool, x[t0:t1], w, cb, [0, t1 - t0],
                                                   rb[r:r + 1], off[r:r + 1], wb[r:r + 1],
                                                   spec[r:r + 1], layer=1, layout=layout)
        np.testing.assert_array_equal(y1, y[t0:t1])
        np.testing.assert_array_equal(out1[1, wb[r]], out[1, wb[r]])


def conv_plan(layout, dtype, D, rows, tokens, weight=None, pool_dtype=None):
    """The plan of a launch on row-major arrays (``weight``: an ArraySpec of the taps)."""
    spec = kconv.ArraySpec.row_major
    ids = spec((rows,), "int64")
    block = (W, D) if layout == "SD" else (D, W)
    return kconv.plan_conv1d_update(spec((L, NB) + block, pool_dtype or dtype),
                                    spec((2,), "int32"), spec((tokens, D), dtype),
                                    weight or spec((D, K), dtype), spec((D,), dtype),
                                    spec((rows + 1,), "int64"), ids, ids, ids, ids, layer=1,
                                    layout=layout, activation="silu")


def test_taps_are_packed_only_as_four_2_byte_taps_in_rows_of_4():
    # a K = 3 view of a [D, 4] weight (rows of 4, but the last row's word would run past
    # its storage), a row stride of 8, fp32 taps: one by one; one channel: any stride
    cases = [((300, 4), "bfloat16", (4, 1), True), ((300, 4), "float16", (4, 1), True),
             ((300, 3), "bfloat16", (4, 1), False), ((300, 4), "bfloat16", (8, 1), False),
             ((300, 4), "float32", (4, 1), False), ((1, 4), "bfloat16", (1, 1), True)]
    for shape, dtype, strides, packed in cases:
        weight = kconv.ArraySpec(shape, dtype, strides)
        plan = conv_plan("SD", "bfloat16", shape[0], 16, 16, weight=weight)
        assert plan.constexprs["W_PACKED"] == packed, weight
    # the wide decode tile was measured with a 2-byte window: an fp32 pool keeps the default
    wide = conv_plan("SD", "bfloat16", 300, 16, 16).constexprs["TILE_D"]
    fp32_pool = conv_plan("SD", "bfloat16", 300, 16, 16, pool_dtype="float32").constexprs
    assert wide == kconv.DECODE_TILE_SD and fp32_pool["TILE_D"] == kconv.MAX_TILE_D
    assert fp32_pool["W_PACKED"]


@pytest.mark.parametrize("layout", ["SD", "DS"])
@pytest.mark.parametrize("ksize", [2, 3, 4, 5])
@pytest.mark.parametrize("pad", [0, 2, kconv.LATENCY_BELOW])
def test_one_token_rows_at_every_kernel_size(backend, layout, ksize, pad):
    # one-token rows take their own path for K <= 4 (kernels/conv1d.py, _one_token), K = 5
    # the tiled one: in place at offset 0 (every row it reads is rewritten), another
    # block, no history, in place at offset 1 after a 3-token row, no write, a spec row of
    # one token, a faulty row (offset past W - K + 1); 300 channels: two or three programs.
    # pad: rows without tokens after them, for each form of the one-token path: a small
    # batch of more tokens than rows (0), a small decode batch (2: UNBRANCHED),
    # a large batch (LATENCY_BELOW)
    rng = np.random.default_rng(20 + ksize)
    width, D = ksize - 1 + S, 300
    shape = (L, NB, width, D) if layout == "SD" else (L, NB, D, width)
    pool = rng.normal(size=shape).astype(np.float32)
    cu = np.array([0, 1, 2, 3, 6, 7, 8] + [8] * pad)
    rb = np.array([2, 3, -1, 4, 5, 6] + [-1] * pad)
    off = np.array([0, 0, 0, 1, 1, S + 1] + [0] * pad)
    wb = np.array([2, 1, 7, 4, -1, 6] + [-1] * pad)
    spec = np.array([0, 0, 0, 0, 1, 0] + [0] * pad)
    plan = conv_plan("SD", "float32", D, len(rb), 8).constexprs
    assert (plan["LATENCY"], plan["UNBRANCHED"]) == (pad < kconv.LATENCY_BELOW, pad == 2)
    x, w, cb = (rng.normal(size=s).astype(np.float32) for s in ((8, D), (D, ksize), (D,)))
    args = (pool, x, w, cb, cu, rb, off, wb, spec)
    y, out, err = backend.conv1d_update(*args, layer=1, layout=layout)
    ry, rout, rerr = make_backend("reference").conv1d_update(*args, layer=1, layout=layout)
    close(y, ry, np.float32)
    assert (y[7] == 0).all() and err.tolist() == rerr.tolist() == [int(Fault.BAD_OFFSET), 5]
    np.testing.assert_array_equal(out, rout)


def test_a_block_past_32_bit_offsets_is_refused():
    spec = kconv.ArraySpec.row_major
    ids, D = spec((1,), "int64"), 2**28
    with pytest.raises(ValueError, match="32-bit offsets"):
        kconv.plan_conv1d_update(spec((1, 2, 8, D), "bfloat16"), spec((2,), "int32"),
                                 spec((1, D), "bfloat16"), spec((D, 4), "bfloat16"),
                                 spec((D,), "bfloat16"), spec((2,), "int64"), ids, ids, ids,
                                 ids, layer=0, layout="SD", activation="silu")


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_a_one_token_row_gives_the_bits_of_a_longer_rows_first_token(device_backend, dtype):
    # the first output of a 2-token row (the tiled path) and a 1-token row with the same
    # history and token (the one-token path): the same sum in the same order; 2-byte taps
    # in rows of 4 reach the one-token path as one packed word each (W_PACKED), the tiled
    # path loads them one by one: the unpacking is exact
    plan = conv_plan("SD", np.dtype(dtype).name, 40, 2, 3)
    assert plan.constexprs["W_PACKED"] == (dtype != np.float32)
    rng = np.random.default_rng(8)
    for layout in ("SD", "DS"):
        pool, x, w, cb = inputs(rng, 40, dtype, layout)
        x = np.concatenate([x[:2], x[:1]])
        y, _, err = device_backend.conv1d_update(pool, x, w, cb, [0, 2, 3], [3, 3], [1, 1],
                                                 [4, 5], [0, 0], layer=1, layout=layout)
        assert err.tolist() == [0, 2**31 - 1]
        np.testing.assert_array_equal(y[2], y[0])


@pytest.mark.parametrize("pad", [0, 3, kconv.LATENCY_BELOW])
def test_faulty_rows_are_flagged_and_write_nothing(backend, pad):
    # pad: clean rows without tokens after the five, so that the rows post their faults
    # after their work (a small batch: LATENCY; with 3, a decode batch: UNBRANCHED) or
    # before it: the same flags either way
    rng = np.random.default_rng(4)
    pool, x, w, cb = inputs(rng, 16, np.float32, "SD")
    pool[:] = SENTINEL
    pool[1, 1:6] = rng.normal(size=(5, W, 16))
    cu = np.array([0, 1, 2, 6, 7, 8] + [8] * pad)
    # a read block past NB; an offset past W - K + 1; a spec row of 4 > W - K + 2 tokens; a
    # write block below -1; a good row
    rb, off = np.array([NB, 1, 2, 3, 4] + [-1] * pad), np.array([0, S + 1, 0, 0, 0] + [0] * pad)
    wb, spec = np.array([5, 5, 5, -2, 6] + [-1] * pad), np.array([0, 0, 1, 0, 0] + [0] * pad)
    plan = conv_plan("SD", "float32", 16, len(rb), 8).constexprs
    assert (plan["LATENCY"], plan["UNBRANCHED"]) == (pad < kconv.LATENCY_BELOW, pad == 3)
    y, out, err = backend.conv1d_update(pool, x[:8], w, cb, cu, rb, off, wb, spec, layer=1,
                                        layout="SD")
    ry, rout, rerr = make_backend("reference").conv1d_update(pool, x[:8], w, cb, cu, rb, off,
                                                             wb, spec, layer=1, layout="SD")
    assert Fault(int(err[0])) == Fault.BAD_BLOCK | Fault.BAD_OFFSET | Fault.BAD_QUERY_LEN
    assert err[1] == 0 and err.tolist() == rerr.tolist()
    assert (y[:7] == 0).all()
    close(y[7], ry[7], np.float32)
    np.testing.assert_array_equal(out, rout)
    assert (np.delete(out[1], 6, axis=0) == pool[1][np.arange(NB) != 6]).all()


def seqlens_launch(backend, cu, spec):
    """40 one-token rows (blocks 1-40 read at offset 1, 41-80 written) on ``cu``, by
    ``backend`` and by the reference: ``(pool, write blocks, (y, out, err), reference's)``."""
    n = len(cu) - 1
    rng = np.random.default_rng(11)
    pool = rng.normal(size=(L, 2 * n + 1, W, 16)).astype(np.float32)
    x, w, cb = (rng.normal(size=s).astype(np.float32) for s in ((n, 16), (16, K), (16,)))
    wb = np.arange(n + 1, 2 * n + 1)
    args = (cu, np.arange(1, n + 1), np.ones(n, np.int64), wb, np.full(n, spec))
    got, ref = (b.conv1d_update(pool, x, w, cb, *args, layer=1, layout="SD")
                for b in (backend, make_backend("reference")))
    return pool, wb, got, ref


@pytest.mark.parametrize("changed, bad", SEQLENS_CASES)
def test_a_bad_cu_seqlens_entry_faults_only_the_rows_that_read_it(backend, changed, bad):
    cu = seqlens_case(40, changed)
    pool, wb, got, ref = seqlens_launch(backend, cu, 0)
    good = check_seqlens_launch(cu, bad, int(Fault.BAD_CU_SEQLENS), pool, wb, got, ref, 0, 1e-5)
    # every history row of a good row's window is new
    assert (got[1][1, wb[good], :K - 1] != pool[1, wb[good], :K - 1]).all()


def test_a_wild_row_length_gives_the_references_bits_on_spec_rows(backend):
    # rows 9 and 10 end past T_total, row 11 runs backwards; row 9 (41 tokens) is also a
    # spec row longer than its window
    cu = seqlens_case(40, {10: 50, 11: 50})
    check_seqlens_launch(cu, [9, 10, 11], int(Fault.BAD_CU_SEQLENS | Fault.BAD_QUERY_LEN),
                         *seqlens_launch(backend, cu, 1), 0, 1e-5)


def test_rows_without_tokens_still_flag_bad_ids(backend):
    rng = np.random.default_rng(7)
    pool, x, w, cb = inputs(rng, 16, np.float32, "SD")
    _, out, err = backend.conv1d_update(pool, x[:0], w, cb, [0, 0], [NB], [0], [2], [0],
                                        layer=0, layout="SD")
    assert err.tolist() == [int(Fault.BAD_BLOCK), 0]
    np.testing.assert_array_equal(out, pool)


def test_a_batch_without_rows_returns_zeros(backend):
    # nothing is launched; tokens outside every row are unspecified, but both launchers
    # return zeros rather than what their allocator held
    rng = np.random.default_rng(8)
    pool, x, w, cb = inputs(rng, 16, np.float32, "SD")
    y, out, err = backend.conv1d_update(pool, x[:3], w, cb, [0], np.zeros(0, np.int64),
                                        np.zeros(0, np.int64), np.zeros(0, np.int64),
                                        np.zeros(0, np.int64), layer=0, layout="SD")
    assert y.shape == (3, 16) and not y.any()
    np.testing.assert_array_equal(out, pool)
    assert err.tolist() == [0, 2**31 - 1]


@pytest.mark.parametrize("change,error", [
    (dict(layer=2), "layer"), (dict(layout="XY"), "layout"), (dict(activation="relu"), "activation"),
    (dict(weight=np.zeros((16, W + 2), np.float32)), "kernel size"),
    (dict(x=np.zeros((3, 8), np.float32)), "x must have shape"),
    (dict(layout="DS"), r"x must have shape \[T, D\] with D = 5, the channels of a DS pool"),
    (dict(pool=np.zeros((L, NB, W, 16), np.int32)), "pool must have dtype"),
])
def test_bad_arguments_raise(device_backend, change, error):
    rng = np.random.default_rng(6)
    pool, x, w, cb = inputs(rng, 16, np.float32, "SD")
    kw = dict(pool=pool, x=x[:3], weight=w, bias=cb, layer=0, layout="SD", activation="silu")
    kw.update(change)
    with pytest.raises((ValueError, TypeError), match=error):
        device_backend.conv1d_update(kw["pool"], kw["x"], kw["weight"], kw["bias"], [0, 3],
                                     [1], [0], [2], [0], layer=kw["layer"], layout=kw["layout"],
                                     activation=kw["activation"])


def test_torch_compile_and_jax_jit_give_the_eager_bits():
    # the custom op under torch.compile (two row counts: the second is symbolic), and the
    # JAX function under jit with the pool donated
    import jax
    import torch

    from mamba_align.backends.jax import ops as jops
    from mamba_align.backends.torch import ops as tops
    rng = np.random.default_rng(12)
    pool, x, w, cb = inputs(rng, 16, np.float32, "DS")
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # compiled kernels need CUDA tensors
    T = lambda a: torch.as_tensor(a, device=dev)  # noqa: E731, N806

    def call(p, *arrays):
        return tops.conv1d_update_(p, *arrays, layer=1, layout="DS")["y"]

    compiled = torch.compile(call, fullgraph=True)
    for rows in (6, 3):
        n = int(CU[rows])
        arrays = [T(new_errors()), T(x[:n]), T(w), T(cb), T(CU[:rows + 1]), T(RB[:rows]),
                  T(OFF[:rows]), T(WB[:rows]), T(SPEC[:rows])]
        pe, pc = T(pool.copy()), T(pool.copy())
        assert torch.equal(call(pe, *arrays), compiled(pc, *[a.clone() for a in arrays]))
        assert torch.equal(pe, pc)
    fn = jax.jit(jops.conv1d_update, static_argnames=("layer", "layout", "activation"),
                 donate_argnums=(0, 1))
    A = jax.numpy.asarray  # noqa: N806
    args = (A(x), A(w), A(cb), A(CU), A(RB), A(OFF), A(WB), A(SPEC))
    eager = jops.conv1d_update(A(pool), A(new_errors()), *args, layer=1, layout="DS")
    jitted = fn(A(pool), A(new_errors()), *args, layer=1, layout="DS")
    for name in ("y", "pool", "errors"):
        np.testing.assert_array_equal(np.asarray(eager[name]), np.asarray(jitted[name]))

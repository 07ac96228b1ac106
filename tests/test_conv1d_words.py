"""The conv1d update's one-token rows on a DS pool of ``K - 1`` columns, whose windows
move as 8-byte words (kernels/conv1d_ds_words.py): bit-exact windows and the one-token
path's bits against the reference, the tiled path and the per-field form."""

import ml_dtypes
import numpy as np
import pytest
from support import make_backend

from mamba_align.core import Fault
from mamba_align.kernels import conv1d as kconv

L, NB, K = 2, 9, 4
W = K - 1  # a pool without drafts
BF, F16 = ml_dtypes.bfloat16, np.float16


def plan(D=300, rows=7, tokens=7, pool="bfloat16", x="bfloat16", weight=None,
         layout="DS", width=W, block_stride=None, x_stride=None):
    spec = kconv.ArraySpec.row_major
    ids = spec((rows,), "int64")
    x_spec = spec((tokens, D), x) if x_stride is None else kconv.ArraySpec((tokens, D), x,
                                                                            (x_stride, 1))
    pool_spec = spec((L, NB) + ((width, D) if layout == "SD" else (D, width)), pool)
    if block_stride:  # blocks padded: a view of a wider pool
        pool_spec = kconv.ArraySpec(pool_spec.shape, pool,
                                    (NB * block_stride, block_stride, width, 1))
    return kconv.plan_conv1d_update(pool_spec, spec((2,), "int32"), x_spec,
                                    weight or spec((D, K), "bfloat16"),
                                    spec((D,), "bfloat16"), spec((rows + 1,), "int64"), ids,
                                    ids, ids, ids, layer=1, layout=layout,
                                    activation="silu").constexprs


def test_only_2_byte_ds_windows_of_k_minus_1_columns_in_whole_words_move_as_words():
    assert plan()["DS_WORDS"] and plan(pool="float16", x="float32")["DS_WORDS"]
    assert plan()["TILE_D"] == kconv.DECODE_TILE_DS_WORDS
    assert plan(block_stride=904)["DS_WORDS"] and plan(x="float32", x_stride=302)["DS_WORDS"]
    unpacked = kconv.ArraySpec((300, K), "bfloat16", (8, 1))  # taps one by one
    for other in (dict(layout="SD"), dict(width=W + 2), dict(pool="float32"), dict(D=302),
                  dict(weight=unpacked), dict(block_stride=902), dict(x_stride=302),
                  dict(x="float32", x_stride=301)):  # rows of x off 8-byte boundaries
        assert not plan(**other)["DS_WORDS"], other


def rows_case(rng, D, pool_dtype, x_dtype, bias_dtype, pad):
    """One-token rows: in place, another block, no history, no write, a faulty row (an
    offset past ``W - K + 1 = 0``), a 3-token row (the tiled path) and in place again;
    ``pad`` rows without tokens after them (the small-batch, small decode batch and large
    batch forms)."""
    pool = rng.normal(size=(L, NB, D, W)).astype(pool_dtype)
    cu = np.array([0, 1, 2, 3, 4, 5, 8, 9] + [9] * pad)
    rb = np.array([2, 3, -1, 4, 5, 6, 1] + [-1] * pad)
    off = np.array([0, 0, 0, 0, 1, 0, 0] + [0] * pad)
    wb = np.array([2, 7, 8, -1, 5, 6, 1] + [-1] * pad)
    spec = np.zeros(len(rb), np.int64)
    x = rng.normal(size=(9, D)).astype(x_dtype)
    w = rng.normal(size=(D, K)).astype(pool_dtype)
    cb = rng.normal(size=(D,)).astype(bias_dtype)
    return pool, x, w, cb, cu, rb, off, wb, spec


@pytest.mark.parametrize("pool_dtype,x_dtype,bias_dtype",
                         [(BF, BF, BF), (F16, F16, np.float32), (BF, np.float32, F16)])
@pytest.mark.parametrize("pad", [0, 2, kconv.LATENCY_BELOW])
@pytest.mark.parametrize("D", [1100, 16])
def test_word_windows_match_the_reference(backend, pool_dtype, x_dtype, bias_dtype, pad, D):
    # D = 1100: three programs of 512 channels in a decode batch, the last one part full
    # (the 3-token row in passes of PASS_D channels); 16: one program of 16 channels
    rng = np.random.default_rng(pad + 3)
    args = rows_case(rng, D, pool_dtype, x_dtype, bias_dtype, pad)
    constexprs = plan(D, len(args[5]), 9, np.dtype(pool_dtype).name, np.dtype(x_dtype).name)
    assert constexprs["DS_WORDS"] and (constexprs["LATENCY"], constexprs["UNBRANCHED"]) == (
        pad < kconv.LATENCY_BELOW, pad == 2)
    y, out, err = backend.conv1d_update(*args, layer=1, layout="DS")
    ry, rout, rerr = make_backend("reference").conv1d_update(*args, layer=1, layout="DS")
    assert err.tolist() == rerr.tolist() == [int(Fault.BAD_OFFSET), 4]
    np.testing.assert_array_equal(out, rout)  # windows are bit copies; the rest kept
    tol = 1e-5 if x_dtype == np.float32 else 2e-2  # y: fp32 sums in x's dtype
    np.testing.assert_allclose(y.astype(np.float64), ry.astype(np.float64), rtol=tol, atol=tol)
    assert (y[4] == 0).all()


@pytest.mark.parametrize("pad", [1, kconv.LATENCY_BELOW])
def test_a_decode_batch_of_words_matches_the_reference(backend, pad):
    # decode batches only (UNBRANCHED below LATENCY_BELOW rows): one-token rows, the faulty
    # one among them, then rows without tokens
    rng = np.random.default_rng(30 + pad)
    D = 520
    pool = rng.normal(size=(L, NB, D, W)).astype(BF)
    cu = np.array([0, 1, 2, 3, 4] + [4] * pad)
    rb = np.array([2, -1, 5, 3] + [-1] * pad)
    off = np.array([0, 0, 2, 0] + [0] * pad)
    wb = np.array([2, 4, 6, -1] + [-1] * pad)
    spec = np.zeros(len(rb), np.int64)
    x, w, cb = (rng.normal(size=s).astype(BF) for s in ((4, D), (D, K), (D,)))
    constexprs = plan(D, len(rb), 4)
    assert constexprs["DS_WORDS"] and constexprs["UNBRANCHED"] == (pad < kconv.LATENCY_BELOW)
    args = (pool, x, w, cb, cu, rb, off, wb, spec)
    y, out, err = backend.conv1d_update(*args, layer=1, layout="DS")
    ry, rout, rerr = make_backend("reference").conv1d_update(*args, layer=1, layout="DS")
    assert err.tolist() == rerr.tolist() == [int(Fault.BAD_OFFSET), 2]
    np.testing.assert_array_equal(out, rout)
    np.testing.assert_allclose(y.astype(np.float64), ry.astype(np.float64), rtol=2e-2, atol=2e-2)
    assert (y[2] == 0).all()


@pytest.mark.parametrize("pad", [0, 2, kconv.LATENCY_BELOW])
def test_a_row_past_the_tokens_is_flagged_and_writes_nothing(backend, pad):
    # a 3-token row, a one-token row, then a one-token row whose cu_seqlens entries run
    # past T_total = 4 (BAD_CU_SEQLENS): no y stored for it (its token would lie outside
    # y), no window; the others run
    rng = np.random.default_rng(40 + pad)
    D = 600
    pool = rng.normal(size=(L, NB, D, W)).astype(BF)
    cu = np.array([0, 3, 4, 5] + [5] * pad)
    rb = np.array([1, 2, 5] + [-1] * pad)
    spec = np.zeros(len(rb), np.int64)
    x, w, cb = (rng.normal(size=s).astype(BF) for s in ((4, D), (D, K), (D,)))
    constexprs = plan(D, len(rb), 4)
    assert constexprs["DS_WORDS"] and constexprs["UNBRANCHED"] == (pad == 2)
    args = (pool, x, w, cb, cu, rb, spec, rb, spec)  # in place at offset 0
    y, out, err = backend.conv1d_update(*args, layer=1, layout="DS")
    ry, rout, rerr = make_backend("reference").conv1d_update(*args, layer=1, layout="DS")
    assert err.tolist() == rerr.tolist() == [int(Fault.BAD_CU_SEQLENS), 2]
    np.testing.assert_array_equal(out, rout)
    assert (out[1, 5] == pool[1, 5]).all()
    np.testing.assert_allclose(y.astype(np.float64), ry.astype(np.float64), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [BF, F16])
def test_words_give_the_bits_of_the_tiled_path_and_of_the_field_by_field_path(device_backend,
                                                                              dtype):
    # row 2 (one token, words) against row 0's first token (a 2-token row: the tiled path)
    # with the same history and token; then the same one-token row on a pool of 5 columns
    # read at offset 0 (one-token path, field by field)
    rng = np.random.default_rng(9)
    D = 600
    pool = rng.normal(size=(L, NB, D, W)).astype(dtype)
    x = rng.normal(size=(2, D)).astype(dtype)
    x = np.concatenate([x, x[:1]])
    w, cb = rng.normal(size=(D, K)).astype(dtype), rng.normal(size=(D,)).astype(dtype)
    ids = ([0, 2, 3], [3, 3], [0, 0], [4, 5], [0, 0])
    y, out, err = device_backend.conv1d_update(pool, x, w, cb, *ids, layer=1, layout="DS")
    assert err.tolist() == [0, 2**31 - 1]
    np.testing.assert_array_equal(y[2], y[0])
    wide = np.concatenate([pool, np.zeros((L, NB, D, 2), dtype)], axis=3)
    y5, out5, _ = device_backend.conv1d_update(wide, x, w, cb, *ids, layer=1, layout="DS")
    np.testing.assert_array_equal(y5, y)
    np.testing.assert_array_equal(out5[..., :W], out)


def test_torch_and_jax_give_the_same_bits():
    rng = np.random.default_rng(5)
    args = rows_case(rng, 1100, BF, BF, BF, 2)
    (ty, tout, terr), (jy, jout, jerr) = (
        make_backend(b).conv1d_update(*args, layer=1, layout="DS") for b in ("torch", "jax"))
    assert ty.tobytes() == jy.tobytes() and tout.tobytes() == jout.tobytes()
    assert terr.tolist() == jerr.tolist()

"""The conv1d update's one-token rows on a 2-byte DS pool of an even number of columns (a
model with drafts), whose window moves as two aligned 4-byte words a channel
(``kernels.conv1d.ds_pairs``): every read offset against the reference, the scratch columns
kept, and the same bits as the field-by-field path and as torch / JAX."""

import ml_dtypes
import numpy as np
import pytest
from support import make_backend

from mamba_align.core import Fault, new_errors
from mamba_align.kernels import conv1d as kconv

L, NB, K = 2, 18, 4
BF, F16 = ml_dtypes.bfloat16, np.float16


def constexprs(width, D=40, rows=9, tokens=11, pool="bfloat16", ksize=K, layout="DS",
               block_stride=None):
    spec = kconv.ArraySpec.row_major
    ids = spec((rows,), "int64")
    shape = (L, NB) + ((width, D) if layout == "SD" else (D, width))
    pool_spec = spec(shape, pool)
    if block_stride:  # blocks padded: a view of a wider pool
        pool_spec = kconv.ArraySpec(shape, pool, (NB * block_stride, block_stride, width, 1))
    return kconv.plan_conv1d_update(pool_spec, spec((2,), "int32"), spec((tokens, D), pool),
                                    spec((D, ksize), "bfloat16"), spec((D,), "bfloat16"),
                                    spec((rows + 1,), "int64"), ids, ids, ids, ids, layer=1,
                                    layout=layout, activation="silu").constexprs


def test_only_2_byte_ds_windows_of_an_even_width_from_4_move_as_pairs():
    for width in (4, 6, 8):
        assert constexprs(width)["DS_PAIRS"] and constexprs(width, pool="float16")["DS_PAIRS"]
        assert not constexprs(width)["DS_WORDS"]
    assert constexprs(6, block_stride=6 * 40 + 2)["DS_PAIRS"]
    for other in (dict(width=3), dict(width=5), dict(width=6, layout="SD"),
                  dict(width=6, pool="float32"), dict(width=6, ksize=3),
                  dict(width=6, block_stride=6 * 40 + 1)):  # blocks off 4-byte boundaries
        assert not constexprs(**other)["DS_PAIRS"], other


def rows_case(rng, width, D, dtype, pad, flip=0):
    """One-token rows at every read offset ``0 .. W - 3`` (in place at the offsets of
    parity ``flip``, into another block at the others),
    a row without history, one without a write block, a faulty one (an offset past
    ``W - 3``) and a 2-token spec row (the tiled path); then ``pad`` rows without tokens
    (the small-batch, small decode batch and large-batch forms). No row writes a block
    another row reads."""
    n = width - 2
    rb = [1 + i for i in range(n)] + [-1, 7, 8, 10]
    wb = [1 + i if i % 2 == flip else 11 + i for i in range(n)] + [0, -1, 9, 10]
    off = list(range(n)) + [0, width - 3, width - 2, 1]
    spec = [0] * (n + 3) + [1]
    cu = np.concatenate([np.arange(n + 4), [n + 5] * (pad + 1)])
    pool = rng.normal(size=(L, NB, D, width)).astype(dtype)
    x = rng.normal(size=(n + 5, D)).astype(dtype)
    w = rng.normal(size=(D, K)).astype(dtype)
    cb = rng.normal(size=(D,)).astype(dtype)
    rb, off, wb, spec = (np.array(a + [v] * pad) for a, v in ((rb, -1), (off, 0), (wb, -1),
                                                               (spec, 0)))
    return pool, x, w, cb, cu, rb, off, wb, spec


@pytest.mark.parametrize("width", [4, 6, 8])
@pytest.mark.parametrize("dtype,flip", [(BF, 0), (BF, 1), (F16, 1)])
@pytest.mark.parametrize("pad", [0, 2, kconv.LATENCY_BELOW])
def test_pairs_match_the_reference(backend, width, dtype, flip, pad):
    rng = np.random.default_rng(width * 10 + pad)
    D = 300  # two programs of the DS decode tile, the last one part full
    args = rows_case(rng, width, D, dtype, pad, flip)
    n = width - 2
    c = constexprs(width, D, len(args[5]), len(args[1]), np.dtype(dtype).name)
    assert c["DS_PAIRS"] and c["LATENCY"] == (len(args[5]) < kconv.LATENCY_BELOW)
    y, out, err = backend.conv1d_update(*args, layer=1, layout="DS")
    ry, rout, rerr = make_backend("reference").conv1d_update(*args, layer=1, layout="DS")
    assert err.tolist() == rerr.tolist() == [int(Fault.BAD_OFFSET), n + 2]
    # windows are bit copies, the scratch columns K - 1 .. W - 1 and other blocks kept
    np.testing.assert_array_equal(out.view(np.uint16), rout.view(np.uint16))
    np.testing.assert_allclose(y.astype(np.float64), ry.astype(np.float64), rtol=2e-2,
                               atol=2e-2)
    assert (y[n + 2] == 0).all()


@pytest.mark.parametrize("width", [4, 6])
@pytest.mark.parametrize("pad", [2, kconv.LATENCY_BELOW])
def test_pairs_give_the_bits_of_the_field_by_field_path(device_backend, monkeypatch, width,
                                                        pad):
    from mamba_align.kernels import clear_plan_caches
    rng = np.random.default_rng(70 + width)
    args = rows_case(rng, width, 520, BF, pad)
    got = []
    try:
        for pairs in (True, False):
            monkeypatch.setattr(kconv, "ds_pairs", lambda *a, on=pairs: on)
            clear_plan_caches()
            assert constexprs(width, 520, len(args[5]), len(args[1]))["DS_PAIRS"] == pairs
            got.append(device_backend.conv1d_update(*args, layer=1, layout="DS"))
    finally:
        monkeypatch.undo()
        clear_plan_caches()
    (y, out, err), (fy, fout, ferr) = got
    assert err.tolist() == ferr.tolist() == [int(Fault.BAD_OFFSET), width]
    assert y.tobytes() == fy.tobytes() and out.tobytes() == fout.tobytes()


def test_torch_and_jax_give_the_same_bits():
    args = rows_case(np.random.default_rng(5), 6, 300, BF, 2)
    (ty, tout, terr), (jy, jout, jerr) = (
        make_backend(b).conv1d_update(*args, layer=1, layout="DS") for b in ("torch", "jax"))
    assert ty.tobytes() == jy.tobytes() and tout.tobytes() == jout.tobytes()
    assert terr.tolist() == jerr.tolist()


def test_pairs_in_padded_blocks_leave_the_padding_alone():
    # blocks inside a larger allocation (block stride W D + 2: still on 4-byte boundaries)
    from support import Torch
    tb = Torch()
    torch, width, D = tb.torch, 6, 300
    args = rows_case(np.random.default_rng(8), width, D, BF, 2, flip=1)
    base = np.full((L, NB, D * width + 2), 7.0, BF)
    base[:, :, :D * width] = args[0].reshape(L, NB, -1)
    whole = tb.pool(base)
    pool = whole[:, :, :D * width].unflatten(-1, (D, width))
    spec = tb.ops.spec("pool", pool)
    assert spec.strides[1] == D * width + 2
    assert kconv.ds_pairs("DS", K, width, spec,
                          kconv.pool_align(kconv.pool_scalars(spec, "DS"), "DS"))
    _, x, w, cb, cu, rb, off, wb, spec = args
    err = torch.from_numpy(new_errors()).to(tb.device)
    y = tb.ops.conv1d_update_(pool, err, tb.pool(x), tb.pool(w), tb.pool(cb), tb.ids(cu),
                              tb.ids(rb), tb.ids(off), tb.ids(wb), tb.flags(spec), layer=1,
                              layout="DS")["y"]
    ry, rout, rerr = make_backend("reference").conv1d_update(*args, layer=1, layout="DS")
    assert err.tolist() == rerr.tolist() == [int(Fault.BAD_OFFSET), width]
    got = whole.cpu().view(torch.int16).numpy()
    np.testing.assert_array_equal(got[:, :, :D * width], rout.view(np.int16).reshape(L, NB, -1))
    np.testing.assert_array_equal(got[:, :, D * width:], base[:, :, D * width:].view(np.int16))
    np.testing.assert_allclose(tb.host(y).astype(np.float64), ry.astype(np.float64),
                               rtol=2e-2, atol=2e-2)

"""The conv1d update's path for a row of one token (a decode row, ``K <= 4``; see
:mod:`.conv1d`): its history rows and token loaded once (the window streamed through the
cache, a channel's 2-byte taps as one packed word), summed in the tiled path's order, and
the new window stored from registers."""

from __future__ import annotations

import triton
import triton.language as tl

from .rows import BAD_CU_SEQLENS


@triton.jit
def _row_at(ptr, pos, d, WIDTH: tl.constexpr, DIM: tl.constexpr,
            LAYOUT_DS: tl.constexpr):
    """Row ``pos`` (a scalar) of the conv window at ``ptr``: ``[len(d)]`` offsets, int32
    (the plan refuses a block of 2^31 elements or more)."""
    if LAYOUT_DS:
        return ptr + d * WIDTH + pos
    return ptr + pos * DIM + d


@triton.jit
def _stream_in(ptr, pos, d, mask, WIDTH: tl.constexpr, DIM: tl.constexpr,
               LAYOUT_DS: tl.constexpr):
    """Row ``pos`` of the window at ``ptr``, read once in a step: hinted to leave the cache
    first (benchmarks/README.md, "Streaming hints")."""
    return tl.load(_row_at(ptr, pos, d, WIDTH, DIM, LAYOUT_DS), mask=mask, other=0,
                   eviction_policy="evict_first")


@triton.jit
def _stream_out(ptr, pos, d, value, mask, WIDTH: tl.constexpr, DIM: tl.constexpr,
                LAYOUT_DS: tl.constexpr):
    """Store row ``pos`` of the window at ``ptr``, not read again in the step: a streaming
    store."""
    tl.store(_row_at(ptr, pos, d, WIDTH, DIM, LAYOUT_DS), value, mask=mask,
             cache_modifier=".cs")


@triton.jit
def _field(word, k: tl.constexpr, dtype: tl.constexpr):
    """2-byte field ``k`` of ``word`` (uint64, field 0 in the low bytes) as ``dtype``."""
    return ((word >> (16 * k)) & 0xFFFF).to(tl.uint16).to(dtype, bitcast=True)


@triton.jit
def _tap(word, k: tl.constexpr, dtype: tl.constexpr):
    """Tap ``k`` of a channel's packed 2-byte taps (``word``), exactly, in fp32."""
    return _field(word, k, dtype).to(tl.float32)


@triton.jit
def _one_token_inputs(pool_ptr, x_ptr, rbase, off, has_hist, t0, num_tokens, x_stride, d,
                      K: tl.constexpr, WIDTH: tl.constexpr, DIM: tl.constexpr,
                      X_ALIGN: tl.constexpr, LAYOUT_DS: tl.constexpr):
    """A one-token row's ``K - 1`` history rows (as loaded: zeros without a read block) and
    its token, each ``[len(d)]`` in the pool's and ``x``'s dtype. Safe before the row's
    checks: the window stays inside the read block and ``x`` inside ``[0, T_total)``."""
    dm = d < DIM
    hm = dm & has_hist
    pos = tl.where(has_hist, off, 0).to(tl.int32)
    rp = pool_ptr + rbase
    h0 = _stream_in(rp, pos, d, hm, WIDTH, DIM, LAYOUT_DS)
    h1 = h0
    h2 = h0
    if K > 2:
        h1 = _stream_in(rp, pos + 1, d, hm, WIDTH, DIM, LAYOUT_DS)
    if K > 3:
        h2 = _stream_in(rp, pos + 2, d, hm, WIDTH, DIM, LAYOUT_DS)
    x_row = t0 * x_stride
    if X_ALIGN > 1:
        x_row = tl.multiple_of(x_row, X_ALIGN)
    xv = tl.load(x_ptr + x_row + d, mask=dm & (t0 >= 0) & (t0 < num_tokens), other=0)
    return h0, h1, h2, xv


@triton.jit
def _one_token_taps(weight_ptr, bias_ptr, w_stride, d, K: tl.constexpr, DIM: tl.constexpr,
                    W_PACKED: tl.constexpr):
    """A channel's ``K`` taps (``w3`` is ``w1`` where ``K < 4``, ``w2`` where ``K < 3``)
    and its bias, ``[len(d)]`` fp32 each."""
    dm = d < DIM
    if W_PACKED:  # a channel's taps are one 8-byte word: one load instead of K
        word = tl.load(weight_ptr.to(tl.pointer_type(tl.uint64), bitcast=True) + d, mask=dm,
                       other=0)
        wt = weight_ptr.dtype.element_ty
        w0 = _tap(word, 0, wt)
        w1 = _tap(word, 1, wt)
        w2 = _tap(word, 2, wt)
        w3 = _tap(word, 3, wt)
    else:
        wp = weight_ptr + d.to(tl.int64) * w_stride
        w0 = tl.load(wp, mask=dm, other=0).to(tl.float32)
        w1 = tl.load(wp + 1, mask=dm, other=0).to(tl.float32)
        w2 = w1
        w3 = w1
        if K > 2:
            w2 = tl.load(wp + 2, mask=dm, other=0).to(tl.float32)
        if K > 3:
            w3 = tl.load(wp + 3, mask=dm, other=0).to(tl.float32)
    cb = tl.load(bias_ptr + d, mask=dm, other=0).to(tl.float32)
    return w0, w1, w2, w3, cb


@triton.jit
def _one_token_sum(h0, h1, h2, xv, w0, w1, w2, w3, cb, K: tl.constexpr, SILU: tl.constexpr):
    """A one-token row's output, fp32: ``full = h0, .., h[K-2], x``, the taps in order,
    then the bias (the tiled path's order), then the activation."""
    acc = tl.zeros(h0.shape, tl.float32)
    acc += w0 * h0.to(tl.float32)
    if K == 2:
        acc += w1 * xv.to(tl.float32)
    else:
        acc += w1 * h1.to(tl.float32)
        if K == 3:
            acc += w2 * xv.to(tl.float32)
        else:
            acc += w2 * h2.to(tl.float32)
            acc += w3 * xv.to(tl.float32)
    acc += cb
    if SILU:
        acc = acc * tl.sigmoid(acc)
    return acc


@triton.jit
def _one_token_window(out, h1, h2, xv, mask, d, K: tl.constexpr, WIDTH: tl.constexpr,
                      DIM: tl.constexpr, LAYOUT_DS: tl.constexpr):
    """Stores a one-token row's new window ``full[1:]`` at ``out`` from registers: a bit
    copy of the history rows it loaded, and its token."""
    dt = out.dtype.element_ty
    if K == 2:
        _stream_out(out, 0, d, xv.to(dt), mask, WIDTH, DIM, LAYOUT_DS)
    else:
        _stream_out(out, 0, d, h1, mask, WIDTH, DIM, LAYOUT_DS)
        if K == 3:
            _stream_out(out, 1, d, xv.to(dt), mask, WIDTH, DIM, LAYOUT_DS)
        else:
            _stream_out(out, 1, d, h2, mask, WIDTH, DIM, LAYOUT_DS)
            _stream_out(out, 2, d, xv.to(dt), mask, WIDTH, DIM, LAYOUT_DS)


@triton.jit
def _one_token(pool_ptr, x_ptr, weight_ptr, bias_ptr, y_ptr, rbase, off, has_hist, t0,
               num_tokens, x_stride, w_stride, fault, one, wbase, writes, d, K: tl.constexpr,
               WIDTH: tl.constexpr, DIM: tl.constexpr, X_ALIGN: tl.constexpr,
               LAYOUT_DS: tl.constexpr, SILU: tl.constexpr, W_PACKED: tl.constexpr,
               UNBRANCHED: tl.constexpr):
    """A row of one token (``K <= 4``): each input loaded once and held, the output summed
    as the tiled path sums it, and the new window stored from registers. A lane stores
    only the channels it loaded, after loading them (a data dependence), so the window may
    be rewritten in place without a barrier.

    With ``UNBRANCHED`` (a small decode batch, where the time is latency) every program
    runs it, with no branch: ``one`` says whether the row has one token, and the stores
    are masked by it and by the row's fault. ptxas keeps a load below the branch its value
    is used behind, which put the window's loads about 100 instructions after the ids'
    arrival, and the taps' behind them (benchmarks/README.md, "The window ahead of the
    row's checks"). Otherwise only a one-token row runs it (``one`` is true)."""
    dm = d < DIM
    h0, h1, h2, xv = _one_token_inputs(pool_ptr, x_ptr, rbase, off, has_hist, t0, num_tokens,
                                       x_stride, d, K, WIDTH, DIM, X_ALIGN, LAYOUT_DS)
    w0, w1, w2, w3, cb = _one_token_taps(weight_ptr, bias_ptr, w_stride, d, K, DIM, W_PACKED)
    if UNBRANCHED:
        acc = _one_token_sum(h0, h1, h2, xv, w0, w1, w2, w3, cb, K, SILU)
        dm = dm & one
        clean = fault == 0
        # a faulty row's y is 0 (not written where its cu_seqlens entries are bad)
        tl.store(y_ptr + t0 * DIM + d, tl.where(clean, acc, 0).to(y_ptr.dtype.element_ty),
                 mask=dm & (clean | ((fault & BAD_CU_SEQLENS) == 0)))
        _one_token_window(pool_ptr + wbase, h1, h2, xv, dm & writes & clean, d, K, WIDTH,
                          DIM, LAYOUT_DS)
        return
    y_at = y_ptr + t0 * DIM + d
    if fault == 0:
        acc = _one_token_sum(h0, h1, h2, xv, w0, w1, w2, w3, cb, K, SILU)
        tl.store(y_at, acc.to(y_ptr.dtype.element_ty), mask=dm)
        _one_token_window(pool_ptr + wbase, h1, h2, xv, dm & writes, d, K, WIDTH, DIM,
                          LAYOUT_DS)
    elif (fault & BAD_CU_SEQLENS) == 0:  # a faulty row's y is 0
        tl.store(y_at, tl.zeros(d.shape, y_ptr.dtype.element_ty), mask=dm)

"""The conv1d update's one-token path on a DS pool of ``K - 1 = 3`` columns with 2-byte
windows (a model without drafts; see :mod:`.conv1d`), moved as 8-byte words.

A channel's window there is 6 bytes: loaded a field at a time, a lane makes nine 2-byte
accesses per channel (three window loads and stores, token, bias, y). Four channels are 12
fields, three aligned words: a lane loads its group's three words, its four tokens and four
biases as words, sums each channel in the one-token path's order (so the bits are the same)
and stores the new windows as three words, the token of each channel shifted in with shifts
and masks (benchmarks/README.md, "DS windows as words")."""

from __future__ import annotations

import triton
import triton.language as tl

from .conv1d_one_token import _field, _one_token_sum, _tap
from .rows import BAD_CU_SEQLENS


@triton.jit
def _bits(value, dtype: tl.constexpr):
    """``value`` (``dtype``, 2 or 4 bytes) as the low bits of a uint64."""
    if dtype.primitive_bitwidth == 16:  # (else: a static if's later code is compiled too)
        bits = value.to(tl.uint16, bitcast=True).to(tl.uint64)
    else:
        bits = value.to(tl.uint32, bitcast=True).to(tl.uint64)
    return bits


@triton.jit
def _quad_load(ptr, g, mask):
    """Elements ``4g .. 4g + 3`` of the contiguous 2- or 4-byte array at ``ptr`` (8-byte
    aligned), bit for bit in its dtype: four ``[len(g)]`` tensors from one or two word
    loads."""
    dt: tl.constexpr = ptr.dtype.element_ty
    words = ptr.to(tl.pointer_type(tl.uint64), bitcast=True)
    if dt.primitive_bitwidth == 16:
        w = tl.load(words + g, mask=mask, other=0)
        quad = (_field(w, 0, dt), _field(w, 1, dt), _field(w, 2, dt), _field(w, 3, dt))
    else:
        lo = tl.load(words + 2 * g, mask=mask, other=0)
        hi = tl.load(words + 2 * g + 1, mask=mask, other=0)
        quad = (_half(lo, 0, dt), _half(lo, 1, dt), _half(hi, 0, dt), _half(hi, 1, dt))
    return quad


@triton.jit
def _half(word, k: tl.constexpr, dtype: tl.constexpr):
    """4-byte half ``k`` of ``word`` as ``dtype``."""
    return ((word >> (32 * k)) & 0xFFFFFFFF).to(tl.uint32).to(dtype, bitcast=True)


@triton.jit
def _quad_store(ptr, g, v0, v1, v2, v3, mask):
    """Stores four fp32 values, rounded to ``ptr``'s 2- or 4-byte dtype, at elements
    ``4g .. 4g + 3`` (8-byte aligned): one or two word stores."""
    dt: tl.constexpr = ptr.dtype.element_ty
    words = ptr.to(tl.pointer_type(tl.uint64), bitcast=True)
    b0, b1 = _bits(v0.to(dt), dt), _bits(v1.to(dt), dt)
    b2, b3 = _bits(v2.to(dt), dt), _bits(v3.to(dt), dt)
    if dt.primitive_bitwidth == 16:
        tl.store(words + g, b0 | (b1 << 16) | (b2 << 32) | (b3 << 48), mask=mask)
    else:
        tl.store(words + 2 * g, b0 | (b1 << 32), mask=mask)
        tl.store(words + 2 * g + 1, b2 | (b3 << 32), mask=mask)


@triton.jit
def _new_window(a, b, c, x0, x1, x2, x3):
    """A group's new windows (three words) from its old ones (``a, b, c``: fields 0-3,
    4-7, 8-11; channel ``j`` in fields ``3j .. 3j + 2``) and its tokens' bits in the
    window's dtype: every field moves down one place, and each channel's last field takes
    its token."""
    na = (a >> 16) | (b << 48)
    nb = (b >> 16) | (c << 48)
    nc = c >> 16
    na = (na & 0xFFFF0000FFFFFFFF) | (x0 << 32)  # field 2: token 0
    nb = (nb & 0xFFFFFFFF0000FFFF) | (x1 << 16)  # field 5: token 1
    nc = (nc & 0x0000FFFFFFFF0000) | x2 | (x3 << 48)  # fields 8, 11: tokens 2, 3
    return na, nb, nc


@triton.jit
def _one_token_words(pool_ptr, x_ptr, weight_ptr, bias_ptr, y_ptr, rbase, has_hist, t0,
                     num_tokens, x_stride, fault, one, wbase, writes, first,
                     TILE_D: tl.constexpr, DIM: tl.constexpr, X_ALIGN: tl.constexpr,
                     SILU: tl.constexpr, UNBRANCHED: tl.constexpr):
    """:func:`.conv1d_one_token._one_token` for ``K = 4`` on a DS pool of 3 columns
    (2-byte), ``DIM % 4 == 0``, 8-byte aligned blocks and rows of ``x``, taps packed, for
    the ``TILE_D`` channels from ``first``: the same loads, sums, masks and stores, four
    channels a lane. A lane stores only the words it loaded, so the window may be rewritten
    in place without a barrier."""
    g = first // 4 + tl.arange(0, TILE_D // 4)  # groups of four channels
    gm = g < DIM // 4
    pt: tl.constexpr = pool_ptr.dtype.element_ty
    rp = (pool_ptr + rbase).to(tl.pointer_type(tl.uint64), bitcast=True) + 3 * g
    # a window of K - 1 columns is read at offset 0 (has_hist is false at any other)
    hm = gm & has_hist
    a = tl.load(rp, mask=hm, other=0, eviction_policy="evict_first")
    b = tl.load(rp + 1, mask=hm, other=0, eviction_policy="evict_first")
    c = tl.load(rp + 2, mask=hm, other=0, eviction_policy="evict_first")
    x_row = t0 * x_stride
    if X_ALIGN > 1:
        x_row = tl.multiple_of(x_row, X_ALIGN)
    x0, x1, x2, x3 = _quad_load(x_ptr + x_row, g, gm & (t0 >= 0) & (t0 < num_tokens))
    wt: tl.constexpr = weight_ptr.dtype.element_ty
    taps = weight_ptr.to(tl.pointer_type(tl.uint64), bitcast=True) + 4 * g
    w_0 = tl.load(taps, mask=gm, other=0)
    w_1 = tl.load(taps + 1, mask=gm, other=0)
    w_2 = tl.load(taps + 2, mask=gm, other=0)
    w_3 = tl.load(taps + 3, mask=gm, other=0)
    b0, b1, b2, b3 = _quad_load(bias_ptr, g, gm)
    y_at = y_ptr + t0 * DIM
    # channel j's history: fields 3j, 3j + 1, 3j + 2 of a, b, c
    s0 = _sum(_field(a, 0, pt), _field(a, 1, pt), _field(a, 2, pt), x0, w_0, wt, b0, SILU)
    s1 = _sum(_field(a, 3, pt), _field(b, 0, pt), _field(b, 1, pt), x1, w_1, wt, b1, SILU)
    s2 = _sum(_field(b, 2, pt), _field(b, 3, pt), _field(c, 0, pt), x2, w_2, wt, b2, SILU)
    s3 = _sum(_field(c, 1, pt), _field(c, 2, pt), _field(c, 3, pt), x3, w_3, wt, b3, SILU)
    na, nb, nc = _new_window(a, b, c, _bits(x0.to(pt), pt), _bits(x1.to(pt), pt),
                             _bits(x2.to(pt), pt), _bits(x3.to(pt), pt))
    wp = (pool_ptr + wbase).to(tl.pointer_type(tl.uint64), bitcast=True) + 3 * g
    if UNBRANCHED:
        gm = gm & one
        clean = fault == 0
        # a faulty row's y is 0 (not written where its cu_seqlens entries are bad)
        _quad_store(y_at, g, tl.where(clean, s0, 0), tl.where(clean, s1, 0),
                    tl.where(clean, s2, 0), tl.where(clean, s3, 0),
                    gm & (clean | ((fault & BAD_CU_SEQLENS) == 0)))
        _window_store(wp, na, nb, nc, gm & writes & clean)
        return
    if fault == 0:
        _quad_store(y_at, g, s0, s1, s2, s3, gm)
        _window_store(wp, na, nb, nc, gm & writes)
    elif (fault & BAD_CU_SEQLENS) == 0:  # a faulty row's y is 0
        zero = tl.zeros(g.shape, tl.float32)
        _quad_store(y_at, g, zero, zero, zero, zero, gm)


@triton.jit
def _sum(h0, h1, h2, xv, taps, wt: tl.constexpr, cb, SILU: tl.constexpr):
    """One channel's output (fp32) from its history, token, packed taps and bias: the
    one-token path's sum."""
    return _one_token_sum(h0, h1, h2, xv, _tap(taps, 0, wt), _tap(taps, 1, wt),
                          _tap(taps, 2, wt), _tap(taps, 3, wt), cb.to(tl.float32), 4, SILU)


@triton.jit
def _window_store(wp, na, nb, nc, mask):
    """A group's three new window words, streamed out."""
    tl.store(wp, na, mask=mask, cache_modifier=".cs")
    tl.store(wp + 1, nb, mask=mask, cache_modifier=".cs")
    tl.store(wp + 2, nc, mask=mask, cache_modifier=".cs")

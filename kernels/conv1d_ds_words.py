"""The conv1d update's one-token path on a 2-byte DS pool of ``K - 1 = 3`` columns (a
model without drafts) or ``K - 1 + 3 = 6`` (three drafts), ``K = 4``, its windows moved as
8-byte words (see :mod:`.conv1d`).

Loaded a field at a time, a lane makes nine 2-byte accesses per channel (three window
loads and stores, token, bias, y). Here a lane takes a group of four channels: their
windows (12 or 24 fields) as three or six aligned words, their tokens, biases and outputs
as words; it sums each channel in the one-token path's order (so the bits are the same)
and stores the new windows' first three fields as three words (width 3) or as a 4-byte and
a 2-byte store a channel (width 6: the other three fields keep their content)
(benchmarks/README.md, "DS windows as words")."""

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
def _views(pool_ptr, rbase, off, g, mask, WIDTH: tl.constexpr):
    """The windows of group ``g``'s four channels at the read block ``rbase``, read at
    offset ``off``: per channel a uint64 whose fields 0-2 are its history (``[len(g)]``
    each). ``WIDTH`` 3: the group's 12 fields are three words (read at offset 0); 6: a pair
    of channels' 12 fields are three words, the offset a shift."""
    rp = (pool_ptr + rbase).to(tl.pointer_type(tl.uint64), bitcast=True) + WIDTH * g
    a = tl.load(rp, mask=mask, other=0, eviction_policy="evict_first")
    b = tl.load(rp + 1, mask=mask, other=0, eviction_policy="evict_first")
    c = tl.load(rp + 2, mask=mask, other=0, eviction_policy="evict_first")
    if WIDTH == 3:  # channel j in fields 3j .. 3j + 2 of a, b, c
        views = (a, (a >> 48) | (b << 16), (b >> 32) | (c << 32), c >> 16)
    else:  # channel j in fields 6j .. 6j + 5 of a, b, c, d, e, f
        d = tl.load(rp + 3, mask=mask, other=0, eviction_policy="evict_first")
        e = tl.load(rp + 4, mask=mask, other=0, eviction_policy="evict_first")
        f = tl.load(rp + 5, mask=mask, other=0, eviction_policy="evict_first")
        shift = (16 * off).to(tl.uint64)
        views = (_from(a, b & 0xFFFFFFFF, shift), _from((b >> 32) | (c << 32), c >> 32, shift),
                 _from(d, e & 0xFFFFFFFF, shift), _from((e >> 32) | (f << 32), f >> 32, shift))
    return views


@triton.jit
def _from(lo, hi, shift):
    """The fields from ``shift / 16`` on (``shift`` at most 48) of the 96-bit window
    ``hi:lo``, as a uint64."""
    return (lo >> shift) | ((hi << 1) << (63 - shift))  # (no shift by 64 at shift 0)


@triton.jit
def _new_fields(v, x):
    """A channel's new window's fields 0-2 (``[h1, h2, token]``) from its view ``v`` and
    its token's bits ``x`` (in the window's dtype)."""
    return ((v >> 16) & 0xFFFFFFFF) | (x << 32)


@triton.jit
def _store_windows(pool_ptr, wbase, g, n0, n1, n2, n3, mask, WIDTH: tl.constexpr):
    """Stores the four channels' new fields 0-2 (``n0 .. n3``) at the write block
    ``wbase``, streamed out: three words (``WIDTH`` 3), or a 4-byte and a 2-byte store a
    channel (6)."""
    base = pool_ptr + wbase
    if WIDTH == 3:
        wp = base.to(tl.pointer_type(tl.uint64), bitcast=True) + 3 * g
        tl.store(wp, n0 | (n1 << 48), mask=mask, cache_modifier=".cs")
        tl.store(wp + 1, (n1 >> 16) | (n2 << 32), mask=mask, cache_modifier=".cs")
        tl.store(wp + 2, (n2 >> 32) | (n3 << 16), mask=mask, cache_modifier=".cs")
    else:
        pairs = base.to(tl.pointer_type(tl.uint32), bitcast=True) + 12 * g  # 3 a channel
        last = base.to(tl.pointer_type(tl.uint16), bitcast=True) + 24 * g + 2  # 6 a channel
        _store_channel(pairs, last, n0, mask)
        _store_channel(pairs + 3, last + 6, n1, mask)
        _store_channel(pairs + 6, last + 12, n2, mask)
        _store_channel(pairs + 9, last + 18, n3, mask)


@triton.jit
def _store_channel(pairs, last, n, mask):
    """A channel's new fields 0-1 (4 bytes at ``pairs``) and 2 (at ``last``) from ``n``."""
    tl.store(pairs, (n & 0xFFFFFFFF).to(tl.uint32), mask=mask, cache_modifier=".cs")
    tl.store(last, ((n >> 32) & 0xFFFF).to(tl.uint16), mask=mask, cache_modifier=".cs")


@triton.jit
def _one_token_words(pool_ptr, x_ptr, weight_ptr, bias_ptr, y_ptr, rbase, off, has_hist,
                     t0, num_tokens, x_stride, fault, one, wbase, writes, first,
                     WIDTH: tl.constexpr, TILE_D: tl.constexpr, DIM: tl.constexpr,
                     X_ALIGN: tl.constexpr, SILU: tl.constexpr, UNBRANCHED: tl.constexpr):
    """:func:`.conv1d_one_token._one_token` for ``K = 4`` on a 2-byte DS pool of ``WIDTH``
    3 or 6 columns, ``DIM % 4 == 0``, 8-byte aligned blocks and rows of ``x``, taps packed,
    for the ``TILE_D`` channels from ``first``: the same loads, sums, masks and stores,
    four channels a lane. A lane stores only bytes of its own group, each after loading
    it where it reads that block (every stored word depends on the words it overwrites),
    so the window may be rewritten in place without a barrier."""
    g = first // 4 + tl.arange(0, TILE_D // 4)  # groups of four channels
    gm = g < DIM // 4
    pt: tl.constexpr = pool_ptr.dtype.element_ty
    # (off outside [0, W - K + 1] is no read: every shift in _views stays at most 48)
    v0, v1, v2, v3 = _views(pool_ptr, rbase, tl.where(has_hist, off, 0), g, gm & has_hist,
                            WIDTH)
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
    s0 = _sum(v0, x0, w_0, pt, wt, b0, SILU)
    s1 = _sum(v1, x1, w_1, pt, wt, b1, SILU)
    s2 = _sum(v2, x2, w_2, pt, wt, b2, SILU)
    s3 = _sum(v3, x3, w_3, pt, wt, b3, SILU)
    n0 = _new_fields(v0, _bits(x0.to(pt), pt))
    n1 = _new_fields(v1, _bits(x1.to(pt), pt))
    n2 = _new_fields(v2, _bits(x2.to(pt), pt))
    n3 = _new_fields(v3, _bits(x3.to(pt), pt))
    y_at = y_ptr + t0 * DIM
    if UNBRANCHED:
        gm = gm & one
        clean = fault == 0
        # a faulty row's y is 0 (not written where its cu_seqlens entries are bad)
        _quad_store(y_at, g, tl.where(clean, s0, 0), tl.where(clean, s1, 0),
                    tl.where(clean, s2, 0), tl.where(clean, s3, 0),
                    gm & (clean | ((fault & BAD_CU_SEQLENS) == 0)))
        _store_windows(pool_ptr, wbase, g, n0, n1, n2, n3, gm & writes & clean, WIDTH)
        return
    if fault == 0:
        _quad_store(y_at, g, s0, s1, s2, s3, gm)
        _store_windows(pool_ptr, wbase, g, n0, n1, n2, n3, gm & writes, WIDTH)
    elif (fault & BAD_CU_SEQLENS) == 0:  # a faulty row's y is 0
        zero = tl.zeros(g.shape, tl.float32)
        _quad_store(y_at, g, zero, zero, zero, zero, gm)


@triton.jit
def _sum(v, xv, taps, pt: tl.constexpr, wt: tl.constexpr, cb, SILU: tl.constexpr):
    """One channel's output (fp32) from its view (history in fields 0-2, dtype ``pt``),
    token, packed taps and bias: the one-token path's sum."""
    return _one_token_sum(_field(v, 0, pt), _field(v, 1, pt), _field(v, 2, pt), xv,
                          _tap(taps, 0, wt), _tap(taps, 1, wt), _tap(taps, 2, wt),
                          _tap(taps, 3, wt), cb.to(tl.float32), 4, SILU)

"""Prototype: the chunked gated delta rule's sequential, state-only chain with 64-token chunks,
fp32 state and fp32 products at a chosen ``tl.dot`` precision (tf32x3 / tf32 / ieee).

One row of ``T`` tokens (no varlen), ``HV`` value heads, grid ``(V // BV, HV)``. Per chunk
``i`` (tokens ``i BT .. i BT + BT - 1``), with ``S`` the state ``[K, V]`` at the chunk's start:

    h[i]   = S                                   (stored fp32, for a parallel output kernel)
    v_new  = u - w @ S                           ([BT, V]; stored fp32)
    S      = exp(g_last[i]) * S + kd^T @ v_new   (kd = k * exp(g_last - g), precomputed)

Inputs (fp32): ``w`` ``[T, HV, K]``, ``u`` ``[T, HV, V]``, ``kd`` ``[T, HV, K]``, ``g_last``
``[NT, HV]``, ``h0`` ``[HV, K, V]``. Outputs (fp32): ``h`` ``[NT, HV, K, V]`` (``VK``: ``[NT,
HV, V, K]``), ``v_new`` ``[T, HV, V]``, ``ht`` ``[HV, K, V]`` (``VK``: ``[HV, V, K]``).

Constexprs: ``BV`` value columns a program; ``SPLIT`` 1 (the state one ``[K, BV]`` tile) or 2
(two ``[K/2, BV]`` tiles, K split in halves); ``PREC`` the dot's input precision: Triton's
``"tf32x3"`` / ``"tf32"`` / ``"ieee"``, or ``"3x"``: TF32x3 written out here (each fp32
operand split into a TF32 ``big`` and the remainder by bit masks, ``RNA`` rounding ``big`` to
nearest else truncating, then three ``tf32`` dots, small terms first); ``PRESPLIT`` (with
``"3x"``): ``w`` and ``kd``, which do not depend on the state, come split already (``w_ptr``
/ ``kd_ptr`` the big parts, ``wlo_ptr`` / ``kdlo_ptr`` the remainders: a parallel kernel's
job), so the chain splits only the state and ``v_new``; ``VK`` the state held transposed in
registers (``[BV, K]`` tiles) instead of ``[K, BV]``. Every product accumulates into its
result (``v_new``'s ``w S`` over the K tiles; the decayed state for the update).
"""

import triton
import triton.language as tl


@triton.jit
def _rows(ptr, t, live, stride_t, cols):
    """``[BT, len(cols)]``: row ``t`` (token) elements ``cols`` of a token-major array."""
    return tl.load(ptr + t[:, None] * stride_t + cols[None, :], mask=live[:, None], other=0.0)


@triton.jit
def _split(x, RNA: tl.constexpr):
    """``x`` (fp32) as ``big + small`` exactly, ``big`` a TF32 value: its 10 leading mantissa
    bits rounded to nearest, ties away (``RNA``; no inf / NaN care), or truncated."""
    b = x.to(tl.int32, bitcast=True)
    if RNA:
        b = b + 0x1000
    big = (b & -8192).to(tl.float32, bitcast=True)  # -8192 = 0xFFFFE000
    return big, x - big


@triton.jit
def _mm(a, b, acc, PREC: tl.constexpr, RNA: tl.constexpr):
    """``acc + a @ b`` in fp32: Triton's own precision (``tf32x3`` / ``tf32`` / ``ieee``), or
    ``3x`` (``PREC == "3x"``): both split (:func:`_split`), three TF32 products, the small
    terms first."""
    if PREC == "3x":
        ab, as_ = _split(a, RNA)
        bb, bs = _split(b, RNA)
        acc = tl.dot(as_, bb, acc, input_precision="tf32")
        acc = tl.dot(ab, bs, acc, input_precision="tf32")
        return tl.dot(ab, bb, acc, input_precision="tf32")
    else:
        return tl.dot(a, b, acc, input_precision=PREC)


@triton.jit
def _mm_presplit(ab, as_, b, acc, RNA: tl.constexpr):
    """``acc + a @ b`` with ``a = ab + as_`` split beforehand (step 1) and ``b`` split here."""
    bb, bs = _split(b, RNA)
    acc = tl.dot(as_, bb, acc, input_precision="tf32")
    acc = tl.dot(ab, bs, acc, input_precision="tf32")
    return tl.dot(ab, bb, acc, input_precision="tf32")


@triton.jit
def _wS(w_row, wlo_row, t, live, HV: tl.constexpr, K: tl.constexpr, cols, s, acc,
        VK: tl.constexpr, PREC: tl.constexpr, RNA: tl.constexpr, PRESPLIT: tl.constexpr):
    """``acc + w[:, cols] @ S_tile`` (``S_tile`` ``[BK, BV]``, or ``[BV, BK]`` with ``VK``)."""
    w = _rows(w_row, t, live, HV * K, cols)
    st = tl.trans(s) if VK else s
    if PRESPLIT:
        return _mm_presplit(w, _rows(wlo_row, t, live, HV * K, cols), st, acc, RNA)
    else:
        return _mm(w, st, acc, PREC, RNA)


@triton.jit
def _update(s, eg, kd_row, kdlo_row, t, live, HV: tl.constexpr, K: tl.constexpr, cols, vn,
            VK: tl.constexpr, PREC: tl.constexpr, RNA: tl.constexpr, PRESPLIT: tl.constexpr):
    """The tile's next state ``exp(g_last) S + kd[:, cols]^T v_new`` in its layout, the
    decayed state the product's accumulator."""
    kd = _rows(kd_row, t, live, HV * K, cols)
    if PRESPLIT:
        kdlo = _rows(kdlo_row, t, live, HV * K, cols)
        if VK:  # S^T += v_new^T kd: v_new is the product's a, kd its b (already split)
            vb, vs = _split(tl.trans(vn), RNA)
            acc = tl.dot(vs, kd, s * eg, input_precision="tf32")
            acc = tl.dot(vb, kdlo, acc, input_precision="tf32")
            return tl.dot(vb, kd, acc, input_precision="tf32")
        else:
            return _mm_presplit(tl.trans(kd), tl.trans(kdlo), vn, s * eg, RNA)
    else:
        if VK:
            return _mm(tl.trans(vn), kd, s * eg, PREC, RNA)
        else:
            return _mm(tl.trans(kd), vn, s * eg, PREC, RNA)


@triton.jit
def chain64_kernel(w_ptr, u_ptr, kd_ptr, glast_ptr, h0_ptr, h_ptr, vnew_ptr, ht_ptr, T,
                   wlo_ptr, kdlo_ptr,
                   HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                   BV: tl.constexpr, SPLIT: tl.constexpr, PREC: tl.constexpr,
                   VK: tl.constexpr, RNA: tl.constexpr, PRESPLIT: tl.constexpr):
    """One program per (value columns ``i_v``, value head): the row's chunks in order.
    ``PRESPLIT`` (with ``PREC == "3x"``): ``w_ptr`` / ``kd_ptr`` hold the TF32 big parts and
    ``wlo_ptr`` / ``kdlo_ptr`` the remainders (``w = big + small``); else those two unused."""
    i_v = tl.program_id(0)
    i_hv = tl.program_id(1).to(tl.int64)
    BK: tl.constexpr = K // SPLIT
    kk = tl.arange(0, BK).to(tl.int64)
    vv = i_v * BV + tl.arange(0, BV).to(tl.int64)
    r = tl.arange(0, BT).to(tl.int64)
    # a state tile's offsets in a [K, V] (or, VK, [V, K]) matrix: the first K half, the second
    if VK:
        so1 = vv[:, None] * K + kk[None, :]
        so2 = vv[:, None] * K + (BK + kk)[None, :]
    else:
        so1 = kk[:, None] * V + vv[None, :]
        so2 = (BK + kk)[:, None] * V + vv[None, :]
    head = i_hv * K * V
    s1 = tl.load(h0_ptr + head + so1)
    if SPLIT == 2:
        s2 = tl.load(h0_ptr + head + so2)
    w_row = w_ptr + i_hv * K
    wlo_row = wlo_ptr + i_hv * K
    kd_row = kd_ptr + i_hv * K
    kdlo_row = kdlo_ptr + i_hv * K
    u_row = u_ptr + i_hv * V + vv
    vn_row = vnew_ptr + i_hv * V + vv
    NT = tl.cdiv(T, BT)
    for i in range(0, NT):
        t = i * BT + r
        live = t < T
        hb = h_ptr + (i * HV + i_hv) * K * V
        tl.store(hb + so1, s1)
        if SPLIT == 2:
            tl.store(hb + so2, s2)
        u = tl.load(u_row[None, :] + t[:, None] * (HV * V), mask=live[:, None], other=0.0)
        ws = _wS(w_row, wlo_row, t, live, HV, K, kk, s1, tl.zeros((BT, BV), tl.float32), VK,
                 PREC, RNA, PRESPLIT)
        if SPLIT == 2:
            ws = _wS(w_row, wlo_row, t, live, HV, K, BK + kk, s2, ws, VK, PREC, RNA, PRESPLIT)
        vn = u - ws
        tl.store(vn_row[None, :] + t[:, None] * (HV * V), vn, mask=live[:, None])
        eg = tl.exp(tl.load(glast_ptr + i * HV + i_hv))
        s1 = _update(s1, eg, kd_row, kdlo_row, t, live, HV, K, kk, vn, VK, PREC, RNA,
                     PRESPLIT)
        if SPLIT == 2:
            s2 = _update(s2, eg, kd_row, kdlo_row, t, live, HV, K, BK + kk, vn, VK, PREC,
                         RNA, PRESPLIT)
    tl.store(ht_ptr + head + so1, s1)
    if SPLIT == 2:
        tl.store(ht_ptr + head + so2, s2)

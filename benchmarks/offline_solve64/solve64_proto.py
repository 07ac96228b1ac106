"""Prototype: step 1 of the chunked gated delta rule with C-token chunks (C = 64 the target),
one program per (chunk, value head), grid (cdiv(T, C), HV). One row of T tokens (no varlen).

Inputs: q, k bf16 [T, H, K]; v bf16 [T, HV, V]; g (log decay) and beta fp32 [T, HV].
Outputs (fp32): W = (I + M)^-1 (beta exp(G) k) [T, HV, K], U0 = (I + M)^-1 (beta v)
[T, HV, V], with M[i, j] = beta_i (k_i . k_j) exp(D[i, j]) (j < i) within a chunk.
EXTRAS also writes what our step 1 writes besides (as kernels/gdn_chunked.py does):
chunk_g [T, HV] (g), chunk_q = exp(G) q scale [T, HV, K], chunk_k = exp(D[C-1, i]) k
[T, HV, K], chunk_a = tril(q k^T exp(D)) [T, HV, C].

SOLVE (how (I + M)^-1 is applied):
  "fwd"       forward substitution on the whole [C, C] (C - 1 dependent steps): ours today.
  "bd_horner" (TRANS: W^T = B_w^T X^T, U0^T likewise, X^T one operand in shared memory)
              the C/16 diagonal 16x16 blocks inverted together (15 steps on a [C/16, 16, 16]
              tensor), Dinv block diagonal [C, C]; P = Dinv L (L: the strictly block-lower
              part of N = I + M); X = Dinv; X = Dinv - P X (C/16 - 1 times) = N^-1; then
              W = X B_w, U0 = X B_u.
  "bd_fact"   as bd_horner, with N^-1 = (I - P)(I + P^2) Dinv (C = 64 only): 4 products,
              3 dependent.
  "bd_rhs"    as bd_horner but Horner on the right-hand sides (no N^-1): Y = Dinv B,
              Z = Y - P Z (C/16 - 1 times), for B_w and B_u separately.
  "blk"       16-token blocks as separate tiles (C = 64: four), fla-like structure (own
              code): M's ten blocks from [16, K] x [K, 16] products with per-block decays,
              the four diagonal blocks inverted in one 15-step loop (four independent
              16x16 substitutions a trip), the six off-diagonal inverse blocks by block
              forward substitution (16 [16,16]x[16,16] products), W_b = sum_c Ai_bc B_c.
  "blk_rhs"   as blk but block forward substitution on the right-hand sides:
              Y_b = Ai_bb (B_b - sum_{c<b} M_bc Y_c); no off-diagonal inverse blocks.
PREC: "tf32x3" (Triton's), "3x" (written out: big = (bits + 0x1000) & 0xFFFFE000, the exact
rest, three tf32 dots, small terms first), "ieee", "tf32".
"""

import triton
import triton.language as tl


# ---------------------------------------------------------------- products
@triton.jit
def _split(x):
    """fp32 ``x`` = ``big + small`` exactly; ``big`` its nearest TF32 value (ties away)."""
    b = x.to(tl.uint32, bitcast=True)
    big = ((b + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return big, x - big


@triton.jit
def _mma(a, b, acc, PREC: tl.constexpr):
    """``acc + a @ b`` in fp32 at PREC."""
    if PREC == "3x":
        ab, as_ = _split(a)
        bb, bs = _split(b)
        acc = tl.dot(as_, bb, acc, input_precision="tf32")
        acc = tl.dot(ab, bs, acc, input_precision="tf32")
        return tl.dot(ab, bb, acc, input_precision="tf32")
    else:
        return tl.dot(a, b, acc, input_precision=PREC)


@triton.jit
def _dot(a, b, PREC: tl.constexpr):
    return _mma(a, b, tl.zeros((a.shape[0], b.shape[1]), tl.float32), PREC)


# ---------------------------------------------------------------- loads, decays
@triton.jit
def _rows(ptr, t, live, stride_t, cols):
    return tl.load(ptr + t[:, None] * stride_t + cols[None, :], mask=live[:, None], other=0)


@triton.jit
def _normalised(x):
    return x / tl.sqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]


@triton.jit
def _decays(g, C: tl.constexpr):
    """G (inclusive cumsum) and exp(D) [C, C] (j <= i, else 0), D summed by itself."""
    r = tl.arange(0, C)
    G = tl.cumsum(g, axis=0)
    D = tl.cumsum(tl.where(r[:, None] > r[None, :], g[:, None], 0.0), axis=0)
    return G, tl.where(r[:, None] >= r[None, :], tl.exp(D), 0.0)


# ---------------------------------------------------------------- solves on [C, C]
@triton.jit
def _unit_lower_inverse(a, C: tl.constexpr):
    """(I + a)^-1 by forward substitution, C - 1 dependent steps (our kernel's)."""
    r = tl.arange(0, C)
    inv = (r[:, None] == r[None, :]).to(tl.float32)
    for i in range(1, C):
        a_i = tl.sum(tl.where(r[:, None] == i, a, 0.0), axis=0)
        row = tl.sum(a_i[:, None] * inv, axis=0)
        inv = tl.where(r[:, None] == i, inv - row[None, :], inv)
    return inv


@triton.jit
def _block_diag_inverse(m, C: tl.constexpr):
    """Dinv [C, C]: the inverse of I + (m's diagonal 16x16 blocks), the C/16 blocks
    inverted together: 15 steps, step i updating row i of every block."""
    NB: tl.constexpr = C // 16
    r = tl.arange(0, C)
    same = (r[:, None] // 16) == (r[None, :] // 16)
    a3 = tl.sum(tl.reshape(tl.where(same, m, 0.0), (NB, 16, NB, 16)), axis=2)  # [NB,16,16]
    ri = tl.arange(0, 16)
    sel_eye = (ri[:, None] == ri[None, :]).to(tl.float32)
    inv = tl.zeros((NB, 16, 16), tl.float32) + sel_eye[None, :, :]
    for i in range(1, 16):
        sel = (ri == i)[None, :, None]
        a_i = tl.sum(tl.where(sel, a3, 0.0), axis=1)  # [NB, 16]: a[block, i, :]
        row = tl.sum(a_i[:, :, None] * inv, axis=1)  # [NB, 16]
        inv = tl.where(sel, inv - row[:, None, :], inv)
    bi = tl.arange(0, NB)
    eye = (bi[:, None] == bi[None, :]).to(tl.float32)
    return tl.reshape(inv[:, :, None, :] * eye[:, None, :, None], (C, C))


# ---------------------------------------------------------------- 16-row blocks ("blk")
@triton.jit
def _blk_inputs(k_ptr, v_ptr, g_ptr, beta_ptr, c0, b: tl.constexpr, T, i_h, i_hv,
                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                L2NORM: tl.constexpr):
    ri = tl.arange(0, 16)
    t = c0 + b * 16 + ri
    live = t < T
    kk = tl.arange(0, K)
    vv = tl.arange(0, V)
    k = _rows(k_ptr + i_h * K, t, live, H * K, kk).to(tl.float32)
    if L2NORM:
        k = _normalised(k)
    v = _rows(v_ptr + i_hv * V, t, live, HV * V, vv).to(tl.float32)
    g = tl.load(g_ptr + t * HV + i_hv, mask=live, other=0.0)
    beta = tl.load(beta_ptr + t * HV + i_hv, mask=live, other=0.0)
    Gin = tl.cumsum(g, axis=0)  # within the block, inclusive
    Dd = tl.cumsum(tl.where(ri[:, None] > ri[None, :], g[:, None], 0.0), axis=0)
    R = tl.sum(tl.where(ri[:, None] > ri[None, :], g[:, None], 0.0), axis=0)  # g after j
    tot = tl.sum(g, axis=0)
    return k, v, beta, Gin, Dd, R, tot


@triton.jit
def _blk_diag(kb, k, Dd, PREC: tl.constexpr):
    ri = tl.arange(0, 16)
    return tl.where(ri[:, None] > ri[None, :], _dot(kb, tl.trans(k), PREC) * tl.exp(Dd), 0.0)


@triton.jit
def _blk_off(kb_b, Gin_b, k_c, R_c, mid, PREC: tl.constexpr):
    """M_bc (b > c): beta_i k_i . k_j exp(Gin_b[i] + mid + R_c[j]) (a sum of same-sign
    partial sums: no cancellation)."""
    return _dot(kb_b, tl.trans(k_c), PREC) * tl.exp((Gin_b[:, None] + mid) + R_c[None, :])


@triton.jit
def _inv_step(a, inv, i):
    ri = tl.arange(0, 16)
    sel = ri[:, None] == i
    a_i = tl.sum(tl.where(sel, a, 0.0), axis=0)
    row = tl.sum(a_i[:, None] * inv, axis=0)
    return tl.where(sel, inv - row[None, :], inv)


@triton.jit
def _store_rows(ptr, c0, b: tl.constexpr, T, stride_t, cols, x):
    t = c0 + b * 16 + tl.arange(0, 16)
    tl.store(ptr + t[:, None] * stride_t + cols[None, :], x, mask=(t < T)[:, None])


@triton.jit
def _solve_blk(k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, c0, T, i_h, i_hv,
               H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               L2NORM: tl.constexpr, PREC: tl.constexpr, RHS: tl.constexpr):
    k0, v0, be0, Gi0, Dd0, R0, t0 = _blk_inputs(k_ptr, v_ptr, g_ptr, beta_ptr, c0, 0, T,
                                                i_h, i_hv, H, HV, K, V, L2NORM)
    k1, v1, be1, Gi1, Dd1, R1, t1 = _blk_inputs(k_ptr, v_ptr, g_ptr, beta_ptr, c0, 1, T,
                                                i_h, i_hv, H, HV, K, V, L2NORM)
    k2, v2, be2, Gi2, Dd2, R2, t2 = _blk_inputs(k_ptr, v_ptr, g_ptr, beta_ptr, c0, 2, T,
                                                i_h, i_hv, H, HV, K, V, L2NORM)
    k3, v3, be3, Gi3, Dd3, R3, t3 = _blk_inputs(k_ptr, v_ptr, g_ptr, beta_ptr, c0, 3, T,
                                                i_h, i_hv, H, HV, K, V, L2NORM)
    kb0 = k0 * be0[:, None]
    kb1 = k1 * be1[:, None]
    kb2 = k2 * be2[:, None]
    kb3 = k3 * be3[:, None]
    # right-hand sides: G = (totals of the blocks before) + Gin
    bw0 = kb0 * tl.exp(Gi0)[:, None]
    bw1 = kb1 * tl.exp(t0 + Gi1)[:, None]
    bw2 = kb2 * tl.exp((t0 + t1) + Gi2)[:, None]
    bw3 = kb3 * tl.exp((t0 + t1 + t2) + Gi3)[:, None]
    bu0 = v0 * be0[:, None]
    bu1 = v1 * be1[:, None]
    bu2 = v2 * be2[:, None]
    bu3 = v3 * be3[:, None]
    # M's blocks
    m00 = _blk_diag(kb0, k0, Dd0, PREC)
    m11 = _blk_diag(kb1, k1, Dd1, PREC)
    m22 = _blk_diag(kb2, k2, Dd2, PREC)
    m33 = _blk_diag(kb3, k3, Dd3, PREC)
    m10 = _blk_off(kb1, Gi1, k0, R0, 0.0, PREC)
    m21 = _blk_off(kb2, Gi2, k1, R1, 0.0, PREC)
    m32 = _blk_off(kb3, Gi3, k2, R2, 0.0, PREC)
    m20 = _blk_off(kb2, Gi2, k0, R0, t1, PREC)
    m31 = _blk_off(kb3, Gi3, k1, R1, t2, PREC)
    m30 = _blk_off(kb3, Gi3, k0, R0, t1 + t2, PREC)
    # the four diagonal inverses, one loop
    ri = tl.arange(0, 16)
    eye = (ri[:, None] == ri[None, :]).to(tl.float32)
    a0 = eye
    a1 = eye
    a2 = eye
    a3 = eye
    for i in range(1, 16):
        a0 = _inv_step(m00, a0, i)
        a1 = _inv_step(m11, a1, i)
        a2 = _inv_step(m22, a2, i)
        a3 = _inv_step(m33, a3, i)
    kk = tl.arange(0, K)
    vv = tl.arange(0, V)
    wrow = w_ptr + i_hv * K
    urow = u_ptr + i_hv * V
    if RHS:
        # block forward substitution on B_w and B_u
        y0 = _dot(a0, bw0, PREC)
        z0 = _dot(a0, bu0, PREC)
        y1 = _dot(a1, _mma(-m10, y0, bw1, PREC), PREC)
        z1 = _dot(a1, _mma(-m10, z0, bu1, PREC), PREC)
        y2 = _dot(a2, _mma(-m21, y1, _mma(-m20, y0, bw2, PREC), PREC), PREC)
        z2 = _dot(a2, _mma(-m21, z1, _mma(-m20, z0, bu2, PREC), PREC), PREC)
        y3 = _dot(a3, _mma(-m32, y2, _mma(-m31, y1, _mma(-m30, y0, bw3, PREC), PREC), PREC),
                  PREC)
        z3 = _dot(a3, _mma(-m32, z2, _mma(-m31, z1, _mma(-m30, z0, bu3, PREC), PREC), PREC),
                  PREC)
    else:
        # off-diagonal inverse blocks: Ai_bc = -Ai_bb sum_{c<=l<b} M_bl Ai_lc
        a10 = -_dot(a1, _dot(m10, a0, PREC), PREC)
        a21 = -_dot(a2, _dot(m21, a1, PREC), PREC)
        a32 = -_dot(a3, _dot(m32, a2, PREC), PREC)
        a20 = -_dot(a2, _mma(m21, a10, _dot(m20, a0, PREC), PREC), PREC)
        a31 = -_dot(a3, _mma(m32, a21, _dot(m31, a1, PREC), PREC), PREC)
        a30 = -_dot(a3, _mma(m32, a20, _mma(m31, a10, _dot(m30, a0, PREC), PREC), PREC), PREC)
        y0 = _dot(a0, bw0, PREC)
        z0 = _dot(a0, bu0, PREC)
        y1 = _mma(a10, bw0, _dot(a1, bw1, PREC), PREC)
        z1 = _mma(a10, bu0, _dot(a1, bu1, PREC), PREC)
        y2 = _mma(a20, bw0, _mma(a21, bw1, _dot(a2, bw2, PREC), PREC), PREC)
        z2 = _mma(a20, bu0, _mma(a21, bu1, _dot(a2, bu2, PREC), PREC), PREC)
        y3 = _mma(a30, bw0, _mma(a31, bw1, _mma(a32, bw2, _dot(a3, bw3, PREC), PREC), PREC),
                  PREC)
        z3 = _mma(a30, bu0, _mma(a31, bu1, _mma(a32, bu2, _dot(a3, bu3, PREC), PREC), PREC),
                  PREC)
    _store_rows(wrow, c0, 0, T, HV * K, kk, y0)
    _store_rows(wrow, c0, 1, T, HV * K, kk, y1)
    _store_rows(wrow, c0, 2, T, HV * K, kk, y2)
    _store_rows(wrow, c0, 3, T, HV * K, kk, y3)
    _store_rows(urow, c0, 0, T, HV * V, vv, z0)
    _store_rows(urow, c0, 1, T, HV * V, vv, z1)
    _store_rows(urow, c0, 2, T, HV * V, vv, z2)
    _store_rows(urow, c0, 3, T, HV * V, vv, z3)


# ---------------------------------------------------------------- the kernel
@triton.jit
def step1_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, cg_ptr, cq_ptr, ck_ptr,
                 ca_ptr, T, scale,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 C: tl.constexpr, SOLVE: tl.constexpr, PREC: tl.constexpr,
                 L2NORM: tl.constexpr, EXTRAS: tl.constexpr, TRANS: tl.constexpr = False):
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // (HV // H)
    c0 = i_c * C
    r = tl.arange(0, C)
    t = c0 + r
    live = t < T
    kk = tl.arange(0, K)
    vv = tl.arange(0, V)
    kmask2 = live[:, None]
    if EXTRAS or SOLVE != "blk" and SOLVE != "blk_rhs":
        k = _rows(k_ptr + i_h * K, t, live, H * K, kk).to(tl.float32)
        g = tl.load(g_ptr + t * HV + i_hv, mask=live, other=0.0)
        if L2NORM:
            k = _normalised(k)
        G, decay = _decays(g, C)
        if EXTRAS:  # the terms our step 1 also writes (stored first, as ours does)
            q = _rows(q_ptr + i_h * K, t, live, H * K, kk).to(tl.float32)
            if L2NORM:
                q = _normalised(q)
            q = q * scale
            th = t * HV + i_hv
            a = tl.where(r[:, None] >= r[None, :], _dot(q, tl.trans(k), PREC) * decay, 0.0)
            tl.store(ca_ptr + th[:, None] * C + r[None, :], a, mask=kmask2)
            tl.store(cq_ptr + th[:, None] * K + kk[None, :], q * tl.exp(G)[:, None],
                     mask=kmask2)
            last = tl.sum(tl.where(r[:, None] == C - 1, decay, 0.0), axis=0)
            tl.store(ck_ptr + th[:, None] * K + kk[None, :], k * last[:, None], mask=kmask2)
            tl.store(cg_ptr + th, g, mask=live)
    if SOLVE == "blk":
        _solve_blk(k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, c0, T, i_h, i_hv, H, HV, K,
                   V, L2NORM, PREC, False)
    elif SOLVE == "blk_rhs":
        _solve_blk(k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, c0, T, i_h, i_hv, H, HV, K,
                   V, L2NORM, PREC, True)
    else:
        v = _rows(v_ptr + i_hv * V, t, live, HV * V, vv).to(tl.float32)
        beta = tl.load(beta_ptr + t * HV + i_hv, mask=live, other=0.0)
        kb = k * beta[:, None]
        m = tl.where(r[:, None] > r[None, :], _dot(kb, tl.trans(k), PREC) * decay, 0.0)
        bw = kb * tl.exp(G)[:, None]
        bu = v * beta[:, None]
        if SOLVE == "fwd":
            x = _unit_lower_inverse(m, C)
            w = _dot(x, bw, PREC)
            u = _dot(x, bu, PREC)
        else:
            NB: tl.constexpr = C // 16
            dinv = _block_diag_inverse(m, C)
            lower = tl.where((r[:, None] // 16) > (r[None, :] // 16), m, 0.0)
            p = _dot(dinv, lower, PREC)  # strictly block lower, P^NB = 0
            if SOLVE == "bd_horner":
                x = dinv
                for _s in tl.static_range(NB - 1):
                    x = _mma(-p, x, dinv, PREC)
                if TRANS:  # W^T = B_w^T X^T: X^T the shared (smem) operand of both
                    xt = tl.trans(x)
                    wt = _dot(tl.trans(bw), xt, PREC)
                    th = t * HV + i_hv
                    tl.store(w_ptr + th[None, :] * K + kk[:, None], wt, mask=live[None, :])
                    ut = _dot(tl.trans(bu), xt, PREC)
                    tl.store(u_ptr + th[None, :] * V + vv[:, None], ut, mask=live[None, :])
                else:
                    w = _dot(x, bw, PREC)
                    u = _dot(x, bu, PREC)
            elif SOLVE == "bd_fact":  # (I - P)(I + P^2) Dinv, exact for NB <= 4
                p2 = _dot(p, p, PREC)
                y = _mma(-p, dinv, dinv, PREC)
                x = _mma(p2, y, y, PREC)
                w = _dot(x, bw, PREC)
                u = _dot(x, bu, PREC)
            else:  # "bd_rhs"
                yw = _dot(dinv, bw, PREC)
                yu = _dot(dinv, bu, PREC)
                w = yw
                u = yu
                for _s in tl.static_range(NB - 1):
                    w = _mma(-p, w, yw, PREC)
                    u = _mma(-p, u, yu, PREC)
        if not TRANS:
            th = t * HV + i_hv
            tl.store(w_ptr + th[:, None] * K + kk[None, :], w, mask=kmask2)
            tl.store(u_ptr + th[:, None] * V + vv[None, :], u, mask=kmask2)


# ---------------------------------------------------------------- K and V in 64-wide halves
@triton.jit
def step1_halves_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, cg_ptr, cq_ptr,
                        ck_ptr, ca_ptr, T, scale,
                        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                        C: tl.constexpr, SOLVE: tl.constexpr, PREC: tl.constexpr,
                        L2NORM: tl.constexpr, EXTRAS: tl.constexpr):
    """step1_kernel's "bd_horner" / "bd_fact" with every [C, 128] operand held as two
    [C, 64] halves (K = V = 128), so that no product stages a [C, 128] fp32 operand (and
    its TF32x3 parts) in shared memory: kb k^T = kb_0 k_0^T + kb_1 k_1^T, W = [X B_w0,
    X B_w1], U0 likewise."""
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // (HV // H)
    c0 = i_c * C
    r = tl.arange(0, C)
    t = c0 + r
    live = t < T
    HK: tl.constexpr = K // 2
    HVV: tl.constexpr = V // 2
    kk = tl.arange(0, HK)
    vv = tl.arange(0, HVV)
    krow = k_ptr + i_h * K
    k0 = _rows(krow, t, live, H * K, kk).to(tl.float32)
    k1 = _rows(krow + HK, t, live, H * K, kk).to(tl.float32)
    g = tl.load(g_ptr + t * HV + i_hv, mask=live, other=0.0)
    if L2NORM:
        nk = tl.sqrt(tl.sum(k0 * k0, axis=1) + tl.sum(k1 * k1, axis=1) + 1e-6)[:, None]
        k0 = k0 / nk
        k1 = k1 / nk
    G, decay = _decays(g, C)
    th = t * HV + i_hv
    if EXTRAS:
        qrow = q_ptr + i_h * K
        q0 = _rows(qrow, t, live, H * K, kk).to(tl.float32)
        q1 = _rows(qrow + HK, t, live, H * K, kk).to(tl.float32)
        if L2NORM:
            nq = tl.sqrt(tl.sum(q0 * q0, axis=1) + tl.sum(q1 * q1, axis=1) + 1e-6)[:, None]
            q0 = q0 / nq
            q1 = q1 / nq
        q0 = q0 * scale
        q1 = q1 * scale
        qk = _mma(q1, tl.trans(k1), _dot(q0, tl.trans(k0), PREC), PREC)
        a = tl.where(r[:, None] >= r[None, :], qk * decay, 0.0)
        tl.store(ca_ptr + th[:, None] * C + r[None, :], a, mask=live[:, None])
        eG = tl.exp(G)[:, None]
        tl.store(cq_ptr + th[:, None] * K + kk[None, :], q0 * eG, mask=live[:, None])
        tl.store(cq_ptr + th[:, None] * K + HK + kk[None, :], q1 * eG, mask=live[:, None])
        last = tl.sum(tl.where(r[:, None] == C - 1, decay, 0.0), axis=0)[:, None]
        tl.store(ck_ptr + th[:, None] * K + kk[None, :], k0 * last, mask=live[:, None])
        tl.store(ck_ptr + th[:, None] * K + HK + kk[None, :], k1 * last, mask=live[:, None])
        tl.store(cg_ptr + th, g, mask=live)
    beta = tl.load(beta_ptr + t * HV + i_hv, mask=live, other=0.0)
    kb0 = k0 * beta[:, None]
    kb1 = k1 * beta[:, None]
    kk_ = _mma(kb1, tl.trans(k1), _dot(kb0, tl.trans(k0), PREC), PREC)
    m = tl.where(r[:, None] > r[None, :], kk_ * decay, 0.0)
    NB: tl.constexpr = C // 16
    dinv = _block_diag_inverse(m, C)
    lower = tl.where((r[:, None] // 16) > (r[None, :] // 16), m, 0.0)
    p = _dot(dinv, lower, PREC)
    if SOLVE == "bd_fact":
        p2 = _dot(p, p, PREC)
        y = _mma(-p, dinv, dinv, PREC)
        x = _mma(p2, y, y, PREC)
    else:
        x = dinv
        for _s in tl.static_range(NB - 1):
            x = _mma(-p, x, dinv, PREC)
    eG = tl.exp(G)[:, None]
    w0 = _dot(x, kb0 * eG, PREC)
    tl.store(w_ptr + th[:, None] * K + kk[None, :], w0, mask=live[:, None])
    w1 = _dot(x, kb1 * eG, PREC)
    tl.store(w_ptr + th[:, None] * K + HK + kk[None, :], w1, mask=live[:, None])
    vrow = v_ptr + i_hv * V
    v0 = _rows(vrow, t, live, HV * V, vv).to(tl.float32)
    u0 = _dot(x, v0 * beta[:, None], PREC)
    tl.store(u_ptr + th[:, None] * V + vv[None, :], u0, mask=live[:, None])
    v1 = _rows(vrow + HVV, t, live, HV * V, vv).to(tl.float32)
    u1 = _dot(x, v1 * beta[:, None], PREC)
    tl.store(u_ptr + th[:, None] * V + HVV + vv[None, :], u1, mask=live[:, None])

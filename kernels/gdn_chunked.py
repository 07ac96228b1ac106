"""The gated delta rule of docs/semantics.md §4 by chunks of ``CHUNK`` tokens, for prefill
rows: the same rows, read and write blocks, spec candidates and faults as :mod:`.gdn`, with a
row's tokens taken ``CHUNK`` at a time as matrix products, in three launches (the plan's
``before`` stage, the recurrence, its ``after`` stage):

1. :func:`gdn_chunk_prepare_kernel` (or ``..._fused_gates_kernel``): the chunks of every
   row and value head in parallel (``SPLIT`` programs a row and head, each taking every
   ``SPLIT``-th chunk). Their triangular solves leave the recurrence's inputs as fp32
   scratch indexed like the tokens: the log decays ``chunk_g`` ``[T, HV]``, ``chunk_w``
   ``[T, HV, K]``, ``chunk_u`` ``[T, HV, V]`` and ``chunk_k`` (``exp(D[C-1, i]) k_i``)
   ``[T, HV, K]``.
2. :func:`gated_delta_rule_chunked_kernel`: one program per (row, value head, ``BV`` value
   columns), the token-by-token kernel's grid, walking its row's chunks in order. It
   computes the first chunk's output from the state it loaded, then only the state: per
   chunk ``U = U0 - W S0`` and the update, storing the state each later chunk starts from
   to ``chunk_h`` (fp32 ``[cdiv(T, CHUNK), HV, K, V]``, at slot ``first token // CHUNK``:
   a later chunk's first token has ``CHUNK`` tokens of its own row before it, so no two
   such chunks share a slot) and the row to ``chunk_row`` (int32 ``[cdiv(T, CHUNK)]``). A
   spec row also stores the state after each candidate.
3. :func:`gated_delta_rule_chunk_output_kernel`: the output of every later chunk in
   parallel, one program per (slot, value head, ``OUT_BV`` value columns), from
   ``chunk_h`` and step 1's scratch.

Within a chunk of tokens ``0 .. C-1`` (``q`` scaled and, with l2norm, ``q`` and ``k``
normalised), with ``G_i = g_0 + ... + g_i`` (the log decays), ``D[i, j] = g_(j+1) + ... +
g_i`` and ``S0`` the state ``[K, V]`` at the chunk's start, the delta rule's per-token
corrections ``U`` ``[C, V]`` solve the unit lower triangular system
``(I + M) U = beta * v - (beta * exp(G) * k) S0`` with
``M[i, j] = beta_i (k_i . k_j) exp(D[i, j])`` for ``j < i``. So ``U = U0 - W S0`` with
``U0 = (I + M)^-1 (beta * v)`` and ``W = (I + M)^-1 (beta * exp(G) * k)``, which do not
depend on the state (step 1). Then:

- ``o_i = exp(G_i) q_i S0 + sum_{j <= i} exp(D[i, j]) (q_i . k_j) U_j``;
- the state after token ``i``: ``exp(G_i) S0 + sum_{j <= i} exp(D[i, j]) k_j U_j^T``
  (every candidate of a spec row; the last token's for the next chunk).

``(I + M)^-1`` is blocked: the four diagonal 16-token blocks of ``I + M`` (``B``) are
inverted together by forward substitution (15 dependent steps), then ``(I + M)^-1 =
(I - P + P^2 - P^3) B^-1`` with ``P = B^-1 L`` (``L`` the blocks below the diagonal;
``P^4 = 0``), by Horner's rule. The products are fp32 at ``recurrent.DOT_PRECISION``, with
every ``[C, K]`` operand held as two halves of columns, so the rounding is the
recurrence's order of magnitude, not its bits (the algorithms sum in different orders). A
chunk's arithmetic depends on its own tokens only, never on which program took it or on
the batch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .jit import same_binary_jit
from .plan import LaunchPlan, Output, cdiv, io_align, next_pow2
from .recurrent import chunk_advance, chunk_decays, chunk_dot, chunk_mma, clear_faulty_row, \
    decay_gates, head_offset, head_program, recurrent_fault, recurrent_row, store_final_state
from .rows import aligned_base, flag_row, range_fault

CHUNK = 64  # tokens per chunk (fixed: batch invariance)
BLOCK = tl.constexpr(16)  # tokens per diagonal block of the solve
BV = 32  # value columns per program of step 2 (at least 16: tl.dot)
OUT_BV = 64  # value columns per program of step 3
NUM_WARPS = 4  # step 2
OUT_WARPS = 8  # step 3
PREPARE_WARPS = 4  # step 1
#: every step's software-pipelining depth (Triton's num_stages): Triton's default of 3
#: makes step 2's loop 1.6x longer and spill (benchmarks/README.md, "Chunks of 64 tokens")
NUM_STAGES = 1
#: step 1's programs per (row, value head) at most; each takes every SPLIT-th chunk
MAX_SPLIT = 64
#: the fp32 scratch step 1 writes and steps 2 and 3 read
SCRATCH = ("chunk_g", "chunk_w", "chunk_u", "chunk_k")


@triton.jit
def _chunk_rows(ptr, head, t, stride_t, live, cols, colmask, ALIGN: tl.constexpr):
    """``[CHUNK, len(cols)]``: the tokens ``t``'s (``[CHUNK]``) elements at ``head + cols``
    of an array with token stride ``stride_t``, zero where ``live`` is false."""
    rows = aligned_base(head, t, stride_t, ALIGN)
    return tl.load(ptr + rows[:, None] + cols[None, :], mask=live[:, None] & colmask[None, :],
                   other=0)


@triton.jit
def _halves(ptr, head, t, stride_t, live, N: tl.constexpr, HALF: tl.constexpr,
            ALIGN: tl.constexpr):
    """The tokens ``t``'s ``N`` elements at ``head`` as two fp32 ``[CHUNK, HALF]`` tiles,
    columns ``[0, HALF)`` and ``[HALF, 2 HALF)`` (zero past ``N`` and where ``live`` is
    false)."""
    c = tl.arange(0, HALF).to(tl.int64)
    x0 = _chunk_rows(ptr, head, t, stride_t, live, c, c < N, ALIGN).to(tl.float32)
    x1 = _chunk_rows(ptr, head, t, stride_t, live, HALF + c, HALF + c < N, ALIGN)
    return x0, x1.to(tl.float32)


@triton.jit
def _qk_halves(ptr, qk_head, t, live, qk_stride_t, K: tl.constexpr, HK: tl.constexpr,
               L2NORM: tl.constexpr, QK_ALIGN: tl.constexpr):
    """``q`` or ``k`` of the tokens ``t`` as :func:`_halves`, rows scaled to unit length
    with ``L2NORM``."""
    x0, x1 = _halves(ptr, qk_head, t, qk_stride_t, live, K, HK, QK_ALIGN)
    if L2NORM:
        norm = tl.sqrt(tl.sum(x0 * x0, axis=1) + tl.sum(x1 * x1, axis=1) + 1e-6)[:, None]
        x0, x1 = x0 / norm, x1 / norm
    return x0, x1


@triton.jit
def _rows_of(ptr, first, i_hv, n_live, cols, N: tl.constexpr, HV: tl.constexpr,
             CHUNK: tl.constexpr):
    """Pointers and mask of ``[CHUNK, len(cols)]`` elements of a contiguous ``[T, HV, N]``
    array (the scratch, ``o``): tokens ``first ..`` (the first ``n_live``), head ``i_hv``,
    columns ``cols`` (int32). One 64-bit base and 32-bit offsets, which no loop holds (the
    plan keeps ``CHUNK * HV * N`` below 2^31)."""
    r = tl.arange(0, CHUNK)
    base = ptr + (first * HV + i_hv) * N
    return base + (r[:, None] * (HV * N) + cols[None, :]), \
        (r < n_live)[:, None] & (cols < N)[None, :]


@triton.jit
def _scratch_halves(ptr, first, i_hv, n_live, N: tl.constexpr, HALF: tl.constexpr,
                    HV: tl.constexpr, CHUNK: tl.constexpr):
    """:func:`_rows_of`'s rows as two fp32 ``[CHUNK, HALF]`` tiles, columns ``[0, HALF)``
    and ``[HALF, 2 HALF)`` (zero past ``N`` and past ``n_live``)."""
    c = tl.arange(0, HALF)
    p0, m0 = _rows_of(ptr, first, i_hv, n_live, c, N, HV, CHUNK)
    p1, m1 = _rows_of(ptr, first, i_hv, n_live, HALF + c, N, HV, CHUNK)
    return tl.load(p0, mask=m0, other=0), tl.load(p1, mask=m1, other=0)


@triton.jit
def _store_scratch_halves(ptr, first, i_hv, n_live, x0, x1, N: tl.constexpr,
                          HALF: tl.constexpr, HV: tl.constexpr, CHUNK: tl.constexpr):
    """Two ``[CHUNK, HALF]`` tiles to :func:`_rows_of`'s rows."""
    c = tl.arange(0, HALF)
    p0, m0 = _rows_of(ptr, first, i_hv, n_live, c, N, HV, CHUNK)
    tl.store(p0, x0, mask=m0)
    p1, m1 = _rows_of(ptr, first, i_hv, n_live, HALF + c, N, HV, CHUNK)
    tl.store(p1, x1, mask=m1)


@triton.jit
def _unit_lower_inverse(m, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """``(I + m)^-1`` for a strictly lower triangular ``m`` ``[CHUNK, CHUNK]`` (the
    module's docstring): the diagonal ``BLOCK`` x ``BLOCK`` blocks by forward substitution,
    all at once (step ``i`` forms row ``i`` of each: ``e_i - m[i, :] @ inv`` over the rows
    above it), then Horner's rule over the blocks below the diagonal. Zero rows of ``m``
    (tokens past the row) keep ``e_i`` as their inverse rows."""
    NB: tl.constexpr = CHUNK // BLOCK
    r = tl.arange(0, CHUNK)
    same = (r[:, None] // BLOCK) == (r[None, :] // BLOCK)
    # the diagonal blocks as [NB, BLOCK, BLOCK]
    diag = tl.sum(tl.reshape(tl.where(same, m, 0.0), (NB, BLOCK, NB, BLOCK)), axis=2)
    rb = tl.arange(0, BLOCK)
    inv = tl.zeros((NB, BLOCK, BLOCK), tl.float32) + (rb[:, None] == rb[None, :]).to(
        tl.float32)[None, :, :]
    for i in range(1, BLOCK):
        sel = (rb == i)[None, :, None]
        m_i = tl.sum(tl.where(sel, diag, 0.0), axis=1)  # [NB, BLOCK]: row i of each block
        row = tl.sum(m_i[:, :, None] * inv, axis=1)
        inv = tl.where(sel, inv - row[:, None, :], inv)
    nb = tl.arange(0, NB)
    blocks = (nb[:, None] == nb[None, :]).to(tl.float32)
    dinv = tl.reshape(inv[:, :, None, :] * blocks[:, None, :, None], (CHUNK, CHUNK))
    p = chunk_dot(dinv, tl.where((r[:, None] // BLOCK) > (r[None, :] // BLOCK), m, 0.0))
    x = dinv
    for _ in tl.static_range(NB - 1):  # x = dinv - p x, so x = (I - p + p^2 - ...) dinv
        x = chunk_mma(-p, x, dinv)
    return x


@triton.jit
def _prepare(q_ptr, k_ptr, v_ptr, gate_a_ptr, gate_b_ptr, A_log_ptr, dt_bias_ptr,
             cu_seqlens_ptr, num_tokens, qk_stride_t, qk_stride_h, v_stride_t, v_stride_h,
             gate_stride, chunk_g_ptr, chunk_w_ptr, chunk_u_ptr, chunk_k_ptr, K: tl.constexpr,
             V: tl.constexpr, BK: tl.constexpr, BVF: tl.constexpr, FUSED_GATES: tl.constexpr,
             L2NORM: tl.constexpr, QK_ALIGN: tl.constexpr, V_ALIGN: tl.constexpr,
             HV: tl.constexpr, GROUP: tl.constexpr, CHUNK: tl.constexpr, SPLIT: tl.constexpr):
    """Step 1 (the module's docstring): one program per (row, value head, one of ``SPLIT``),
    which takes the row's chunks ``i_split, i_split + SPLIT, ...``. A row whose own
    ``cu_seqlens`` entries are bad is left alone (step 2 flags it); other faults do not
    matter here: the later steps read nothing of a row they skip."""
    row, i_hv, i_split = head_program(HV, SPLIT)
    t0 = tl.load(cu_seqlens_ptr + row).to(tl.int64)
    t1 = tl.load(cu_seqlens_ptr + row + 1).to(tl.int64)
    n = t1 - t0
    if range_fault(t0, t1, num_tokens) == 0:
        HK: tl.constexpr = BK // 2
        A = 0.0  # the decay rate, exp(A_log)
        dt_bias = 0.0
        if FUSED_GATES:
            A = tl.exp(tl.load(A_log_ptr + i_hv).to(tl.float32))
            dt_bias = tl.load(dt_bias_ptr + i_hv).to(tl.float32)
        r = tl.arange(0, CHUNK)
        k_head = (i_hv // GROUP) * qk_stride_h
        for c in range(i_split * CHUNK, n, SPLIT * CHUNK):
            t = t0 + c + r.to(tl.int64)
            live = c + r < n
            k0, k1 = _qk_halves(k_ptr, k_head, t, live, qk_stride_t, K, HK, L2NORM, QK_ALIGN)
            ga = tl.load(gate_a_ptr + t * gate_stride + i_hv, mask=live, other=0)
            gb = tl.load(gate_b_ptr + t * gate_stride + i_hv, mask=live, other=0)
            g, beta = decay_gates(ga, gb, A, dt_bias, FUSED_GATES)
            g, beta = tl.where(live, g, 0.0), tl.where(live, beta, 0.0)  # none past the row
            G, decay = chunk_decays(g, CHUNK)
            first, n_live = t0 + c, tl.minimum(CHUNK, n - c)
            tl.store(chunk_g_ptr + first * HV + i_hv + r * HV, g, mask=live)
            last = tl.sum(tl.where(r[:, None] == CHUNK - 1, decay, 0.0), axis=0)[:, None]
            _store_scratch_halves(chunk_k_ptr, first, i_hv, n_live, k0 * last, k1 * last, K, HK,
                                  HV, CHUNK)
            kb0, kb1 = k0 * beta[:, None], k1 * beta[:, None]
            kk = chunk_mma(kb1, tl.trans(k1), chunk_dot(kb0, tl.trans(k0)))
            x = _unit_lower_inverse(tl.where(r[:, None] > r[None, :], kk * decay, 0.0), CHUNK,
                                    BLOCK)
            eG = tl.exp(G)[:, None]
            _store_scratch_halves(chunk_w_ptr, first, i_hv, n_live, chunk_dot(x, kb0 * eG),
                                  chunk_dot(x, kb1 * eG), K, HK, HV, CHUNK)
            HVF: tl.constexpr = BVF // 2
            v0, v1 = _halves(v_ptr, i_hv * v_stride_h, t, v_stride_t, live, V, HVF, V_ALIGN)
            _store_scratch_halves(chunk_u_ptr, first, i_hv, n_live, chunk_dot(x, v0 * beta[:, None]),
                                  chunk_dot(x, v1 * beta[:, None]), V, HVF, HV, CHUNK)


# Step 1's kernels, one per op, each naming its parameters as the op's arrays (the ABI)
def gdn_chunk_prepare_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, cu_seqlens_ptr,
                             num_tokens, qk_stride_t, qk_stride_h, v_stride_t, v_stride_h,
                             gate_stride, chunk_g_ptr, chunk_w_ptr, chunk_u_ptr, chunk_k_ptr,
                             K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                             BVF: tl.constexpr, L2NORM: tl.constexpr, QK_ALIGN: tl.constexpr,
                             V_ALIGN: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr,
                             CHUNK: tl.constexpr, SPLIT: tl.constexpr):
    _prepare(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, g_ptr, g_ptr, cu_seqlens_ptr, num_tokens,
             qk_stride_t, qk_stride_h, v_stride_t, v_stride_h, gate_stride, chunk_g_ptr,
             chunk_w_ptr, chunk_u_ptr, chunk_k_ptr, K, V, BK, BVF, False, L2NORM, QK_ALIGN,
             V_ALIGN, HV, GROUP, CHUNK, SPLIT)


def gdn_chunk_prepare_fused_gates_kernel(
        q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, cu_seqlens_ptr,
        num_tokens, qk_stride_t, qk_stride_h, v_stride_t, v_stride_h, gate_stride,
        chunk_g_ptr, chunk_w_ptr, chunk_u_ptr, chunk_k_ptr, K: tl.constexpr, V: tl.constexpr,
        BK: tl.constexpr, BVF: tl.constexpr, L2NORM: tl.constexpr, QK_ALIGN: tl.constexpr,
        V_ALIGN: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, CHUNK: tl.constexpr,
        SPLIT: tl.constexpr):
    _prepare(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, cu_seqlens_ptr,
             num_tokens, qk_stride_t, qk_stride_h, v_stride_t, v_stride_h, gate_stride,
             chunk_g_ptr, chunk_w_ptr, chunk_u_ptr, chunk_k_ptr, K, V, BK, BVF, True, L2NORM,
             QK_ALIGN, V_ALIGN, HV, GROUP, CHUNK, SPLIT)


gdn_chunk_prepare_kernel = same_binary_jit(gdn_chunk_prepare_kernel)
gdn_chunk_prepare_fused_gates_kernel = same_binary_jit(gdn_chunk_prepare_fused_gates_kernel)


@triton.jit
def _state_tile(kk, vv, K: tl.constexpr, V: tl.constexpr, LAYOUT_KV: tl.constexpr):
    """Offsets and mask of the state rows ``kk`` x value columns ``vv`` in the pool's
    ``[K, V]`` (``LAYOUT_KV``) or ``[V, K]`` state."""
    if LAYOUT_KV:
        offs = kk[:, None] * V + vv[None, :]
    else:
        offs = vv[None, :] * K + kk[:, None]
    return offs, (kk < K)[:, None] & (vv < V)[None, :]


@triton.jit
def _store_state(chunk_h_ptr, slot, i_hv, kk, vv, s0, s1, K: tl.constexpr, V: tl.constexpr,
                 HK: tl.constexpr, HV: tl.constexpr):
    """The state's halves to ``chunk_h[slot, i_hv]`` (``[K, V]``)."""
    h = chunk_h_ptr + (slot * HV + i_hv) * (K * V)
    o0, m0 = _state_tile(kk, vv, K, V, True)
    tl.store(h + o0, s0, mask=m0)
    o1, m1 = _state_tile(HK + kk, vv, K, V, True)
    tl.store(h + o1, s1, mask=m1)


@triton.jit
def _load_state(chunk_h_ptr, slot, i_hv, kk, vv, K: tl.constexpr, V: tl.constexpr,
                HK: tl.constexpr, HV: tl.constexpr):
    """:func:`_store_state`'s halves back."""
    h = chunk_h_ptr + (slot * HV + i_hv) * (K * V)
    o0, m0 = _state_tile(kk, vv, K, V, True)
    o1, m1 = _state_tile(HK + kk, vv, K, V, True)
    return tl.load(h + o0, mask=m0, other=0), tl.load(h + o1, mask=m1, other=0)


@triton.jit
def _corrections(chunk_g_ptr, chunk_w_ptr, chunk_u_ptr, first, i_hv, n_live, vv, s0, s1,
                 K: tl.constexpr, V: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr,
                 CHUNK: tl.constexpr):
    """The log decays ``[CHUNK]`` and corrections ``U = U0 - W S0`` ``[CHUNK, BV]`` (value
    columns ``vv``) of the chunk of tokens ``first ..`` (``n_live`` of them), from step 1's
    scratch and the state's two halves ``s0``, ``s1`` ``[HK, BV]``."""
    r = tl.arange(0, CHUNK)
    g = tl.load(chunk_g_ptr + first * HV + i_hv + r * HV, mask=r < n_live, other=0)
    w0, w1 = _scratch_halves(chunk_w_ptr, first, i_hv, n_live, K, HK, HV, CHUNK)
    pu, mu = _rows_of(chunk_u_ptr, first, i_hv, n_live, vv, V, HV, CHUNK)
    return g, tl.load(pu, mask=mu, other=0) - chunk_mma(w1, s1, chunk_dot(w0, s0))


@triton.jit
def _chunk_output(q_ptr, k_ptr, qk_head, t, live, qk_stride_t, scale, g, s0, s1, u,
                  K: tl.constexpr, HK: tl.constexpr, L2NORM: tl.constexpr,
                  QK_ALIGN: tl.constexpr, CHUNK: tl.constexpr):
    """A chunk's output ``[CHUNK, BV]``: ``exp(G_i) q_i S0 + sum_{j <= i} exp(D[i, j])
    (q_i . k_j) U_j`` (the state's halves ``s0``, ``s1``, the corrections ``u``)."""
    q0, q1 = _qk_halves(q_ptr, qk_head, t, live, qk_stride_t, K, HK, L2NORM, QK_ALIGN)
    k0, k1 = _qk_halves(k_ptr, qk_head, t, live, qk_stride_t, K, HK, L2NORM, QK_ALIGN)
    q0, q1 = q0 * scale, q1 * scale
    G, decay = chunk_decays(g, CHUNK)
    r = tl.arange(0, CHUNK)
    a = chunk_mma(q1, tl.trans(k1), chunk_dot(q0, tl.trans(k0)))
    a = tl.where(r[:, None] >= r[None, :], a * decay, 0.0)
    eG = tl.exp(G)[:, None]
    return chunk_mma(a, u, chunk_mma(q1 * eG, s1, chunk_dot(q0 * eG, s0)))


@triton.jit
def _advance(s0, s1, g, kd0, kd1, u, k_ptr, qk_head, t, live, qk_stride_t, c, n, jw, wb,
             spec, pool_ptr, head, block_stride, so0, sm0, so1, sm1, K: tl.constexpr,
             HK: tl.constexpr, WIN: tl.constexpr, L2NORM: tl.constexpr, ALIGN: tl.constexpr,
             QK_ALIGN: tl.constexpr, CHUNK: tl.constexpr):
    """The state's halves after the chunk: ``exp(G_last) S0 + kd^T U`` (``kd`` step 1's
    decayed ``k``), and on a spec row the state after each candidate stored to its block,
    from ``k`` and the decays."""
    if spec & (WIN > 1):
        k0, k1 = _qk_halves(k_ptr, qk_head, t, live, qk_stride_t, K, HK, L2NORM, QK_ALIGN)
        G, decay = chunk_decays(g, CHUNK)  # g = 0 past the row: the sums stop there
        s0 = chunk_advance(s0, G, decay, k0, u, c, n, jw, wb, spec, pool_ptr, head,
                           block_stride, so0, sm0, ALIGN, CHUNK)
        s1 = chunk_advance(s1, G, decay, k1, u, c, n, jw, wb, spec, pool_ptr, head,
                           block_stride, so1, sm1, ALIGN, CHUNK)
    else:
        eg = tl.exp(tl.sum(g, axis=0))
        s0 = chunk_mma(tl.trans(kd0), u, eg * s0)
        s1 = chunk_mma(tl.trans(kd1), u, eg * s1)
    return s0, s1


@same_binary_jit
def gated_delta_rule_chunked_kernel(
    pool_in_ptr,  # aliased with pool_ptr
    errors_in_ptr,
    q_ptr,  # [T, H, K] (the first chunk's output)
    k_ptr,  # [T, H, K]
    cu_seqlens_ptr,
    read_block_ptr,
    write_blocks_ptr,  # [N, WIN]
    is_spec_ptr,
    chunk_g_ptr,  # [T, HV] fp32: step 1's
    chunk_w_ptr,  # [T, HV, K] fp32
    chunk_u_ptr,  # [T, HV, V] fp32
    chunk_k_ptr,  # [T, HV, K] fp32
    num_tokens,
    qk_stride_t,
    qk_stride_h,
    wb_stride,
    layer_offset,
    block_stride,
    head_stride,
    num_blocks,
    scale,
    o_ptr,  # [T, HV, V]
    pool_ptr,
    errors_ptr,
    chunk_h_ptr,  # [cdiv(T, CHUNK), HV, K, V] fp32: for step 3
    chunk_row_ptr,  # [cdiv(T, CHUNK)] int32: the row of each slot's chunk, for step 3
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    WIN: tl.constexpr,
    WIN_PAD: tl.constexpr,
    LAYOUT_KV: tl.constexpr,
    L2NORM: tl.constexpr,
    ALIGN: tl.constexpr,
    QK_ALIGN: tl.constexpr,
    HV: tl.constexpr,
    GROUP: tl.constexpr,  # HV // H
    CHUNK: tl.constexpr,
):
    """Step 2 (the module's docstring), for both ops (step 1 consumed the gates and ``v``):
    one program per (row, value head ``i_hv``, value columns ``[i_v BV, (i_v + 1) BV)``),
    all the row's chunks in order; the arrays are :func:`.gdn._gdn`'s."""
    row, i_hv, i_v = head_program(HV, (V + BV - 1) // BV)
    HK: tl.constexpr = BK // 2
    t0, t1, n, rb, spec, jw, wb = recurrent_row(row, cu_seqlens_ptr, read_block_ptr,
                                                write_blocks_ptr, is_spec_ptr, wb_stride, WIN,
                                                WIN_PAD)
    kk = tl.arange(0, HK)
    vv = (i_v * BV).to(tl.int32) + tl.arange(0, BV)
    # the state's two halves of rows [HK, BV] (k, v) in the pool's layout (int32 offsets
    # in a state: a loop holds them)
    so0, sm0 = _state_tile(kk, vv, K, V, LAYOUT_KV)
    so1, sm1 = _state_tile(HK + kk, vv, K, V, LAYOUT_KV)
    head, block_stride = head_offset(layer_offset, i_hv, head_stride, block_stride, ALIGN)
    # loaded whole before any store, as in .gdn
    s_base = pool_ptr + aligned_base(head, rb, block_stride, ALIGN)
    known = (rb >= 0) & (rb < num_blocks)
    s0 = tl.load(s_base + so0, mask=sm0 & known, other=0).to(tl.float32)
    s1 = tl.load(s_base + so1, mask=sm1 & known, other=0).to(tl.float32)

    fault = recurrent_fault(t0, t1, n, rb, wb, spec, num_tokens, num_blocks, WIN)
    if (i_hv == 0) & (i_v == 0):
        flag_row(errors_ptr, row, fault)
    out_o = o_ptr + i_hv * V + vv
    clear_faulty_row(out_o, t0, t1, HV * V, fault, vv < V, BV)
    if fault == 0:
        tl.debug_barrier()  # the whole initial state is loaded before any store
        r = tl.arange(0, CHUNK)
        qk_head = (i_hv // GROUP) * qk_stride_h
        t = t0 + r.to(tl.int64)
        live = r < n
        n_live = tl.minimum(CHUNK, n)
        # the first chunk: its output from the state loaded, then the state after it
        g, u = _corrections(chunk_g_ptr, chunk_w_ptr, chunk_u_ptr, t0, i_hv, n_live, vv, s0,
                            s1, K, V, HK, HV, CHUNK)
        o = _chunk_output(q_ptr, k_ptr, qk_head, t, live, qk_stride_t, scale, g, s0, s1, u, K,
                          HK, L2NORM, QK_ALIGN, CHUNK)
        po, mo = _rows_of(o_ptr, t0, i_hv, n_live, vv, V, HV, CHUNK)
        tl.store(po, o.to(o_ptr.dtype.element_ty), mask=mo)
        kd0, kd1 = _scratch_halves(chunk_k_ptr, t0, i_hv, n_live, K, HK, HV, CHUNK)
        s0, s1 = _advance(s0, s1, g, kd0, kd1, u, k_ptr, qk_head, t, live, qk_stride_t, 0, n,
                          jw, wb, spec, pool_ptr, head, block_stride, so0, sm0, so1, sm1, K,
                          HK, WIN, L2NORM, ALIGN, QK_ALIGN, CHUNK)
        # the later chunks: the state only, each chunk's start stored for step 3
        for c in range(CHUNK, n, CHUNK):
            t = t0 + c + r.to(tl.int64)
            live = c + r < n
            first, n_live = t0 + c, tl.minimum(CHUNK, n - c)
            _store_state(chunk_h_ptr, first // CHUNK, i_hv, kk, vv, s0, s1, K, V, HK, HV)
            if (i_hv == 0) & (i_v == 0):
                tl.store(chunk_row_ptr + first // CHUNK, row.to(tl.int32))
            g, u = _corrections(chunk_g_ptr, chunk_w_ptr, chunk_u_ptr, first, i_hv, n_live, vv,
                                s0, s1, K, V, HK, HV, CHUNK)
            kd0, kd1 = _scratch_halves(chunk_k_ptr, first, i_hv, n_live, K, HK, HV, CHUNK)
            s0, s1 = _advance(s0, s1, g, kd0, kd1, u, k_ptr, qk_head, t, live, qk_stride_t, c,
                              n, jw, wb, spec, pool_ptr, head, block_stride, so0, sm0, so1,
                              sm1, K, HK, WIN, L2NORM, ALIGN, QK_ALIGN, CHUNK)
        # (with one write block a spec row has at most one token, its state the final one)
        store_final_state(s0, n, jw, wb, spec & (WIN > 1), pool_ptr, head, block_stride, so0,
                          sm0, ALIGN)
        store_final_state(s1, n, jw, wb, spec & (WIN > 1), pool_ptr, head, block_stride, so1,
                          sm1, ALIGN)


@same_binary_jit
def gated_delta_rule_chunk_output_kernel(
    o_in_ptr,  # aliased with o_ptr
    q_ptr,  # [T, H, K]
    k_ptr,
    cu_seqlens_ptr,
    read_block_ptr,
    write_blocks_ptr,
    is_spec_ptr,
    chunk_g_ptr,  # step 1's scratch
    chunk_w_ptr,
    chunk_u_ptr,
    chunk_h_ptr,  # step 2's
    chunk_row_ptr,
    num_tokens,
    num_rows,
    qk_stride_t,
    qk_stride_h,
    wb_stride,
    num_blocks,
    scale,
    o_ptr,  # [T, HV, V]
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    WIN: tl.constexpr,
    WIN_PAD: tl.constexpr,
    L2NORM: tl.constexpr,
    QK_ALIGN: tl.constexpr,
    HV: tl.constexpr,
    GROUP: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Step 3 (the module's docstring): one program per (slot ``i_s`` of ``chunk_h``, value
    head, value columns ``[i_v BV, (i_v + 1) BV)``): the output of the later chunk whose
    first token is in ``[i_s CHUNK, (i_s + 1) CHUNK)``, if a row that step 2 did not skip
    has one there: step 2 stored that row in ``chunk_row``, which holds anything where it
    stored none. So the row read there is used only if it is a row, step 2 did not skip it
    and it has a later chunk starting in the slot: then the slot is that row's (two later
    chunks in one slot would start fewer than ``CHUNK`` tokens apart, in one row, whose
    chunks start ``CHUNK`` apart; rows that share tokens excepted: their outputs are
    unspecified)."""
    i_s, i_hv, i_v = head_program(HV, (V + BV - 1) // BV)
    HK: tl.constexpr = BK // 2
    first = i_s * CHUNK
    # (no slot at all when the launch has no tokens: the grid keeps one program)
    row = tl.load(chunk_row_ptr + i_s, mask=first < num_tokens, other=-1).to(tl.int64)
    known = (row >= 0) & (row < num_rows)
    row = tl.where(known, row, 0)
    t0, t1, n, rb, spec, jw, wb = recurrent_row(row, cu_seqlens_ptr, read_block_ptr,
                                                write_blocks_ptr, is_spec_ptr, wb_stride, WIN,
                                                WIN_PAD)
    fault = recurrent_fault(t0, t1, n, rb, wb, spec, num_tokens, num_blocks, WIN)
    start = t0 + (first - t0 + CHUNK - 1) // CHUNK * CHUNK  # (first - t0 > 0 below)
    if known & (fault == 0) & (first > t0) & (start < t1):
        r = tl.arange(0, CHUNK)
        t = start + r.to(tl.int64)
        live = t < t1
        n_live = tl.minimum(CHUNK, t1 - start)
        kk = tl.arange(0, HK)
        vv = (i_v * BV).to(tl.int32) + tl.arange(0, BV)
        s0, s1 = _load_state(chunk_h_ptr, i_s, i_hv, kk, vv, K, V, HK, HV)
        g, u = _corrections(chunk_g_ptr, chunk_w_ptr, chunk_u_ptr, start, i_hv, n_live, vv, s0,
                            s1, K, V, HK, HV, CHUNK)
        o = _chunk_output(q_ptr, k_ptr, (i_hv // GROUP) * qk_stride_h, t, live, qk_stride_t,
                          scale, g, s0, s1, u, K, HK, L2NORM, QK_ALIGN, CHUNK)
        po, mo = _rows_of(o_ptr, start, i_hv, n_live, vv, V, HV, CHUNK)
        tl.store(po, o.to(o_ptr.dtype.element_ty), mask=mo)


def plan_chunked(q, v, rows, T, H, HV, K, V, strides, pool_scal, scale_scal, row_ids, gates,
                 common, fused) -> LaunchPlan:
    """:func:`.gdn.plan_gated_delta_rule`'s plan for ``algorithm="chunked"`` from the
    checks and pieces it derived there (``pool_scal`` without the scale, ``scale_scal``):
    step 1 (its solve for every chunk at once) as the plan's ``before`` stage, writing the
    fp32 scratch steps 2 and 3 read, step 3 (the later chunks' outputs) as its ``after``
    stage."""
    chunk = CHUNK
    if isinstance(K, int) and isinstance(V, int) and chunk * HV * max(K, V) >= 2**31:
        raise ValueError(f"algorithm='chunked' needs {chunk} * HV * max(K, V) < 2**31 (its "
                         f"32-bit offsets), got HV={HV}, K={K}, V={V}")
    bk = max(32, next_pow2(K))  # two halves of columns, each 16 at least (tl.dot)
    # step 1: enough programs for every chunk of an average row at once, at most MAX_SPLIT
    # per (row, head); which program takes a chunk changes no arithmetic. Sizes that are
    # symbolic (torch.compile's fake, which launches nothing) take the cap: deriving the
    # count from them would pin them, a recompile for every prefill length
    if isinstance(T, int) and isinstance(rows, int):
        split = min(MAX_SPLIT, next_pow2(max(1, cdiv(cdiv(T, chunk), max(1, rows)))))
    else:
        split = MAX_SPLIT
    qk = {"K": K, "BK": bk, "L2NORM": common["L2NORM"], "QK_ALIGN": common["QK_ALIGN"],
          "HV": HV, "GROUP": HV // H, "CHUNK": chunk}
    prepare = LaunchPlan(
        kernel=(gdn_chunk_prepare_fused_gates_kernel if fused
                else gdn_chunk_prepare_kernel),
        grid=(max(1, rows * HV * split),),
        inputs=("q", "k", "v") + gates + ("cu_seqlens",),
        scalars=(("num_tokens", T),) + strides,
        outputs=SCRATCH,
        out_specs={"chunk_g": Output((T, HV), "float32"),
                   "chunk_w": Output((T, HV, K), "float32"),
                   "chunk_u": Output((T, HV, V), "float32"),
                   "chunk_k": Output((T, HV, K), "float32")},
        constexprs=dict(qk, V=V, BVF=max(32, next_pow2(V)), V_ALIGN=io_align(v, v.strides[:2]),
                        SPLIT=split),
        num_warps=PREPARE_WARPS,
        num_stages=NUM_STAGES,
        skip=rows == 0,
    )
    window = {"WIN": common["WIN"], "WIN_PAD": common["WIN_PAD"]}
    out_bv = max(16, min(OUT_BV, next_pow2(V)))
    output = LaunchPlan(
        kernel=gated_delta_rule_chunk_output_kernel,
        grid=(max(1, cdiv(T, chunk) * HV * cdiv(V, out_bv)),),
        inputs=("o", "q", "k") + row_ids + ("chunk_g", "chunk_w", "chunk_u", "chunk_h",
                                            "chunk_row"),
        scalars=(("num_tokens", T), ("num_rows", rows)) + strides[:2]
        + (pool_scal[0], pool_scal[-1], scale_scal),  # wb_stride, num_blocks
        outputs=("o",),
        constexprs=dict(qk, **window, V=V, BV=out_bv),
        num_warps=OUT_WARPS,
        num_stages=NUM_STAGES,
        aliases={"o": "o"},
        skip=rows == 0,
    )
    bv = max(16, min(BV, next_pow2(V)))
    return LaunchPlan(
        kernel=gated_delta_rule_chunked_kernel,
        grid=(max(1, rows * HV * cdiv(V, bv)),),
        inputs=("pool", "errors", "q", "k") + row_ids + SCRATCH,
        scalars=(("num_tokens", T),) + strides[:2] + pool_scal + (scale_scal,),
        outputs=("o", "pool", "errors", "chunk_h", "chunk_row"),
        out_specs={"o": Output((T, HV, V), q.dtype),
                   "chunk_h": Output((cdiv(T, chunk), HV, K, V), "float32"),
                   "chunk_row": Output((cdiv(T, chunk),), "int32")},
        constexprs=dict(common, BK=bk, BV=bv, CHUNK=chunk),
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
        aliases={"pool": "pool", "errors": "errors"},
        skip=rows == 0,
        before=(prepare,),
        after=(output,),
        scratch=("chunk_h", "chunk_row"),
    )

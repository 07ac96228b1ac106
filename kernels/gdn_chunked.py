"""The gated delta rule of docs/semantics.md §4 by chunks of ``CHUNK`` tokens, for prefill
rows: the same rows, read and write blocks, spec candidates and faults as :mod:`.gdn`, with a
row's tokens taken ``CHUNK`` at a time as matrix products, in two launches (the plan's
``before`` stage, then the recurrence):

1. :func:`gdn_chunk_prepare_kernel` (or ``..._fused_gates_kernel``): the chunks of every
   row and value head in parallel (``SPLIT`` programs a row and head, each taking every
   ``SPLIT``-th chunk). Their triangular solves and every other term that needs no state
   leave the recurrence's inputs as fp32 scratch arrays indexed like the tokens: the log
   decays ``chunk_g`` ``[T, HV]``, ``chunk_w`` ``[T, HV, K]``, ``chunk_u`` ``[T, HV, V]``,
   ``chunk_q`` (``exp(G_i) q_i``) and ``chunk_k`` (``exp(D[C-1, i]) k_i``) ``[T, HV, K]``
   and ``chunk_a`` (``exp(D[i, j]) (q_i . k_j)``, ``j <= i``; token ``i``'s row)
   ``[T, HV, C]``.
2. :func:`gated_delta_rule_chunked_kernel`: one program per (row, value head, ``BV`` value
   columns), the token-by-token kernel's grid, walking its row's chunks in order; per chunk
   two products with the state (``W S0``, ``exp(G) q S0``), the state's update and one
   product within the chunk (``a U``), no solve (a spec row also forms the state after each
   candidate from ``k`` and its decays).

Within a chunk of tokens ``0 .. C-1`` (``q`` scaled and, with l2norm, ``q`` and ``k``
normalised), with ``G_i = g_0 + ... + g_i`` (the log decays), ``D[i, j] = g_(j+1) + ... +
g_i`` and ``S0`` the state ``[K, V]`` at the chunk's start, the delta rule's per-token
corrections ``U`` ``[C, V]`` solve the unit lower triangular system
``(I + M) U = beta * v - (beta * exp(G) * k) S0`` with
``M[i, j] = beta_i (k_i . k_j) exp(D[i, j])`` for ``j < i``. So ``U = U0 - W S0`` with
``U0 = (I + M)^-1 (beta * v)`` and ``W = (I + M)^-1 (beta * exp(G) * k)``, which do not
depend on the state (step 1). Then (step 2):

- ``o_i = exp(G_i) q_i S0 + sum_{j <= i} exp(D[i, j]) (q_i . k_j) U_j``;
- the state after token ``i``: ``exp(G_i) S0 + sum_{j <= i} exp(D[i, j]) k_j U_j^T``
  (every candidate of a spec row; the last token's for the next chunk).

``(I + M)^-1`` comes from forward substitution, one row per loop trip. The products are
``tl.dot`` in fp32 at ``recurrent.DOT_PRECISION``, so the rounding is the recurrence's order of
magnitude, not its bits (the two algorithms sum in different orders). A chunk's arithmetic
depends on its own tokens only, never on which program of step 1 took it or on the batch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .jit import same_binary_jit
from .plan import LaunchPlan, Output, cdiv, io_align, next_pow2
from .recurrent import chunk_advance, chunk_decays, chunk_dot, clear_faulty_row, decay_gates, \
    head_offset, head_program, recurrent_fault, recurrent_row, store_final_state
from .rows import aligned_base, flag_row, range_fault

CHUNK = 16  # tokens per chunk (fixed: batch invariance)
BV = 32  # value columns per program of step 2 (at least 16: tl.dot)
#: step 2's warps: 8 while its grid is at most ONE_WAVE programs (one an SM), else 4 (two
#: programs an SM; benchmarks/README.md, "The chunked gated delta rule in two launches").
#: Both binaries must give a row the same bits, whatever its batch: tests/test_gdn_chunked.py
#: and tests/test_recurrent_gpu.py compare them
FEW_PROGRAMS_WARPS = 8
NUM_WARPS = 4
ONE_WAVE = 132  # the SMs of an H100 / H200
PREPARE_WARPS = 4  # step 1
#: step 1's programs per (row, value head) at most; each takes every SPLIT-th chunk
MAX_SPLIT = 64
#: the fp32 scratch step 1 writes and step 2 reads
SCRATCH = ("chunk_g", "chunk_w", "chunk_u", "chunk_q", "chunk_k", "chunk_a")


@triton.jit
def _chunk_rows(ptr, head, t, stride_t, live, cols, colmask, ALIGN: tl.constexpr):
    """``[CHUNK, len(cols)]``: the tokens ``t``'s (``[CHUNK]``) elements at ``head + cols``
    of an array with token stride ``stride_t``, zero where ``live`` is false."""
    rows = aligned_base(head, t, stride_t, ALIGN)
    return tl.load(ptr + rows[:, None] + cols[None, :], mask=live[:, None] & colmask[None, :],
                   other=0)


@triton.jit
def _normalised(x):
    """The rows of ``x`` ``[CHUNK, BK]`` (fp32) scaled to unit length (the l2norm option)."""
    return x / tl.sqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]


@triton.jit
def _unit_lower_inverse(a, rows, CHUNK: tl.constexpr):
    """``(I + a)^-1`` for a strictly lower triangular ``a`` ``[CHUNK, CHUNK]`` whose rows
    from ``rows`` on are zero (tokens past the row), by forward substitution: row ``i`` is
    ``e_i - a[i, :] @ inv`` over the rows above it (the rows below are still ``e_j``, which
    ``a[i, j] = 0`` leaves out); the zero rows' inverse rows stay ``e_i``."""
    r = tl.arange(0, CHUNK)
    inv = (r[:, None] == r[None, :]).to(tl.float32)
    for i in range(1, rows):
        a_i = tl.sum(tl.where(r[:, None] == i, a, 0.0), axis=0)  # a[i, :], over j
        row = tl.sum(a_i[:, None] * inv, axis=0)
        inv = tl.where(r[:, None] == i, inv - row[None, :], inv)
    return inv


@triton.jit
def _prepare(q_ptr, k_ptr, v_ptr, gate_a_ptr, gate_b_ptr, A_log_ptr, dt_bias_ptr,
             cu_seqlens_ptr, num_tokens, qk_stride_t, qk_stride_h, v_stride_t, v_stride_h,
             gate_stride, scale, chunk_g_ptr, chunk_w_ptr, chunk_u_ptr, chunk_q_ptr,
             chunk_k_ptr, chunk_a_ptr, K: tl.constexpr, V: tl.constexpr,
             BK: tl.constexpr, BVF: tl.constexpr, FUSED_GATES: tl.constexpr,
             L2NORM: tl.constexpr, QK_ALIGN: tl.constexpr, V_ALIGN: tl.constexpr,
             HV: tl.constexpr, GROUP: tl.constexpr, CHUNK: tl.constexpr, SPLIT: tl.constexpr):
    """Step 1 (the module's docstring): one program per (row, value head, one of ``SPLIT``),
    which takes the row's chunks ``i_split, i_split + SPLIT, ...``. A row whose own
    ``cu_seqlens`` entries are bad is left alone (step 2 flags it); other faults do not
    matter here: step 2 reads nothing of a row it skips."""
    row, i_hv, i_split = head_program(HV, SPLIT)
    t0 = tl.load(cu_seqlens_ptr + row).to(tl.int64)
    t1 = tl.load(cu_seqlens_ptr + row + 1).to(tl.int64)
    n = t1 - t0
    if range_fault(t0, t1, num_tokens) == 0:
        kk = tl.arange(0, BK).to(tl.int64)
        vv = tl.arange(0, BVF).to(tl.int64)
        kmask, vmask = kk < K, vv < V
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
            q = _chunk_rows(q_ptr, k_head, t, qk_stride_t, live, kk, kmask,
                            QK_ALIGN).to(tl.float32)
            k = _chunk_rows(k_ptr, k_head, t, qk_stride_t, live, kk, kmask,
                            QK_ALIGN).to(tl.float32)
            v = _chunk_rows(v_ptr, i_hv * v_stride_h, t, v_stride_t, live, vv, vmask,
                            V_ALIGN).to(tl.float32)
            ga = tl.load(gate_a_ptr + t * gate_stride + i_hv, mask=live, other=0)
            gb = tl.load(gate_b_ptr + t * gate_stride + i_hv, mask=live, other=0)
            g, beta = decay_gates(ga, gb, A, dt_bias, FUSED_GATES)
            g, beta = tl.where(live, g, 0.0), tl.where(live, beta, 0.0)  # none past the row
            if L2NORM:
                q, k = _normalised(q), _normalised(k)
            q = q * scale
            G, decay = chunk_decays(g, CHUNK)
            # the terms of step 2 that need no state, stored first: q dies here
            th = t * HV + i_hv
            kmask2 = live[:, None] & kmask[None, :]
            a = tl.where(r[:, None] >= r[None, :], chunk_dot(q, tl.trans(k)) * decay, 0.0)
            tl.store(chunk_a_ptr + th[:, None] * CHUNK + r[None, :], a, mask=live[:, None])
            tl.store(chunk_q_ptr + th[:, None] * K + kk[None, :], q * tl.exp(G)[:, None],
                     mask=kmask2)
            last = tl.sum(tl.where(r[:, None] == CHUNK - 1, decay, 0.0), axis=0)
            tl.store(chunk_k_ptr + th[:, None] * K + kk[None, :], k * last[:, None],
                     mask=kmask2)
            kb = k * beta[:, None]
            m = tl.where(r[:, None] > r[None, :], chunk_dot(kb, tl.trans(k)) * decay, 0.0)
            inv = _unit_lower_inverse(m, tl.minimum(CHUNK, n - c), CHUNK)
            w = chunk_dot(inv, kb * tl.exp(G)[:, None])
            u = chunk_dot(inv, v * beta[:, None])
            tl.store(chunk_g_ptr + th, g, mask=live)
            tl.store(chunk_w_ptr + th[:, None] * K + kk[None, :], w, mask=kmask2)
            tl.store(chunk_u_ptr + th[:, None] * V + vv[None, :], u,
                     mask=live[:, None] & vmask[None, :])


# Step 1's kernels, one per op, each naming its parameters as the op's arrays (the ABI)
def gdn_chunk_prepare_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, cu_seqlens_ptr,
                             num_tokens, qk_stride_t, qk_stride_h, v_stride_t, v_stride_h,
                             gate_stride, scale, chunk_g_ptr, chunk_w_ptr, chunk_u_ptr,
                             chunk_q_ptr, chunk_k_ptr, chunk_a_ptr, K: tl.constexpr,
                             V: tl.constexpr, BK: tl.constexpr, BVF: tl.constexpr,
                             L2NORM: tl.constexpr, QK_ALIGN: tl.constexpr,
                             V_ALIGN: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr,
                             CHUNK: tl.constexpr, SPLIT: tl.constexpr):
    _prepare(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, g_ptr, g_ptr, cu_seqlens_ptr, num_tokens,
             qk_stride_t, qk_stride_h, v_stride_t, v_stride_h, gate_stride, scale,
             chunk_g_ptr, chunk_w_ptr, chunk_u_ptr, chunk_q_ptr, chunk_k_ptr, chunk_a_ptr, K,
             V, BK, BVF, False, L2NORM, QK_ALIGN, V_ALIGN, HV, GROUP, CHUNK, SPLIT)


def gdn_chunk_prepare_fused_gates_kernel(
        q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, cu_seqlens_ptr,
        num_tokens, qk_stride_t, qk_stride_h, v_stride_t, v_stride_h, gate_stride, scale,
        chunk_g_ptr, chunk_w_ptr, chunk_u_ptr, chunk_q_ptr, chunk_k_ptr, chunk_a_ptr,
        K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BVF: tl.constexpr,
        L2NORM: tl.constexpr, QK_ALIGN: tl.constexpr, V_ALIGN: tl.constexpr,
        HV: tl.constexpr, GROUP: tl.constexpr, CHUNK: tl.constexpr, SPLIT: tl.constexpr):
    _prepare(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, cu_seqlens_ptr,
             num_tokens, qk_stride_t, qk_stride_h, v_stride_t, v_stride_h, gate_stride, scale,
             chunk_g_ptr, chunk_w_ptr, chunk_u_ptr, chunk_q_ptr, chunk_k_ptr, chunk_a_ptr, K,
             V, BK, BVF, True, L2NORM, QK_ALIGN, V_ALIGN, HV, GROUP, CHUNK, SPLIT)


gdn_chunk_prepare_kernel = same_binary_jit(gdn_chunk_prepare_kernel)
gdn_chunk_prepare_fused_gates_kernel = same_binary_jit(gdn_chunk_prepare_fused_gates_kernel)


@triton.jit
def _chunk_inputs(chunk_g_ptr, chunk_w_ptr, chunk_u_ptr, chunk_q_ptr, chunk_k_ptr,
                  chunk_a_ptr, t, live, i_hv, kk, vv, kmask, vmask, K: tl.constexpr,
                  V: tl.constexpr, HV: tl.constexpr, CHUNK: tl.constexpr):
    """Step 1's scratch for the tokens ``t`` (``[CHUNK]``), zero where ``live`` is false:
    the log decays ``[CHUNK]``, ``W`` ``[CHUNK, BK]``, ``U0`` ``[CHUNK, BV]``, the decayed
    ``q`` and ``k`` ``[CHUNK, BK]`` and the chunk's ``q . k`` terms ``[CHUNK, CHUNK]``."""
    th = t * HV + i_hv
    g = tl.load(chunk_g_ptr + th, mask=live, other=0)
    w = _chunk_rows(chunk_w_ptr, 0, th, K, live, kk, kmask, 1)
    u0 = _chunk_rows(chunk_u_ptr, 0, th, V, live, vv, vmask, 1)
    qg = _chunk_rows(chunk_q_ptr, 0, th, K, live, kk, kmask, 1)
    kd = _chunk_rows(chunk_k_ptr, 0, th, K, live, kk, kmask, 1)
    r = tl.arange(0, CHUNK)
    a = _chunk_rows(chunk_a_ptr, 0, th, CHUNK, live, r, r < CHUNK, 1)
    return g, w, u0, qg, kd, a


@same_binary_jit
def gated_delta_rule_chunked_kernel(
    pool_in_ptr,  # aliased with pool_ptr
    errors_in_ptr,
    k_ptr,  # [T, H, K] (a spec row's candidates)
    cu_seqlens_ptr,
    read_block_ptr,
    write_blocks_ptr,  # [N, WIN]
    is_spec_ptr,
    chunk_g_ptr,  # [T, HV] fp32: step 1's
    chunk_w_ptr,  # [T, HV, K] fp32
    chunk_u_ptr,  # [T, HV, V] fp32
    chunk_q_ptr,  # [T, HV, K] fp32
    chunk_k_ptr,  # [T, HV, K] fp32
    chunk_a_ptr,  # [T, HV, CHUNK] fp32
    num_tokens,
    qk_stride_t,
    qk_stride_h,
    wb_stride,
    layer_offset,
    block_stride,
    head_stride,
    num_blocks,
    o_ptr,  # [T, HV, V]
    pool_ptr,
    errors_ptr,
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
    """Step 2 (the module's docstring), for both ops (step 1 consumed q, the gates and ``v``):
    one program per (row, value head ``i_hv``, value columns ``[i_v BV, (i_v + 1) BV)``),
    all the row's tokens, ``CHUNK`` at a time; the arrays are :func:`.gdn._gdn`'s."""
    row, i_hv, i_v = head_program(HV, (V + BV - 1) // BV)
    i_h = i_hv // GROUP
    t0, t1, n, rb, spec, jw, wb = recurrent_row(row, cu_seqlens_ptr, read_block_ptr,
                                                write_blocks_ptr, is_spec_ptr, wb_stride, WIN,
                                                WIN_PAD)
    kk = tl.arange(0, BK).to(tl.int64)
    vv = i_v * BV + tl.arange(0, BV).to(tl.int64)
    kmask, vmask = kk < K, vv < V
    smask = kmask[:, None] & vmask[None, :]
    if LAYOUT_KV:  # state [K, V]
        s_offs = kk[:, None] * V + vv[None, :]
    else:  # [V, K]
        s_offs = vv[None, :] * K + kk[:, None]
    head, block_stride = head_offset(layer_offset, i_hv, head_stride, block_stride, ALIGN)
    # the state [BK, BV] (k, v), loaded whole before any store, as in .gdn
    s = tl.load(pool_ptr + aligned_base(head, rb, block_stride, ALIGN) + s_offs,
                mask=smask & (rb >= 0) & (rb < num_blocks), other=0).to(tl.float32)

    fault = recurrent_fault(t0, t1, n, rb, wb, spec, num_tokens, num_blocks, WIN)
    if (i_hv == 0) & (i_v == 0):
        flag_row(errors_ptr, row, fault)
    out_o = o_ptr + i_hv * V + vv
    clear_faulty_row(out_o, t0, t1, HV * V, fault, vmask, BV)
    if fault == 0:
        tl.debug_barrier()  # the whole initial state is loaded before any store
        r = tl.arange(0, CHUNK)
        qk_head = i_h * qk_stride_h
        t = t0 + r.to(tl.int64)
        live = r < n
        g, w, u0, qg, kd, a = _chunk_inputs(
            chunk_g_ptr, chunk_w_ptr, chunk_u_ptr, chunk_q_ptr, chunk_k_ptr, chunk_a_ptr, t,
            live, i_hv, kk, vv, kmask, vmask, K, V, HV, CHUNK)
        for c in range(0, n, CHUNK):
            # the next chunk's inputs, loaded while this one computes
            t_next = t + CHUNK
            live_next = c + CHUNK + r < n
            g_nx, w_nx, u0_nx, qg_nx, kd_nx, a_nx = _chunk_inputs(
                chunk_g_ptr, chunk_w_ptr, chunk_u_ptr, chunk_q_ptr, chunk_k_ptr, chunk_a_ptr,
                t_next, live_next, i_hv, kk, vv, kmask, vmask, K, V, HV, CHUNK)
            u = u0 - chunk_dot(w, s)
            o = chunk_dot(qg, s) + chunk_dot(a, u)
            tl.store(out_o[None, :] + t[:, None] * HV * V, o.to(o_ptr.dtype.element_ty),
                     mask=live[:, None] & vmask[None, :])
            if spec & (WIN > 1):  # every candidate's state, from k and the decays
                k = _chunk_rows(k_ptr, qk_head, t, qk_stride_t, live, kk, kmask,
                                QK_ALIGN).to(tl.float32)
                if L2NORM:
                    k = _normalised(k)
                G, decay = chunk_decays(g, CHUNK)  # g = 0 past the row: the sums stop there
                s = chunk_advance(s, G, decay, k, u, c, n, jw, wb, spec, pool_ptr, head,
                                  block_stride, s_offs, smask, ALIGN, CHUNK)
            else:  # (g = 0 past the row)
                s = tl.exp(tl.sum(g, axis=0)) * s + chunk_dot(tl.trans(kd), u)
            t, live = t_next, live_next
            g, w, u0, qg, kd, a = g_nx, w_nx, u0_nx, qg_nx, kd_nx, a_nx
        # (with one write block a spec row has at most one token, its state the final one)
        store_final_state(s, n, jw, wb, spec & (WIN > 1), pool_ptr, head, block_stride, s_offs,
                          smask, ALIGN)


def plan_chunked(q, v, rows, T, H, HV, K, V, strides, pool_scal, scale_scal, row_ids, gates,
                 common, fused) -> LaunchPlan:
    """:func:`.gdn.plan_gated_delta_rule`'s plan for ``algorithm="chunked"`` from the
    checks and pieces it derived there (``pool_scal`` without the scale, ``scale_scal``):
    step 1 (its solve for every chunk at once) as the plan's ``before`` stage, writing the
    fp32 scratch arrays step 2 reads."""
    chunk = CHUNK
    bk = max(16, next_pow2(K))  # tl.dot needs 16 rows and columns at least
    # step 1: enough programs for every chunk of an average row at once, at most MAX_SPLIT
    # per (row, head); which program takes a chunk changes no arithmetic. Sizes that are
    # symbolic (torch.compile's fake, which launches nothing) take the cap: deriving the
    # count from them would pin them, a recompile for every prefill length
    if isinstance(T, int) and isinstance(rows, int):
        split = min(MAX_SPLIT, next_pow2(max(1, cdiv(cdiv(T, chunk), max(1, rows)))))
    else:
        split = MAX_SPLIT
    prepare = LaunchPlan(
        kernel=(gdn_chunk_prepare_fused_gates_kernel if fused
                else gdn_chunk_prepare_kernel),
        grid=(max(1, rows * HV * split),),
        inputs=("q", "k", "v") + gates + ("cu_seqlens",),
        scalars=(("num_tokens", T),) + strides + (scale_scal,),  # (step 1 scales q)
        outputs=SCRATCH,
        out_specs={"chunk_g": Output((T, HV), "float32"),
                   "chunk_w": Output((T, HV, K), "float32"),
                   "chunk_u": Output((T, HV, V), "float32"),
                   "chunk_q": Output((T, HV, K), "float32"),
                   "chunk_k": Output((T, HV, K), "float32"),
                   "chunk_a": Output((T, HV, chunk), "float32")},
        constexprs={"K": K, "V": V, "BK": bk, "BVF": max(16, next_pow2(V)),
                    "L2NORM": common["L2NORM"], "QK_ALIGN": common["QK_ALIGN"],
                    "V_ALIGN": io_align(v, v.strides[:2]), "HV": HV, "GROUP": HV // H,
                    "CHUNK": chunk, "SPLIT": split},
        num_warps=PREPARE_WARPS,
        skip=rows == 0,
    )
    bv = max(16, min(BV, next_pow2(V)))
    programs = max(1, rows * HV * cdiv(V, bv))
    # (a symbolic grid, torch.compile's fake, takes the many-programs count unpinned)
    few = isinstance(programs, int) and programs <= ONE_WAVE
    return LaunchPlan(
        kernel=gated_delta_rule_chunked_kernel,
        grid=(programs,),
        inputs=("pool", "errors", "k") + row_ids + SCRATCH,
        scalars=(("num_tokens", T),) + strides[:2] + pool_scal,
        outputs=("o", "pool", "errors"),
        out_specs={"o": Output((T, HV, V), q.dtype)},
        constexprs=dict(common, BK=bk, BV=bv, CHUNK=chunk),
        num_warps=FEW_PROGRAMS_WARPS if few else NUM_WARPS,
        aliases={"pool": "pool", "errors": "errors"},
        skip=rows == 0,
        before=(prepare,),
    )

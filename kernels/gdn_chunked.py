"""The gated delta rule of docs/semantics.md §4 by chunks of ``CHUNK`` tokens: the same
launch, rows, blocks and faults as :mod:`.gdn` (whose kernels call :func:`gdn_chunked` when
their plan asks for ``algorithm="chunked"``), with a row's tokens taken ``CHUNK`` at a time
as matrix products instead of one by one, for prefill rows: a few ``[CHUNK, CHUNK]`` and
``[CHUNK, K]`` products per chunk instead of ``CHUNK`` dependent state updates. (On the
GPU it is not yet faster than the token-by-token kernel: each program still walks its
chunks in order, a solve on every chunk's path; benchmarks/README.md.)

Within a chunk of tokens ``0 .. C-1`` (``q`` scaled and, with l2norm, normalised), with
``G_i = g_0 + ... + g_i`` (the log decays), ``D[i, j] = g_(j+1) + ... + g_i`` and ``S0`` the
state ``[K, V]`` at the chunk's start, the delta rule's per-token corrections ``U``
``[C, V]`` solve the unit lower triangular system
``(I + M) U = beta * v - (beta * exp(G) * k) S0`` with
``M[i, j] = beta_i (k_i . k_j) exp(D[i, j])`` for ``j < i``. Then:

- ``o_i = exp(G_i) q_i S0 + sum_{j <= i} exp(D[i, j]) (q_i . k_j) U_j``;
- the state after token ``i``: ``exp(G_i) S0 + sum_{j <= i} exp(D[i, j]) k_j U_j^T``
  (every candidate of a spec row; the last token's for the next chunk).

``(I + M)^-1`` comes from forward substitution, one row per loop trip. The products are
``tl.dot`` in fp32 at ``recurrent.DOT_PRECISION``, so the rounding is the recurrence's order of
magnitude, not its bits (the two algorithms sum in different orders). Tiles never depend on
the batch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .recurrent import candidate_block, chunk_decays, chunk_dot, chunk_state, \
    clear_faulty_row, decay_gates, head_offset, head_program, recurrent_fault, recurrent_row
from .rows import aligned_base, flag_row

CHUNK = 16  # tokens per chunk (fixed: batch invariance)
BV = 32  # value columns per program (at least 16: tl.dot)
NUM_WARPS = 8
@triton.jit
def _chunk_inputs(q_ptr, k_ptr, v_ptr, gate_a_ptr, gate_b_ptr, t, live, qk_head, v_head,
                  i_hv, qk_stride_t, v_stride_t, gate_stride, kk, kmask, vmask,
                  QK_ALIGN: tl.constexpr, V_ALIGN: tl.constexpr, BV: tl.constexpr):
    """The tokens ``t``'s (``[CHUNK]``) q, k ``[CHUNK, BK]``, v ``[CHUNK, BV]`` and two gates
    ``[CHUNK]``, as stored, zero where ``live`` is false."""
    qk_rows = aligned_base(qk_head, t, qk_stride_t, QK_ALIGN)
    qk_mask = live[:, None] & kmask[None, :]
    q = tl.load(q_ptr + qk_rows[:, None] + kk[None, :], mask=qk_mask, other=0)
    k = tl.load(k_ptr + qk_rows[:, None] + kk[None, :], mask=qk_mask, other=0)
    v_rows = aligned_base(v_head, t, v_stride_t, V_ALIGN)
    v = tl.load(v_ptr + v_rows[:, None] + tl.arange(0, BV)[None, :],
                mask=live[:, None] & vmask[None, :], other=0)
    ga = tl.load(gate_a_ptr + t * gate_stride + i_hv, mask=live, other=0)
    gb = tl.load(gate_b_ptr + t * gate_stride + i_hv, mask=live, other=0)
    return q, k, v, ga, gb


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
def gdn_chunked(q_ptr, k_ptr, v_ptr, gate_a_ptr, gate_b_ptr, A_log_ptr, dt_bias_ptr,
                cu_seqlens_ptr, read_block_ptr, write_blocks_ptr, is_spec_ptr, num_tokens,
                qk_stride_t, qk_stride_h, v_stride_t, v_stride_h, gate_stride, wb_stride,
                layer_offset, block_stride, head_stride, num_blocks, scale, o_ptr, pool_ptr,
                errors_ptr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr, WIN: tl.constexpr, WIN_PAD: tl.constexpr,
                LAYOUT_KV: tl.constexpr, FUSED_GATES: tl.constexpr, L2NORM: tl.constexpr,
                ALIGN: tl.constexpr, QK_ALIGN: tl.constexpr, V_ALIGN: tl.constexpr,
                HV: tl.constexpr, GROUP: tl.constexpr, CHUNK: tl.constexpr):
    """One program: a row's value head ``i_hv``, value columns ``[i_v BV, (i_v + 1) BV)``,
    all its tokens, ``CHUNK`` at a time (the module's docstring); the arrays are
    :func:`.gdn._gdn`'s."""
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
    A = 0.0  # the decay rate, exp(A_log)
    dt_bias = 0.0
    if FUSED_GATES:
        A = tl.exp(tl.load(A_log_ptr + i_hv).to(tl.float32))
        dt_bias = tl.load(dt_bias_ptr + i_hv).to(tl.float32)

    fault = recurrent_fault(t0, t1, n, rb, wb, spec, num_tokens, num_blocks, WIN)
    if (i_hv == 0) & (i_v == 0):
        flag_row(errors_ptr, row, fault)
    out_o = o_ptr + i_hv * V + vv
    clear_faulty_row(out_o, t0, t1, HV * V, fault, vmask, BV)
    if fault == 0:
        tl.debug_barrier()  # the whole initial state is loaded before any store
        r = tl.arange(0, CHUNK)
        causal = r[:, None] >= r[None, :]
        qk_head = i_h * qk_stride_h
        v_head = i_hv * v_stride_h + i_v * BV
        t = t0 + r.to(tl.int64)
        live = r < n
        q_in, k_in, v_in, ga, gb = _chunk_inputs(
            q_ptr, k_ptr, v_ptr, gate_a_ptr, gate_b_ptr, t, live, qk_head, v_head, i_hv,
            qk_stride_t, v_stride_t, gate_stride, kk, kmask, vmask, QK_ALIGN, V_ALIGN, BV)
        for c in range(0, n, CHUNK):
            # the next chunk's inputs, loaded while this one computes
            t_next = t + CHUNK
            live_next = c + CHUNK + r < n
            q_nx, k_nx, v_nx, ga_nx, gb_nx = _chunk_inputs(
                q_ptr, k_ptr, v_ptr, gate_a_ptr, gate_b_ptr, t_next, live_next, qk_head,
                v_head, i_hv, qk_stride_t, v_stride_t, gate_stride, kk, kmask, vmask, QK_ALIGN,
                V_ALIGN, BV)
            q, k, v = q_in.to(tl.float32), k_in.to(tl.float32), v_in.to(tl.float32)
            g, beta = decay_gates(ga, gb, A, dt_bias, FUSED_GATES)
            g, beta = tl.where(live, g, 0.0), tl.where(live, beta, 0.0)  # none past the row
            if L2NORM:
                q = q / tl.sqrt(tl.sum(q * q, axis=1) + 1e-6)[:, None]
                k = k / tl.sqrt(tl.sum(k * k, axis=1) + 1e-6)[:, None]
            q = q * scale
            G, decay = chunk_decays(g, CHUNK)  # g = 0 past the row: the sums stop there
            kb = k * beta[:, None]
            m = tl.where(r[:, None] > r[None, :], chunk_dot(kb, tl.trans(k)) * decay, 0.0)
            inv = _unit_lower_inverse(m, tl.minimum(CHUNK, n - c), CHUNK)
            eG = tl.exp(G)
            u = chunk_dot(inv, v * beta[:, None] - chunk_dot(kb * eG[:, None], s))
            qk = tl.where(causal, chunk_dot(q, tl.trans(k)) * decay, 0.0)
            o = chunk_dot(q * eG[:, None], s) + chunk_dot(qk, u)
            tl.store(out_o[None, :] + t[:, None] * HV * V, o.to(o_ptr.dtype.element_ty),
                     mask=live[:, None] & vmask[None, :])
            if spec:  # every candidate: the state after token c + j
                for j in range(0, tl.minimum(CHUNK, n - c)):
                    sj = chunk_state(s, G, decay, j, k, u, CHUNK)
                    wj = candidate_block(jw, wb, spec, c + j)
                    tl.store(pool_ptr + aligned_base(head, wj, block_stride, ALIGN) + s_offs,
                             sj.to(pool_ptr.dtype.element_ty), mask=smask & (wj >= 0))
            s = chunk_state(s, G, decay, CHUNK - 1, k, u, CHUNK)
            t, live = t_next, live_next
            q_in, k_in, v_in, ga, gb = q_nx, k_nx, v_nx, ga_nx, gb_nx
        if ~spec & (n > 0):
            w0 = candidate_block(jw, wb, spec, 0)
            tl.store(pool_ptr + aligned_base(head, w0, block_stride, ALIGN) + s_offs,
                     s.to(pool_ptr.dtype.element_ty), mask=smask & (w0 >= 0))

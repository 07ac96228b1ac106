"""The gated delta rule's token-by-token kernels (docs/semantics.md §4, "Gated delta rule";
planned by :mod:`.gdn`, which holds the tiles and the rules that pick them). One program
per (row, value head, tile of ``BV`` value rows), all on grid axis 0. The program loads its
``[BV, K]`` slice of the row's initial state (zero without a read block) completely, then
runs the row's tokens in order in fp32, storing ``o`` per token and the state to the row's
write blocks: after every token on spec rows, once at the end otherwise. Tiles never
depend on the batch, so a row's bits do not either."""

from __future__ import annotations

import triton
import triton.language as tl

from .jit import same_binary_jit
from .recurrent import (candidate_block, clear_faulty_row, decay_gates, head_offset,
                        head_program, recurrent_fault, recurrent_row)
from .rows import aligned_base, flag_row

#: registers per thread (Triton's ``maxnreg``, both launchers): ptxas's own choice, 96-122,
#: fits fewer one-warp programs on an SM; at 80 nothing spills (benchmarks/README.md)
REGISTER_CAP = 80


@triton.jit
def _token_inputs(q_ptr, k_ptr, v_ptr, gate_a_ptr, gate_b_ptr, t, live, qk_head, v_head, i_hv,
                  qk_stride_t, v_stride_t, gate_stride, kk, vt, kmask, vmask,
                  QK_ALIGN: tl.constexpr, V_ALIGN: tl.constexpr):
    """Token ``t``'s q, k ``[BK]``, v ``[BV]`` and two gates, zero where ``live`` is false."""
    q = tl.load(q_ptr + aligned_base(qk_head, t, qk_stride_t, QK_ALIGN) + kk,
                mask=kmask & live, other=0)
    k = tl.load(k_ptr + aligned_base(qk_head, t, qk_stride_t, QK_ALIGN) + kk,
                mask=kmask & live, other=0)
    v = tl.load(v_ptr + aligned_base(v_head, t, v_stride_t, V_ALIGN) + vt,
                mask=vmask & live, other=0)
    ga = tl.load(gate_a_ptr + t * gate_stride + i_hv, mask=live, other=0)
    gb = tl.load(gate_b_ptr + t * gate_stride + i_hv, mask=live, other=0)
    return q, k, v, ga, gb


@triton.jit
def _gdn(
    q_ptr,  # [T, H, K]
    k_ptr,  # [T, H, K]
    v_ptr,  # [T, HV, V]
    gate_a_ptr,  # [T, HV]: g, or a (FUSED_GATES)
    gate_b_ptr,  # [T, HV]: beta, or b
    A_log_ptr,  # [HV] (FUSED_GATES only)
    dt_bias_ptr,  # [HV] (FUSED_GATES only)
    cu_seqlens_ptr,
    read_block_ptr,
    write_blocks_ptr,  # [N, WIN]
    is_spec_ptr,
    num_tokens,
    qk_stride_t,
    qk_stride_h,
    v_stride_t,
    v_stride_h,
    gate_stride,
    wb_stride,
    layer_offset,
    block_stride,
    head_stride,
    num_blocks,
    scale,
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
    FUSED_GATES: tl.constexpr,
    L2NORM: tl.constexpr,
    ALIGN: tl.constexpr,
    QK_ALIGN: tl.constexpr,
    V_ALIGN: tl.constexpr,
    STREAM: tl.constexpr,
    STATE_FIRST: tl.constexpr,
    HV: tl.constexpr,
    GROUP: tl.constexpr,  # HV // H
):
    row, i_hv, i_v = head_program(HV, (V + BV - 1) // BV)
    i_h = i_hv // GROUP
    t0, t1, n, rb, spec, jw, wb = recurrent_row(row, cu_seqlens_ptr, read_block_ptr,
                                                write_blocks_ptr, is_spec_ptr, wb_stride, WIN,
                                                WIN_PAD)

    kk = tl.arange(0, BK).to(tl.int64)
    vv = i_v * BV + tl.arange(0, BV).to(tl.int64)
    kmask, vmask = kk < K, vv < V
    hmask = vmask[:, None] & kmask[None, :]
    if LAYOUT_KV:  # state [K, V]: element (v, k) at k * V + v
        h_offs = kk[None, :] * V + vv[:, None]
    else:  # [V, K]
        h_offs = vv[:, None] * K + kk[None, :]
    head, block_stride = head_offset(layer_offset, i_hv, head_stride, block_stride, ALIGN)
    # The state is loaded before the row's checks are known, so the checks add no round
    # trip: every address is in bounds whatever the ids (the masks), and nothing is stored
    # unless the row is clean. So are the first token's inputs, except under STATE_FIRST:
    # then they load after the checks, so that ptxas cannot put them ahead of the state.
    h = tl.load(pool_ptr + aligned_base(head, rb, block_stride, ALIGN) + h_offs,
                mask=hmask & (rb >= 0) & (rb < num_blocks), other=0,
                eviction_policy="evict_first" if STREAM else "").to(tl.float32)
    A = 0.0  # the decay rate, exp(A_log)
    dt_bias = 0.0
    if FUSED_GATES:
        A = tl.exp(tl.load(A_log_ptr + i_hv).to(tl.float32))
        dt_bias = tl.load(dt_bias_ptr + i_hv).to(tl.float32)
    qk_head = i_h * qk_stride_h
    v_head = i_hv * v_stride_h + i_v * BV
    vt = tl.arange(0, BV)
    if not STATE_FIRST:
        q, k, v, ga, gb = _token_inputs(
            q_ptr, k_ptr, v_ptr, gate_a_ptr, gate_b_ptr, t0,
            (t0 >= 0) & (t0 < num_tokens) & (n > 0), qk_head, v_head, i_hv, qk_stride_t,
            v_stride_t, gate_stride, kk, vt, kmask, vmask, QK_ALIGN, V_ALIGN)

    fault = recurrent_fault(t0, t1, n, rb, wb, spec, num_tokens, num_blocks, WIN)
    if (i_hv == 0) & (i_v == 0):
        flag_row(errors_ptr, row, fault)
    out_o = o_ptr + i_hv * V + vv
    clear_faulty_row(out_o, t0, t1, HV * V, fault, vmask, BV)
    if fault == 0:
        tl.debug_barrier()  # the whole initial state is loaded before any store
        if STATE_FIRST:  # the row's entries are in range now
            q, k, v, ga, gb = _token_inputs(
                q_ptr, k_ptr, v_ptr, gate_a_ptr, gate_b_ptr, t0, n > 0, qk_head, v_head, i_hv,
                qk_stride_t, v_stride_t, gate_stride, kk, vt, kmask, vmask, QK_ALIGN, V_ALIGN)
        for j in range(0, n):
            t = t0 + j
            # the next token's inputs, loaded while this one computes
            q_next, k_next, v_next, ga_next, gb_next = _token_inputs(
                q_ptr, k_ptr, v_ptr, gate_a_ptr, gate_b_ptr, t + 1, j + 1 < n, qk_head, v_head,
                i_hv, qk_stride_t, v_stride_t, gate_stride, kk, vt, kmask, vmask, QK_ALIGN,
                V_ALIGN)
            qf, kf, vf = q.to(tl.float32), k.to(tl.float32), v.to(tl.float32)
            g, beta = decay_gates(ga, gb, A, dt_bias, FUSED_GATES)
            if L2NORM:
                qf = qf / tl.sqrt(tl.sum(qf * qf, axis=0) + 1e-6)
                kf = kf / tl.sqrt(tl.sum(kf * kf, axis=0) + 1e-6)
            qf = qf * scale
            h = h * tl.exp(g)
            u = beta * (vf - tl.sum(h * kf[None, :], axis=1))
            h = h + u[:, None] * kf[None, :]
            o = tl.sum(h * qf[None, :], axis=1)
            tl.store(out_o + t * HV * V, o.to(o_ptr.dtype.element_ty), mask=vmask)
            # one store site for both kinds of row: candidate j (the state after j + 1
            # tokens) on spec rows, the final state to write block 0 on others
            wj = candidate_block(jw, wb, spec, j)
            if spec | (j == n - 1):
                tl.store(pool_ptr + aligned_base(head, wj, block_stride, ALIGN) + h_offs,
                         h.to(pool_ptr.dtype.element_ty), mask=hmask & (wj >= 0),
                         cache_modifier=".cs" if STREAM else "")
            q, k, v, ga, gb = q_next, k_next, v_next, ga_next, gb_next


# One kernel per op, each naming its parameters as its op's arrays (the launch ABI);
# the body is _gdn, compiled with or without the in-kernel gates.
def gated_delta_rule_kernel(
    pool_in_ptr,  # aliased with pool_ptr
    errors_in_ptr,
    q_ptr,  # [T, H, K]
    k_ptr,  # [T, H, K]
    v_ptr,  # [T, HV, V]
    g_ptr,  # [T, HV]
    beta_ptr,  # [T, HV]
    cu_seqlens_ptr,
    read_block_ptr,
    write_blocks_ptr,  # [N, WIN]
    is_spec_ptr,
    num_tokens,
    qk_stride_t,
    qk_stride_h,
    v_stride_t,
    v_stride_h,
    gate_stride,
    wb_stride,
    layer_offset,
    block_stride,
    head_stride,
    num_blocks,
    scale,
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
    V_ALIGN: tl.constexpr,
    STREAM: tl.constexpr,
    STATE_FIRST: tl.constexpr,
    HV: tl.constexpr,
    GROUP: tl.constexpr,
):
    _gdn(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, g_ptr, g_ptr, cu_seqlens_ptr,
         read_block_ptr, write_blocks_ptr, is_spec_ptr, num_tokens, qk_stride_t, qk_stride_h,
         v_stride_t, v_stride_h, gate_stride, wb_stride, layer_offset, block_stride,
         head_stride, num_blocks, scale, o_ptr, pool_ptr, errors_ptr, K, V, BK, BV, WIN,
         WIN_PAD, LAYOUT_KV, False, L2NORM, ALIGN, QK_ALIGN, V_ALIGN, STREAM, STATE_FIRST, HV,
         GROUP)


def gated_delta_rule_fused_gates_kernel(
    pool_in_ptr,  # aliased with pool_ptr
    errors_in_ptr,
    q_ptr,  # [T, H, K]
    k_ptr,  # [T, H, K]
    v_ptr,  # [T, HV, V]
    a_ptr,  # [T, HV]
    b_ptr,  # [T, HV]
    A_log_ptr,  # [HV]
    dt_bias_ptr,  # [HV]
    cu_seqlens_ptr,
    read_block_ptr,
    write_blocks_ptr,  # [N, WIN]
    is_spec_ptr,
    num_tokens,
    qk_stride_t,
    qk_stride_h,
    v_stride_t,
    v_stride_h,
    gate_stride,
    wb_stride,
    layer_offset,
    block_stride,
    head_stride,
    num_blocks,
    scale,
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
    V_ALIGN: tl.constexpr,
    STREAM: tl.constexpr,
    STATE_FIRST: tl.constexpr,
    HV: tl.constexpr,
    GROUP: tl.constexpr,
):
    _gdn(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, cu_seqlens_ptr,
         read_block_ptr, write_blocks_ptr, is_spec_ptr, num_tokens, qk_stride_t, qk_stride_h,
         v_stride_t, v_stride_h, gate_stride, wb_stride, layer_offset, block_stride,
         head_stride, num_blocks, scale, o_ptr, pool_ptr, errors_ptr, K, V, BK, BV, WIN,
         WIN_PAD, LAYOUT_KV, True, L2NORM, ALIGN, QK_ALIGN, V_ALIGN, STREAM, STATE_FIRST, HV,
         GROUP)


gated_delta_rule_kernel = same_binary_jit(gated_delta_rule_kernel)
gated_delta_rule_fused_gates_kernel = same_binary_jit(gated_delta_rule_fused_gates_kernel)
gated_delta_rule_kernel.maxnreg = REGISTER_CAP
gated_delta_rule_fused_gates_kernel.maxnreg = REGISTER_CAP

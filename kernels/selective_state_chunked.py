"""Mamba2's selective state update (docs/semantics.md §4) by chunks of ``CHUNK`` tokens:
the launch, rows, blocks and faults of :mod:`.selective_state` (whose kernel calls
:func:`selective_state_chunked` when its plan asks for ``algorithm="chunked"``), with a
row's tokens taken ``CHUNK`` at a time as matrix products: Mamba2's chunked scan.

Within a chunk of tokens ``0 .. C-1``, with ``d`` the tokens' step sizes (``dt + dt_bias``,
softplus), ``a = d * A`` their log decays, ``G_i = a_0 + ... + a_i``,
``D[i, j] = a_(j+1) + ... + a_i``, ``X = d * x`` ``[C, P]`` and ``S0`` the state ``[P, N]``
at the chunk's start:

- ``y_i = exp(G_i) S0 C_i + sum_{j <= i} exp(D[i, j]) (C_i . B_j) X_j + D_skip x_i``;
- the state after token ``i``: ``exp(G_i) S0 + sum_{j <= i} exp(D[i, j]) X_j B_j^T``
  (every candidate of a spec row; the last token's for the next chunk).

No system to solve (the update adds to the state, it never reads it), so each chunk is a
few products. They are ``tl.dot`` in fp32 at ``recurrent.DOT_PRECISION``: the rounding of
the token-by-token kernel's order, not its bits. Tiles never depend on the batch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .recurrent import chunk_advance, chunk_decays, chunk_dot, clear_faulty_row, head_offset, \
    head_program, recurrent_fault, recurrent_row, softplus, store_final_state
from .rows import aligned_base, flag_row

CHUNK = 16  # tokens per chunk (fixed: batch invariance)
BP = 32  # head-dim rows per program (at least 16: tl.dot)
NUM_WARPS = 8


@triton.jit
def _chunk_inputs(x_ptr, dt_ptr, B_ptr, C_ptr, t, live, x_head, bc_head, i_h, x_stride_t,
                  dt_stride, bc_stride_t, nn, pmask, nmask, X_ALIGN: tl.constexpr,
                  BC_ALIGN: tl.constexpr, BP: tl.constexpr):
    """The tokens ``t``'s (``[CHUNK]``) x ``[CHUNK, BP]``, dt ``[CHUNK]``, B and C
    ``[CHUNK, BN]``, as stored, zero where ``live`` is false."""
    x_rows = aligned_base(x_head, t, x_stride_t, X_ALIGN)
    x = tl.load(x_ptr + x_rows[:, None] + tl.arange(0, BP)[None, :],
                mask=live[:, None] & pmask[None, :], other=0)
    dt = tl.load(dt_ptr + t * dt_stride + i_h, mask=live, other=0)
    bc_rows = aligned_base(bc_head, t, bc_stride_t, BC_ALIGN)
    bc_mask = live[:, None] & nmask[None, :]
    b = tl.load(B_ptr + bc_rows[:, None] + nn[None, :], mask=bc_mask, other=0)
    c = tl.load(C_ptr + bc_rows[:, None] + nn[None, :], mask=bc_mask, other=0)
    return x, dt, b, c


@triton.jit
def selective_state_chunked(x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dt_bias_ptr,
                            cu_seqlens_ptr, read_block_ptr, write_blocks_ptr, is_spec_ptr,
                            num_tokens, x_stride_t, x_stride_h, dt_stride, bc_stride_t,
                            bc_stride_g, wb_stride, layer_offset, block_stride, head_stride,
                            num_blocks, y_ptr, pool_ptr, errors_ptr, P: tl.constexpr,
                            N: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
                            WIN: tl.constexpr, WIN_PAD: tl.constexpr, SOFTPLUS: tl.constexpr,
                            ALIGN: tl.constexpr, X_ALIGN: tl.constexpr, BC_ALIGN: tl.constexpr,
                            H: tl.constexpr, GROUP: tl.constexpr, CHUNK: tl.constexpr):
    """One program: a row's head ``i_h``, head-dim rows ``[i_p BP, (i_p + 1) BP)``, all its
    tokens, ``CHUNK`` at a time (the module's docstring); the arrays are
    :func:`.selective_state.selective_state_update_kernel`'s."""
    row, i_h, i_p = head_program(H, (P + BP - 1) // BP)
    t0, t1, n, rb, spec, jw, wb = recurrent_row(row, cu_seqlens_ptr, read_block_ptr,
                                                write_blocks_ptr, is_spec_ptr, wb_stride, WIN,
                                                WIN_PAD)
    nn = tl.arange(0, BN).to(tl.int64)
    pp = i_p * BP + tl.arange(0, BP).to(tl.int64)
    nmask, pmask = nn < N, pp < P
    smask = pmask[:, None] & nmask[None, :]
    s_offs = pp[:, None] * N + nn[None, :]  # the state of one head: [P, N]
    head, block_stride = head_offset(layer_offset, i_h, head_stride, block_stride, ALIGN)
    # the state [BP, BN], loaded whole before any store, as in .selective_state
    s = tl.load(pool_ptr + aligned_base(head, rb, block_stride, ALIGN) + s_offs,
                mask=smask & (rb >= 0) & (rb < num_blocks), other=0).to(tl.float32)
    A = tl.load(A_ptr + i_h).to(tl.float32)
    D = tl.load(D_ptr + i_h).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + i_h).to(tl.float32)

    fault = recurrent_fault(t0, t1, n, rb, wb, spec, num_tokens, num_blocks, WIN)
    if (i_h == 0) & (i_p == 0):
        flag_row(errors_ptr, row, fault)
    out_y = y_ptr + i_h * P + pp
    clear_faulty_row(out_y, t0, t1, H * P, fault, pmask, BP)
    if fault == 0:
        tl.debug_barrier()  # the whole initial state is loaded before any store
        r = tl.arange(0, CHUNK)
        x_head = i_h * x_stride_h + i_p * BP
        bc_head = (i_h // GROUP) * bc_stride_g
        t = t0 + r.to(tl.int64)
        live = r < n
        x_in, dt_in, b_in, c_in = _chunk_inputs(
            x_ptr, dt_ptr, B_ptr, C_ptr, t, live, x_head, bc_head, i_h, x_stride_t, dt_stride,
            bc_stride_t, nn, pmask, nmask, X_ALIGN, BC_ALIGN, BP)
        for c in range(0, n, CHUNK):
            # the next chunk's inputs, loaded while this one computes
            t_next = t + CHUNK
            live_next = c + CHUNK + r < n
            x_nx, dt_nx, b_nx, c_nx = _chunk_inputs(
                x_ptr, dt_ptr, B_ptr, C_ptr, t_next, live_next, x_head, bc_head, i_h,
                x_stride_t, dt_stride, bc_stride_t, nn, pmask, nmask, X_ALIGN, BC_ALIGN, BP)
            xf = x_in.to(tl.float32)
            bf, cf = b_in.to(tl.float32), c_in.to(tl.float32)
            d = dt_in.to(tl.float32) + dt_bias
            if SOFTPLUS:
                d = softplus(d)
            d = tl.where(live, d, 0.0)  # past the row: no step
            # and no decay (masked after the product: 0 * -inf, A = -inf, is a NaN)
            G, decay = chunk_decays(tl.where(live, d * A, 0.0), CHUNK)
            X = xf * d[:, None]
            cb = chunk_dot(cf, tl.trans(bf)) * decay  # exp(D[i, j]) (C_i . B_j), j <= i
            y = (tl.exp(G)[:, None] * chunk_dot(cf, tl.trans(s)) + chunk_dot(cb, X)
                 + D * xf)
            tl.store(out_y[None, :] + t[:, None] * H * P, y.to(y_ptr.dtype.element_ty),
                     mask=live[:, None] & pmask[None, :])
            s = chunk_advance(s, G, decay, X, bf, c, n, jw, wb, spec, pool_ptr, head,
                              block_stride, s_offs, smask, ALIGN, CHUNK)
            t, live = t_next, live_next
            x_in, dt_in, b_in, c_in = x_nx, dt_nx, b_nx, c_nx
        store_final_state(s, n, jw, wb, spec, pool_ptr, head, block_stride, s_offs, smask,
                          ALIGN)

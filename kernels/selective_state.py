"""Mamba2's selective state update with separate read and write blocks (docs/semantics.md
§4, "Mamba2 selective state update"); the reference is
:func:`mamba_align.core.selective_state_ref.selective_state_update_ref`.

The gated delta rule's program (kernels/gdn_recurrent.py) with another update: one program per
(row, head, tile of ``BP`` head-dim rows), all on grid axis 0, holding its ``[BP, N]``
slice of the state in fp32. It loads that slice of the row's initial state (zero without a
read block) completely, then runs the row's tokens in order, storing ``y`` per token and
the state to the row's write blocks: after every token on spec rows, once at the end
otherwise. Tiles never depend on the batch, so a row's bits do not either.

``algorithm="chunked"`` launches the same grid with :mod:`.selective_state_chunked`'s body
(a row's tokens by chunks, as matrix products).
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from . import selective_state_chunked as chunked
from .bookkeeping import check_errors
from .jit import same_binary_jit
from .plan import (FLAG_DTYPES, FLOAT_DTYPES, ArraySpec, LaunchPlan, Op, Output, Static, cdiv,
                   check_array, check_layer, check_pool, check_seqlens, io_align, largest_align,
                   next_pow2, pool_scalars)
from .recurrent import (STATES, candidate_block, clear_faulty_row, head_offset, head_program,
                        recurrent_fault, recurrent_row, softplus)
from .rows import aligned_base, flag_row
from .selective_state_chunked import selective_state_chunked

#: head-dim rows per program, one warp: the gated delta rule's tile (an ``[8, 128]`` fp32
#: state slice per warp, measured there: benchmarks/README.md); not yet measured here
BP = 8
NUM_WARPS = 1
#: token by token or by chunks of tokens (prefill: .selective_state_chunked)
ALGORITHMS = ("recurrent", "chunked")


@triton.jit
def _token_inputs(x_ptr, dt_ptr, B_ptr, C_ptr, t, live, x_head, bc_head, i_h, x_stride_t,
                  dt_stride, bc_stride_t, pt, nn, pmask, nmask, X_ALIGN: tl.constexpr,
                  BC_ALIGN: tl.constexpr):
    """Token ``t``'s x ``[BP]``, dt, B and C ``[BN]``, zero where ``live`` is false."""
    x = tl.load(x_ptr + aligned_base(x_head, t, x_stride_t, X_ALIGN) + pt, mask=pmask & live,
                other=0)
    dt = tl.load(dt_ptr + t * dt_stride + i_h, mask=live, other=0)
    b = tl.load(B_ptr + aligned_base(bc_head, t, bc_stride_t, BC_ALIGN) + nn, mask=nmask & live,
                other=0)
    c = tl.load(C_ptr + aligned_base(bc_head, t, bc_stride_t, BC_ALIGN) + nn, mask=nmask & live,
                other=0)
    return x, dt, b, c


# The kernel names its parameters as its op's arrays (the launch ABI); with CHUNK > 0 its
# body is .selective_state_chunked.
@same_binary_jit
def selective_state_update_kernel(
    pool_in_ptr,  # aliased with pool_ptr
    errors_in_ptr,
    x_ptr,  # [T, H, P]
    dt_ptr,  # [T, H]
    A_ptr,  # [H]
    B_ptr,  # [T, G, N]
    C_ptr,  # [T, G, N], B's strides
    D_ptr,  # [H]
    dt_bias_ptr,  # [H]
    cu_seqlens_ptr,
    read_block_ptr,
    write_blocks_ptr,  # [N_rows, WIN]
    is_spec_ptr,
    num_tokens,
    x_stride_t,
    x_stride_h,
    dt_stride,
    bc_stride_t,
    bc_stride_g,
    wb_stride,
    layer_offset,
    block_stride,
    head_stride,
    num_blocks,
    y_ptr,  # [T, H, P]
    pool_ptr,
    errors_ptr,
    P: tl.constexpr,
    N: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
    WIN: tl.constexpr,
    WIN_PAD: tl.constexpr,
    SOFTPLUS: tl.constexpr,
    ALIGN: tl.constexpr,
    X_ALIGN: tl.constexpr,
    BC_ALIGN: tl.constexpr,
    H: tl.constexpr,
    GROUP: tl.constexpr,  # H // G
    CHUNK: tl.constexpr,  # 0: token by token; else .selective_state_chunked
):
    if CHUNK > 0:
        selective_state_chunked(
            x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dt_bias_ptr, cu_seqlens_ptr,
            read_block_ptr, write_blocks_ptr, is_spec_ptr, num_tokens, x_stride_t, x_stride_h,
            dt_stride, bc_stride_t, bc_stride_g, wb_stride, layer_offset, block_stride,
            head_stride, num_blocks, y_ptr, pool_ptr, errors_ptr, P, N, BP, BN, WIN, WIN_PAD,
            SOFTPLUS, ALIGN, X_ALIGN, BC_ALIGN, H, GROUP, CHUNK)
    else:  # token by token
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
        # loaded before the row's checks are known (every address in bounds whatever the ids;
        # nothing is stored unless the row is clean), so the checks add no round trip
        s = tl.load(pool_ptr + aligned_base(head, rb, block_stride, ALIGN) + s_offs,
                    mask=smask & (rb >= 0) & (rb < num_blocks), other=0).to(tl.float32)
        A = tl.load(A_ptr + i_h).to(tl.float32)
        D = tl.load(D_ptr + i_h).to(tl.float32)
        dt_bias = tl.load(dt_bias_ptr + i_h).to(tl.float32)
        x_head = i_h * x_stride_h + i_p * BP
        bc_head = (i_h // GROUP) * bc_stride_g
        pt = tl.arange(0, BP)
        x, dt, b, c = _token_inputs(x_ptr, dt_ptr, B_ptr, C_ptr, t0,
                                    (t0 >= 0) & (t0 < num_tokens) & (n > 0), x_head, bc_head, i_h,
                                    x_stride_t, dt_stride, bc_stride_t, pt, nn, pmask, nmask,
                                    X_ALIGN, BC_ALIGN)

        fault = recurrent_fault(t0, t1, n, rb, wb, spec, num_tokens, num_blocks, WIN)
        if (i_h == 0) & (i_p == 0):
            flag_row(errors_ptr, row, fault)
        out_y = y_ptr + i_h * P + pp
        clear_faulty_row(out_y, t0, t1, H * P, fault, pmask, BP)
        if fault == 0:
            tl.debug_barrier()  # the whole initial state is loaded before any store
            for j in range(0, n):
                t = t0 + j
                # the next token's inputs, loaded while this one computes
                x_next, dt_next, b_next, c_next = _token_inputs(
                    x_ptr, dt_ptr, B_ptr, C_ptr, t + 1, j + 1 < n, x_head, bc_head, i_h, x_stride_t,
                    dt_stride, bc_stride_t, pt, nn, pmask, nmask, X_ALIGN, BC_ALIGN)
                xf = x.to(tl.float32)
                d = dt.to(tl.float32) + dt_bias
                if SOFTPLUS:
                    d = softplus(d)
                s = s * tl.exp(d * A) + (d * xf)[:, None] * b.to(tl.float32)[None, :]
                y = tl.sum(s * c.to(tl.float32)[None, :], axis=1) + D * xf
                tl.store(out_y + t * H * P, y.to(y_ptr.dtype.element_ty), mask=pmask)
                wj = candidate_block(jw, wb, spec, j)
                if spec | (j == n - 1):
                    tl.store(pool_ptr + aligned_base(head, wj, block_stride, ALIGN) + s_offs,
                             s.to(pool_ptr.dtype.element_ty), mask=smask & (wj >= 0))
                x, dt, b, c = x_next, dt_next, b_next, c_next


@functools.lru_cache(maxsize=256, typed=True)
def plan_selective_state_update(pool: ArraySpec, errors: ArraySpec, x: ArraySpec, dt: ArraySpec,
                                A: ArraySpec, B: ArraySpec, C: ArraySpec, D: ArraySpec,
                                dt_bias: ArraySpec, cu_seqlens: ArraySpec,
                                read_block: ArraySpec, write_blocks: ArraySpec,
                                is_spec: ArraySpec, *, layer: int,
                                dt_softplus: bool, algorithm: str = "recurrent") -> LaunchPlan:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    check_array("x", x, (None, None, None), FLOAT_DTYPES)
    T, H, P = x.shape
    check_array("B", B, (T, None, None), FLOAT_DTYPES)
    G, N = B.shape[1], B.shape[2]
    if H == 0 or G == 0 or H % G:
        raise ValueError(f"heads H={H} must be a positive multiple of groups G={G}")
    if P == 0 or N == 0:
        raise ValueError(f"head dim and state size must be >= 1, got P={P}, N={N}")
    check_array("C", C, (T, G, N), FLOAT_DTYPES)
    if any(b != c for b, c, n in zip(B.strides, C.strides, B.shape) if n > 1):
        # (the kernel reaches C through B's strides; those of unit dims are never used)
        raise ValueError(f"C must have B's strides {list(B.strides)}, got {list(C.strides)}")
    check_array("dt", dt, (T, H), FLOAT_DTYPES)
    for name, spec in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        check_array(name, spec, (H,), FLOAT_DTYPES)
    check_pool("pool", pool, (H, P, N))
    if pool.dtype not in STATES:
        raise TypeError(f"pool must have dtype {'/'.join(STATES)}, got {pool.dtype}")
    scal = pool_scalars(pool)
    check_layer(layer, scal["num_layers"])
    check_errors(errors)
    rows = check_seqlens(cu_seqlens)
    check_array("read_block", read_block, (rows,))
    check_array("write_blocks", write_blocks, (rows, None))
    check_array("is_spec", is_spec, (rows,), FLAG_DTYPES)
    win = write_blocks.shape[1]
    if win < 1:
        raise ValueError("write_blocks must have 1 + num_spec >= 1 columns")
    chunk = chunked.CHUNK if algorithm == "chunked" else 0
    # tl.dot needs 16 rows and columns at least
    bp = max(16, min(chunked.BP, next_pow2(P))) if chunk else min(BP, next_pow2(P))
    bn = max(16, next_pow2(N)) if chunk else next_pow2(N)
    return LaunchPlan(
        kernel=selective_state_update_kernel,
        grid=(max(1, rows * H * cdiv(P, bp)),),
        inputs=("pool", "errors", "x", "dt", "A", "B", "C", "D", "dt_bias", "cu_seqlens",
                "read_block", "write_blocks", "is_spec"),
        scalars=(("num_tokens", T), ("x_stride_t", x.strides[0]), ("x_stride_h", x.strides[1]),
                 ("dt_stride", dt.strides[0]), ("bc_stride_t", B.strides[0]),
                 ("bc_stride_g", B.strides[1]), ("wb_stride", write_blocks.strides[0]),
                 ("layer_offset", layer * scal["layer_stride"]),
                 ("block_stride", scal["block_stride"]), ("head_stride", pool.strides[2]),
                 ("num_blocks", scal["num_blocks"])),
        outputs=("y", "pool", "errors"),
        out_specs={"y": Output((T, H, P), x.dtype)},
        constexprs={"P": P, "N": N, "BP": bp, "BN": bn, "WIN": win,
                    "WIN_PAD": next_pow2(win), "SOFTPLUS": bool(dt_softplus),
                    # the state's alignment in elements, stated by the kernel (same_binary_jit)
                    "ALIGN": largest_align((scal["layer_stride"], scal["block_stride"],
                                            pool.strides[2]), 16),
                    # (x's tile offset i_p * BP is under the hint too)
                    "X_ALIGN": io_align(x, (*x.strides[:2], bp)),
                    "BC_ALIGN": io_align(B, B.strides[:2]),
                    "H": H, "GROUP": H // G, "CHUNK": chunk},
        num_warps=chunked.NUM_WARPS if chunk else NUM_WARPS,
        aliases={"pool": "pool", "errors": "errors"},
        skip=rows == 0,  # no tokens: still flag the rows' bad ids
    )


SELECTIVE_STATE_UPDATE = Op(
    name="selective_state_update",
    arrays=("pool", "errors", "x", "dt", "A", "B", "C", "D", "dt_bias", "cu_seqlens",
            "read_block", "write_blocks", "is_spec"),
    statics=(Static("layer", int), Static("dt_softplus", bool, True),
             Static("algorithm", str, "recurrent")),
    plan=plan_selective_state_update,
    mutates=("pool", "errors"),
    returns=("y",),
    skipped={"y": 0},
    doc="""Mamba2's selective state update (docs/semantics.md §4) over variable-length rows,
    for layer ``layer`` of a state pool ``[L, NB, H, P, N]`` (heads, head dim, state size),
    fp32 or bf16, updated in place. ``x``: ``[T_total, H, P]``; ``dt``: ``[T_total, H]``;
    ``A`` (negative: Mamba2's ``-exp(A_log)``), ``D``, ``dt_bias``: ``[H]``; ``B``, ``C``:
    ``[T_total, G, N]`` with the same strides in torch (``H % G == 0``: head ``h`` uses
    group ``h // (H / G)``); all fp32/fp16/bf16.
    ``cu_seqlens``: int ``[N_rows + 1]``; ``read_block`` int ``[N_rows]`` (the resolve
    step's ``temporal_read``; -1: zero state); ``write_blocks`` int ``[N_rows, 1 + S]``
    (``temporal_write``; -1: no write); ``is_spec`` ``[N_rows]`` (nonzero: the state after
    token ``j + 1`` goes to write block ``j``; otherwise the final state to write block 0).

    Per token and head, in fp32: ``d = dt + dt_bias``, then ``softplus(d)`` (linear above
    20) when ``dt_softplus`` (default on, as Mamba2 layers call it; mamba_ssm's function
    defaults to off); ``h = h * exp(d * A) + (d * x) ⊗ B``; ``y = h @ C + D * x``.
    Returns ``y`` ``[T_total, H, P]`` in ``x``'s dtype (gate it with ``rms_norm_gated``,
    as Mamba2 does). ``algorithm``: ``"recurrent"`` (token by token) or ``"chunked"`` (16
    tokens at a time as matrix products, Mamba2's chunked scan: the same results within
    rounding, not the same bits; a row's chunks start at its first token in the launch;
    not timed on the GPU).

    A row with a block it uses outside ``[-1, NB)``, a spec row of more than ``1 + S``
    tokens, or its own two ``cu_seqlens`` entries outside ``[0, T_total]`` or decreasing is
    skipped: ``y = 0`` on its tokens (none written where its entries are bad), no state
    stored, its fault ORed into ``errors`` (int32 ``[2]``, in place). Tokens outside every
    row are not written; tokens two rows share (possible only when a row is
    ``BAD_CU_SEQLENS``) are unspecified.""",
)

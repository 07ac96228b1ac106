"""Per-row read / write slots for the recurrent kernels (SPEC.md §4), after preprocess.

Inputs are the preprocess kernel's per-row outputs (``src_col``, ``src_off``,
``new_col``) and the per-slot ``acc`` it left behind. ``COPY_FREE`` selects the mode:
crossing rows then read the old column instead of the freshly copied window.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from .bookkeeping import ROWS_PER_PROGRAM, _batch_rows, _gather_col, _preprocess_rows
from .bookkeeping import plan_preprocess as _plan_preprocess
from .plan import LaunchPlan, cdiv, next_pow2


@triton.jit
def _resolve_rows(block_table_ptr, is_spec_ptr, r, in_batch, slot, live, q, src_col, src_off,
                  col, acc, bt_stride, max_cols, temporal_read_ptr, conv_read_ptr,
                  conv_read_off_ptr, temporal_write_ptr, conv_write_ptr, WIN: tl.constexpr,
                  WIN_PAD: tl.constexpr, COPY_FREE: tl.constexpr):
    """Read and write slots of this program's rows from their bookkeeping, stored."""
    spec = tl.load(is_spec_ptr + r, mask=live, other=0) != 0
    fresh = src_col < 0
    w0 = _gather_col(block_table_ptr, slot, col, bt_stride, max_cols, live)  # window column 0
    t_read = _gather_col(block_table_ptr, slot, col + acc - 1, bt_stride, max_cols, live)
    c_read = w0
    c_off = tl.where(live, acc - 1, 0)
    if COPY_FREE:
        cross = live & ~fresh & (src_col != col)
        t_old = _gather_col(block_table_ptr, slot, src_col + src_off, bt_stride, max_cols, cross)
        c_old = _gather_col(block_table_ptr, slot, src_col, bt_stride, max_cols, cross)
        t_read = tl.where(cross, t_old, t_read)
        c_read = tl.where(cross, c_old, c_read)
        c_off = tl.where(cross, src_off, c_off)
    t_read = tl.where(fresh, -1, t_read)
    c_read = tl.where(fresh, -1, c_read)
    c_off = tl.where(fresh, 0, c_off)
    tl.store(temporal_read_ptr + r, t_read, mask=in_batch)
    tl.store(conv_read_ptr + r, c_read, mask=in_batch)
    tl.store(conv_read_off_ptr + r, c_off, mask=in_batch)
    tl.store(conv_write_ptr + r, w0, mask=in_batch)

    # write slots: spec rows window columns 0 .. T-1, non-spec rows column 0 only
    j = tl.arange(0, WIN_PAD).to(tl.int64)
    n_writes = tl.where(spec, q, 1)
    wmask = live[:, None] & (j[None, :] < n_writes[:, None])
    cols = col[:, None] + j[None, :]
    ok = wmask & (cols >= 0) & (cols < max_cols)
    win = tl.load(block_table_ptr + slot[:, None] * bt_stride + cols, mask=ok, other=-1)
    out_mask = in_batch[:, None] & (j[None, :] < WIN)
    tl.store(temporal_write_ptr + r[:, None] * WIN + j[None, :], win.to(tl.int64), mask=out_mask)


@triton.jit
def resolve_kernel(
    idx_mapping_ptr,
    query_len_ptr,
    is_spec_ptr,
    block_table_ptr,
    src_col_ptr,
    src_off_ptr,
    new_col_ptr,
    acc_ptr,
    num_rows,
    num_slots,
    bt_stride,
    max_cols,
    temporal_read_ptr,
    conv_read_ptr,
    conv_read_off_ptr,
    temporal_write_ptr,  # [rows, WIN], row-major
    conv_write_ptr,
    WIN: tl.constexpr,  # 1 + S
    WIN_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
    COPY_FREE: tl.constexpr,
):
    r, in_batch, slot, live = _batch_rows(idx_mapping_ptr, num_rows, num_slots, BLOCK)
    q = tl.load(query_len_ptr + r, mask=live, other=0).to(tl.int64)
    src_col = tl.load(src_col_ptr + r, mask=live, other=-1).to(tl.int64)
    src_off = tl.load(src_off_ptr + r, mask=live, other=0).to(tl.int64)
    col = tl.load(new_col_ptr + r, mask=live, other=-1).to(tl.int64)
    acc = tl.load(acc_ptr + slot, mask=live, other=1).to(tl.int64)
    _resolve_rows(block_table_ptr, is_spec_ptr, r, in_batch, slot, live, q, src_col, src_off,
                  col, acc, bt_stride, max_cols, temporal_read_ptr, conv_read_ptr,
                  conv_read_off_ptr, temporal_write_ptr, conv_write_ptr, WIN, WIN_PAD, COPY_FREE)


@triton.jit
def preprocess_resolve_kernel(
    idx_mapping_ptr,
    query_len_ptr,
    is_spec_ptr,
    block_table_ptr,
    state_idx_in_ptr,
    acc_in_ptr,
    num_computed_ptr,  # read only
    num_rows,
    num_slots,
    block_size,
    bt_stride,
    max_cols,
    src_col_ptr,
    src_off_ptr,
    new_col_ptr,
    copy_tsrc_ptr,
    copy_csrc_ptr,
    copy_dst_ptr,
    copy_shift_ptr,
    temporal_read_ptr,
    conv_read_ptr,
    conv_read_off_ptr,
    temporal_write_ptr,  # [rows, WIN], row-major
    conv_write_ptr,
    state_idx_ptr,
    acc_ptr,
    WIN: tl.constexpr,
    WIN_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
    COPY_FREE: tl.constexpr,
):
    # preprocess then resolve, one launch: a row's slots depend on its own bookkeeping only
    r, in_batch, slot, live, q, src_col, src_off, col, acc = _preprocess_rows(
        idx_mapping_ptr, query_len_ptr, block_table_ptr, num_computed_ptr, num_rows, num_slots,
        block_size, bt_stride, max_cols, src_col_ptr, src_off_ptr, new_col_ptr, copy_tsrc_ptr,
        copy_csrc_ptr, copy_dst_ptr, copy_shift_ptr, state_idx_ptr, acc_ptr, BLOCK)
    _resolve_rows(block_table_ptr, is_spec_ptr, r, in_batch, slot, live, q, src_col, src_off,
                  col, acc, bt_stride, max_cols, temporal_read_ptr, conv_read_ptr,
                  conv_read_off_ptr, temporal_write_ptr, conv_write_ptr, WIN, WIN_PAD, COPY_FREE)


@functools.lru_cache(maxsize=256)
def plan_resolve(num_rows: int, num_spec: int, mode: str) -> LaunchPlan:
    if mode not in ("pre-copy", "copy-free"):
        raise ValueError(f"mode must be 'pre-copy' or 'copy-free', got {mode!r}")
    win = 1 + num_spec
    return LaunchPlan(
        kernel=resolve_kernel,
        grid=(max(1, cdiv(num_rows, ROWS_PER_PROGRAM)),),
        inputs=("idx_mapping", "query_len", "is_spec", "block_table", "src_col", "src_off",
                "new_col", "acc"),
        scalars=("num_rows", "num_slots", "bt_stride", "max_cols"),
        outputs=("temporal_read", "conv_read", "conv_read_off", "temporal_write", "conv_write"),
        constexprs={"WIN": win, "WIN_PAD": next_pow2(win), "BLOCK": ROWS_PER_PROGRAM,
                    "COPY_FREE": mode == "copy-free"},
    )


@functools.lru_cache(maxsize=256)
def plan_preprocess_resolve(num_rows: int, num_spec: int, mode: str) -> LaunchPlan:
    """Preprocess and resolve in one launch: the outputs of both plans (the runners' step,
    one kernel fewer to dispatch)."""
    pre, res = _plan_preprocess(num_rows), plan_resolve(num_rows, num_spec, mode)
    return LaunchPlan(
        kernel=preprocess_resolve_kernel,
        grid=pre.grid,
        inputs=("idx_mapping", "query_len", "is_spec", "block_table", "state_idx", "acc",
                "num_computed"),
        scalars=pre.scalars,
        outputs=pre.outputs[:-2] + res.outputs + ("state_idx", "acc"),
        constexprs=dict(res.constexprs),
        aliases=dict(pre.aliases),
    )

"""Preprocess fused with the resolution of the recurrent kernels' read / write blocks
(docs/semantics.md §2 step 1, §4): one launch per step.

Resolution uses the row's preprocess results (``src_col``, ``src_bias``, ``run_col``) and
the per-slot ``acc`` preprocess left behind. ``COPY_FREE`` selects the mode: crossing rows
then read the old column instead of the freshly copied window.
"""

from __future__ import annotations

import functools
from typing import Union

import triton
import triton.language as tl

from ..core.resolve import Mode, check_mode
from .bookkeeping import ROW, ROWS_PER_PROGRAM, _preprocess_rows, batch_rows, slot_arrays
from .bookkeeping import _gather_col
from .plan import ArraySpec, LaunchPlan, Op, Output, Static, cdiv, check_step_scalars, next_pow2
from .plan import table_scalars


@triton.jit
def _resolve_rows(block_table_ptr, is_spec_ptr, r, in_batch, slot, live, q, src_col, src_bias,
                  col, acc, bt_stride, max_cols, temporal_read_ptr, conv_read_ptr,
                  conv_read_bias_ptr, temporal_write_ptr, conv_write_ptr, WIN: tl.constexpr,
                  WIN_PAD: tl.constexpr, COPY_FREE: tl.constexpr):
    """The read and write blocks of this program's rows from their bookkeeping, stored."""
    spec = tl.load(is_spec_ptr + r, mask=live, other=0) != 0
    fresh = src_col < 0
    w0 = _gather_col(block_table_ptr, slot, col, bt_stride, max_cols, live)  # window column 0
    t_read = _gather_col(block_table_ptr, slot, col + acc - 1, bt_stride, max_cols, live)
    c_read = w0
    c_off = tl.where(live, acc - 1, 0)
    if COPY_FREE:
        cross = live & ~fresh & (src_col != col)
        t_old = _gather_col(block_table_ptr, slot, src_col + src_bias, bt_stride, max_cols, cross)
        c_old = _gather_col(block_table_ptr, slot, src_col, bt_stride, max_cols, cross)
        t_read = tl.where(cross, t_old, t_read)
        c_read = tl.where(cross, c_old, c_read)
        c_off = tl.where(cross, src_bias, c_off)
    t_read = tl.where(fresh, -1, t_read)
    c_read = tl.where(fresh, -1, c_read)
    c_off = tl.where(fresh, 0, c_off)
    tl.store(temporal_read_ptr + r, t_read, mask=in_batch)
    tl.store(conv_read_ptr + r, c_read, mask=in_batch)
    tl.store(conv_read_bias_ptr + r, c_off, mask=in_batch)
    tl.store(conv_write_ptr + r, w0, mask=in_batch)

    # write blocks: spec rows window columns 0 .. T-1, non-spec rows column 0 only
    j = tl.arange(0, WIN_PAD).to(tl.int64)
    n_writes = tl.where(spec, q, 1)
    wmask = live[:, None] & (j[None, :] < n_writes[:, None])
    cols = col[:, None] + j[None, :]
    ok = wmask & (cols >= 0) & (cols < max_cols)
    win = tl.load(block_table_ptr + slot[:, None] * bt_stride + cols, mask=ok, other=-1)
    out_mask = in_batch[:, None] & (j[None, :] < WIN)
    tl.store(temporal_write_ptr + r[:, None] * WIN + j[None, :], win.to(tl.int64), mask=out_mask)


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
    src_bias_ptr,
    run_col_ptr,
    copy_tsrc_ptr,
    copy_csrc_ptr,
    copy_dst_ptr,
    copy_bias_ptr,
    temporal_read_ptr,
    conv_read_ptr,
    conv_read_bias_ptr,
    temporal_write_ptr,  # [rows, WIN], row-major
    conv_write_ptr,
    state_idx_ptr,
    acc_ptr,
    WIN: tl.constexpr,
    WIN_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
    COPY_FREE: tl.constexpr,
):
    # preprocess then resolve, one launch: a row's blocks depend on its own bookkeeping only
    r, in_batch, slot, live, q, src_col, src_bias, col, acc = _preprocess_rows(
        idx_mapping_ptr, query_len_ptr, is_spec_ptr, block_table_ptr, num_computed_ptr,
        num_rows, num_slots, block_size, bt_stride, max_cols, src_col_ptr, src_bias_ptr,
        run_col_ptr, copy_tsrc_ptr, copy_csrc_ptr, copy_dst_ptr, copy_bias_ptr, state_idx_ptr,
        acc_ptr, WIN, BLOCK)
    _resolve_rows(block_table_ptr, is_spec_ptr, r, in_batch, slot, live, q, src_col, src_bias,
                  col, acc, bt_stride, max_cols, temporal_read_ptr, conv_read_ptr,
                  conv_read_bias_ptr, temporal_write_ptr, conv_write_ptr, WIN, WIN_PAD, COPY_FREE)


PER_ROW = ("src_col", "src_bias", "run_col", "copy_tsrc", "copy_csrc", "copy_dst", "copy_bias",
           "temporal_read", "conv_read", "conv_read_bias", "temporal_write", "conv_write")


@functools.lru_cache(maxsize=256, typed=True)
def plan_preprocess_resolve(state_idx: ArraySpec, acc: ArraySpec, num_computed: ArraySpec,
                            idx_mapping: ArraySpec, query_len: ArraySpec, is_spec: ArraySpec,
                            block_table: ArraySpec, *, block_size: int, num_spec: int,
                            mode: Union[Mode, str]) -> LaunchPlan:
    """Preprocess (step 1 and the pre-copy plan) and the resolution of read / write blocks
    in one launch: a row's blocks depend on its own bookkeeping only."""
    check_step_scalars(block_size, num_spec)
    mode = check_mode(mode)
    num_slots = slot_arrays(state_idx, acc, num_computed)
    rows = batch_rows(idx_mapping, query_len, is_spec)
    win = 1 + num_spec
    return LaunchPlan(
        kernel=preprocess_resolve_kernel,
        grid=(max(1, cdiv(rows, ROWS_PER_PROGRAM)),),
        inputs=("idx_mapping", "query_len", "is_spec", "block_table", "state_idx", "acc",
                "num_computed"),
        scalars=(("num_rows", rows), ("num_slots", num_slots), ("block_size", block_size))
        + table_scalars(block_table, num_slots),
        outputs=PER_ROW + ("state_idx", "acc"),
        out_specs={n: Output((rows, win) if n == "temporal_write" else (rows,), ROW)
                   for n in PER_ROW},
        constexprs={"WIN": win, "WIN_PAD": next_pow2(win), "BLOCK": ROWS_PER_PROGRAM,
                    "COPY_FREE": mode is Mode.COPY_FREE},
        aliases={"state_idx": "state_idx", "acc": "acc"},
        skip=rows == 0,
    )


PREPROCESS_RESOLVE = Op(
    name="preprocess_resolve",
    arrays=("state_idx", "acc", "num_computed", "idx_mapping", "query_len", "is_spec",
            "block_table"),
    statics=(Static("block_size", int), Static("num_spec", int), Static("mode", str)),
    plan=plan_preprocess_resolve,
    mutates=("state_idx", "acc"),
    returns=PER_ROW,
    doc="""Step 1 of docs/semantics.md §2 and the resolution of §4, one launch. Updates
    ``state_idx`` / ``acc`` (int32/int64 ``[num_slots]``) in place from ``idx_mapping``,
    ``query_len`` (int ``[rows]``), ``is_spec`` (bool/int ``[rows]``) and ``block_table``
    (int ``[>= num_slots, max_cols]``); returns per row: ``src_col``, ``src_bias``,
    ``run_col``, the pre-copy plan ``copy_tsrc`` / ``copy_csrc`` / ``copy_dst`` /
    ``copy_bias``, and the kernels' blocks ``temporal_read``, ``conv_read``,
    ``conv_read_bias``, ``temporal_write`` (``[rows, 1 + num_spec]``), ``conv_write``
    (int64; int32 in JAX without x64). ``mode``: ``"pre-copy"`` or ``"copy-free"``.
    A row the step cannot serve (no tokens; a spec row with ``query_len > 1 + num_spec``)
    changes nothing and gets no blocks (-1), like a skipped row.""",
)

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

from ..core.faults import index_max
from ..core.resolve import Mode, check_mode
from .bookkeeping import FAULT_DOC, ROW, check_errors, check_rows, row_launch, slot_arrays
from .plan import ArraySpec, LaunchPlan, Op, Output, Static, check_step_scalars, next_pow2
from .plan import table_scalars
from .rows import (BAD_IS_SPEC, BAD_QUERY_LEN, DUPLICATE_SLOT, FAULTY_SLOT, INCONSISTENT,
                   OVERFLOW, STEP_ORDER, any_fault, batch_ids, block_at, duplicated, exceeds,
                   flag, off_course)
from .rows import batch_rows


@triton.jit
def preprocess_resolve_kernel(
    idx_mapping_ptr,
    query_len_ptr,
    is_spec_ptr,
    block_table_ptr,
    state_idx_in_ptr,
    acc_in_ptr,
    num_computed_ptr,  # read only
    errors_in_ptr,
    num_rows,
    num_slots,
    block_size,
    bt_stride,
    max_cols,
    num_blocks,
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
    errors_ptr,
    WIN: tl.constexpr,
    WIN_PAD: tl.constexpr,
    NC_MAX: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    WIDTH: tl.constexpr,
    COPY_FREE: tl.constexpr,
):
    # preprocess then resolve, one launch: a row's blocks depend on its own bookkeeping only.
    # Everything is decided before anything is stored, so a faulty row stores nothing.
    r, in_batch, slot, live, fault = batch_rows(idx_mapping_ptr, num_rows, num_slots, BLOCK)
    head = batch_ids(idx_mapping_ptr, num_rows, num_slots, WIDTH)
    q = tl.load(query_len_ptr + r, mask=live, other=0).to(tl.int64)
    spec_flag = tl.load(is_spec_ptr + r, mask=live, other=0).to(tl.int64)
    spec = spec_flag != 0
    fault |= tl.where(live & (spec_flag != 0) & (spec_flag != 1), BAD_IS_SPEC, 0)
    # no tokens, or more candidates than the window holds
    fault |= tl.where(live & ((q < 1) | (spec & (q > WIN))), BAD_QUERY_LEN, 0)
    own = fault  # all a row on a duplicated slot is charged with, besides the duplicate
    # The slot's state and blocks are read as if the row owned the slot, and the duplicate
    # check comes last, so that its compares run while the block loads are in flight. A row
    # on a duplicated slot keeps nothing of what follows: another program may be marking
    # that slot faulty meanwhile, so what it reads is only ever an address inside the table.
    col = tl.load(state_idx_ptr + slot, mask=live, other=-1).to(tl.int64)
    acc = tl.load(acc_ptr + slot, mask=live, other=1).to(tl.int64)
    nc = tl.load(num_computed_ptr + slot, mask=live, other=0).to(tl.int64)
    # acc < 0: the slot's last step was never postprocessed; 0: a fault left it faulty
    fault |= tl.where(live & (acc == 0), FAULTY_SLOT, 0)
    fault |= tl.where(live & (acc < 0), STEP_ORDER, 0)
    # (a slot that is faulty or has a step in flight may sit outside the range of
    # off_course: its own fault says why)
    fault |= tl.where(live & ((col < -1) | (nc < 0) | (acc > WIN)
                              | ((acc > 0) & off_course(col, nc, block_size, WIN - 1))),
                      INCONSISTENT, 0)
    fault |= tl.where(live & exceeds(nc, q, NC_MAX), OVERFLOW, 0)
    go = live & (fault == 0)

    # step 1
    src_bias = tl.maximum(acc - 1, 0)
    # cdiv(nc + q, B) - 1 as (nc + q - 1) // B (nc + q >= 1 on a clean row): adding B - 1
    # first could wrap a sum that passed the overflow check
    new = tl.maximum(col, tl.where(nc + q > 0, (nc + q - 1) // block_size, -1))
    crossing = go & (col >= 0) & (col != new)
    acc = tl.where(crossing, 1, acc)
    reads = go & (col >= 0)  # a fresh row reads nothing: zero state, zero history

    # the blocks, each checked: window columns written (spec rows 0 .. T-1, others 0; a -1
    # drops the write), the reads and the crossing rows' old columns (pre-copy sources,
    # copy-free reads), which must exist: a non-fresh row without its state would compute
    # from a zero or stale one and later cache it. The same blocks in both modes: a
    # crossing row's temporal read in the new window is window column 0.
    j = tl.arange(0, WIN_PAD).to(tl.int64)
    n_writes = tl.where(spec, q, 1)
    writes = go[:, None] & (j[None, :] < n_writes[:, None])
    win, f_win = block_at(block_table_ptr, slot[:, None], new[:, None] + j[None, :], bt_stride,
                          max_cols, num_blocks, writes, writes & (j[None, :] < 0))
    w0, f_w0 = block_at(block_table_ptr, slot, new, bt_stride, max_cols, num_blocks, go, reads)
    t_win, f_tw = block_at(block_table_ptr, slot, new + acc - 1, bt_stride, max_cols, num_blocks,
                           reads, reads)
    t_old, f_to = block_at(block_table_ptr, slot, col + src_bias, bt_stride, max_cols,
                           num_blocks, crossing, crossing)
    c_old, f_co = block_at(block_table_ptr, slot, col, bt_stride, max_cols, num_blocks, crossing,
                           crossing)
    fault |= any_fault(f_win, 1) | f_w0 | f_tw | f_to | f_co
    dup = duplicated(idx_mapping_ptr, head, slot, live, num_rows, num_slots, CHUNK, WIDTH)
    fault = tl.where(dup, own | DUPLICATE_SLOT, fault)
    ok = live & (fault == 0)
    crossing = crossing & ok
    reads = reads & ok
    if COPY_FREE:
        t_read = tl.where(crossing, t_old, t_win)
        c_read = tl.where(crossing, c_old, w0)
        c_off = tl.where(crossing, src_bias, acc - 1)
    else:
        t_read = t_win
        c_read = w0
        c_off = acc - 1

    tl.store(state_idx_ptr + slot, new.to(state_idx_ptr.dtype.element_ty), mask=ok)
    # acc is stored negated, the mark of a step in flight that postprocess clears; a faulty
    # row leaves its slot faulty (acc = 0): no later step serves or caches it
    tl.store(acc_ptr + slot, tl.where(ok, -acc, 0).to(acc_ptr.dtype.element_ty), mask=live)
    tl.store(src_col_ptr + r, tl.where(ok, col, -1), mask=in_batch)
    tl.store(src_bias_ptr + r, tl.where(ok, src_bias, 0), mask=in_batch)
    tl.store(run_col_ptr + r, tl.where(ok, new, -1), mask=in_batch)
    # the pre-copy: copy_block(src_col, new, src_bias) on crossing rows
    tl.store(copy_tsrc_ptr + r, tl.where(crossing, t_old, -1), mask=in_batch)
    tl.store(copy_csrc_ptr + r, tl.where(crossing, c_old, -1), mask=in_batch)
    tl.store(copy_dst_ptr + r, tl.where(crossing, w0, -1), mask=in_batch)
    tl.store(copy_bias_ptr + r, tl.where(crossing, src_bias, 0), mask=in_batch)
    tl.store(temporal_read_ptr + r, tl.where(reads, t_read, -1), mask=in_batch)
    tl.store(conv_read_ptr + r, tl.where(reads, c_read, -1), mask=in_batch)
    tl.store(conv_read_bias_ptr + r, tl.where(reads, c_off, 0), mask=in_batch)
    tl.store(conv_write_ptr + r, tl.where(ok, w0, -1), mask=in_batch)
    out_mask = in_batch[:, None] & (j[None, :] < WIN)
    tl.store(temporal_write_ptr + r[:, None] * WIN + j[None, :],
             tl.where(ok[:, None], win, -1), mask=out_mask)
    flag(errors_ptr, r, fault)


PER_ROW = ("src_col", "src_bias", "run_col", "copy_tsrc", "copy_csrc", "copy_dst", "copy_bias",
           "temporal_read", "conv_read", "conv_read_bias", "temporal_write", "conv_write")


@functools.lru_cache(maxsize=256, typed=True)
def plan_preprocess_resolve(state_idx: ArraySpec, acc: ArraySpec, num_computed: ArraySpec,
                            errors: ArraySpec, idx_mapping: ArraySpec, query_len: ArraySpec,
                            is_spec: ArraySpec, block_table: ArraySpec, *, block_size: int,
                            num_spec: int, num_blocks: int,
                            mode: Union[Mode, str]) -> LaunchPlan:
    """Preprocess (step 1 and the pre-copy plan) and the resolution of read / write blocks
    in one launch: a row's blocks depend on its own bookkeeping only."""
    check_step_scalars(block_size, num_spec, num_blocks)
    mode = check_mode(mode)
    num_slots = slot_arrays(state_idx, acc, num_computed)
    check_errors(errors)
    rows = check_rows(idx_mapping, query_len, is_spec)
    win = 1 + num_spec
    return LaunchPlan(
        kernel=preprocess_resolve_kernel,
        inputs=("idx_mapping", "query_len", "is_spec", "block_table", "state_idx", "acc",
                "num_computed", "errors"),
        scalars=(("num_rows", rows), ("num_slots", num_slots), ("block_size", block_size))
        + table_scalars(block_table, num_slots) + (("num_blocks", num_blocks),),
        outputs=PER_ROW + ("state_idx", "acc", "errors"),
        out_specs={n: Output((rows, win) if n == "temporal_write" else (rows,), ROW)
                   for n in PER_ROW},
        **row_launch(rows, WIN=win, WIN_PAD=next_pow2(win),
                     NC_MAX=index_max(num_computed.dtype), COPY_FREE=mode is Mode.COPY_FREE),
        aliases={n: n for n in ("state_idx", "acc", "errors")},
        skip=rows == 0,
    )


PREPROCESS_RESOLVE = Op(
    name="preprocess_resolve",
    arrays=("state_idx", "acc", "num_computed", "errors", "idx_mapping", "query_len",
            "is_spec", "block_table"),
    statics=(Static("block_size", int), Static("num_spec", int), Static("num_blocks", int),
             Static("mode", str)),
    plan=plan_preprocess_resolve,
    mutates=("state_idx", "acc", "errors"),
    returns=PER_ROW,
    skipped={n: 0 if n.endswith("bias") else -1 for n in PER_ROW},
    doc="""Step 1 of docs/semantics.md §2 and the resolution of §4, one launch
    (``num_spec <= block_size - 1``). Updates ``state_idx`` / ``acc`` (the per-slot arrays:
    int32 or int64, one dtype, ``[num_slots]``, ``num_slots < 2**31``) in place
    from ``idx_mapping``, ``query_len`` (int ``[rows]``), ``is_spec`` (bool/int ``[rows]``)
    and ``block_table`` (int ``[>= num_slots, max_cols]``); returns per row: ``src_col``,
    ``src_bias``, ``run_col``, the pre-copy plan ``copy_tsrc`` / ``copy_csrc`` / ``copy_dst`` /
    ``copy_bias``, and the kernels' blocks ``temporal_read``, ``conv_read``,
    ``conv_read_bias``, ``temporal_write`` (``[rows, 1 + num_spec]``), ``conv_write``
    (int64; int32 in JAX without x64). ``num_blocks``: the blocks of the smallest pool;
    ``mode``: ``"pre-copy"`` or ``"copy-free"``. Faults: a bad or repeated slot, a
    faulty slot, a row without tokens or a spec row with ``query_len > 1 + num_spec``,
    ``is_spec`` not 0/1, a block the row reads or writes outside ``[1, NB)`` (-1 = no
    block) or a column outside the table, ``num_computed + query_len`` past the index
    dtype.""" + FAULT_DOC,
)

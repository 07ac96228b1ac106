"""Per-step bookkeeping kernels (SPEC.md §1-2), one program per tile of batch rows.

Every batch row maps to a distinct request slot (or -1 = skip; a slot id outside the
arrays is skipped too, so a bad slot id never writes out of bounds), so the program that
reads a slot's ``state_idx`` / ``acc`` / ``num_computed`` is the only one writing them
(duplicate slots in one batch are a precondition violation: they race). Per-slot arrays
are in place: passed as inputs and as outputs, read and written through the output
pointer. Index arrays may be int32 or int64; all arithmetic is int64. Triton divides by
truncation, so every division whose result is used has a non-negative numerator for valid
input (``(nc - 1) // B`` at ``nc = 0`` is computed and discarded).

* ``add_requests``: seed slots, ``state_idx = (num_computed - 1) // B`` (-1 when fresh).
* ``preprocess``: step 1 for every row, plus the pre-copy's physical copy plan (step 2).
* ``postprocess``: accept (step 5) and post-process (step 6): the copy plan and the
  prefix-cache column (step 7); ``acc`` is reset by the same program that read it.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from .plan import LaunchPlan, cdiv

ROWS_PER_PROGRAM = 128


@triton.jit
def add_requests_kernel(
    slots_ptr,
    new_computed_ptr,
    state_idx_in_ptr,
    acc_in_ptr,
    num_computed_in_ptr,
    num_new,
    num_slots,
    block_size,
    state_idx_ptr,
    acc_ptr,
    num_computed_ptr,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < num_new
    slot = tl.load(slots_ptr + i, mask=m, other=-1).to(tl.int64)
    m = m & (slot >= 0) & (slot < num_slots)  # an out-of-range slot writes nothing
    nc = tl.load(new_computed_ptr + i, mask=m, other=0).to(tl.int64)
    col = tl.where(nc > 0, (nc - 1) // block_size, -1)
    tl.store(state_idx_ptr + slot, col.to(state_idx_ptr.dtype.element_ty), mask=m)
    tl.store(acc_ptr + slot, tl.full(i.shape, 1, acc_ptr.dtype.element_ty), mask=m)
    tl.store(num_computed_ptr + slot, nc.to(num_computed_ptr.dtype.element_ty), mask=m)


@triton.jit
def _gather_col(bt_ptr, slot, col, bt_stride, max_cols, m):
    """``block_table[slot, col]`` where ``m`` and ``0 <= col < max_cols``, else -1."""
    ok = m & (col >= 0) & (col < max_cols)
    return tl.load(bt_ptr + slot * bt_stride + col, mask=ok, other=-1).to(tl.int64)


@triton.jit
def _batch_rows(idx_mapping_ptr, num_rows, num_slots, BLOCK: tl.constexpr):
    """This program's rows ``r``, which exist (``in_batch``), their slots, and which map to
    a slot that exists (``live``: -1 and out-of-range slots are skipped)."""
    r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_batch = r < num_rows
    slot = tl.load(idx_mapping_ptr + r, mask=in_batch, other=-1).to(tl.int64)
    live = in_batch & (slot >= 0) & (slot < num_slots)
    return r, in_batch, slot, live


@triton.jit
def _store_copy_plan(block_table_ptr, slot, src_col, dst_col, bias, on, bt_stride, max_cols,
                     tsrc_ptr, csrc_ptr, dst_ptr, shift_ptr, r, in_batch):
    """``copy_block(src_col, dst_col, bias)`` resolved to physical blocks where ``on``:
    temporal ``bt[src_col + bias]``, conv ``bt[src_col]``, destination ``bt[dst_col]``."""
    tl.store(tsrc_ptr + r, _gather_col(block_table_ptr, slot, src_col + bias, bt_stride, max_cols, on),
             mask=in_batch)
    tl.store(csrc_ptr + r, _gather_col(block_table_ptr, slot, src_col, bt_stride, max_cols, on),
             mask=in_batch)
    tl.store(dst_ptr + r, _gather_col(block_table_ptr, slot, dst_col, bt_stride, max_cols, on),
             mask=in_batch)
    tl.store(shift_ptr + r, tl.where(on, bias, 0), mask=in_batch)


@triton.jit
def _preprocess_rows(idx_mapping_ptr, query_len_ptr, block_table_ptr, num_computed_ptr,
                     num_rows, num_slots, block_size, bt_stride, max_cols,
                     src_col_ptr, src_off_ptr, new_col_ptr, copy_tsrc_ptr, copy_csrc_ptr,
                     copy_dst_ptr, copy_shift_ptr, state_idx_ptr, acc_ptr, BLOCK: tl.constexpr):
    """Step 1 and the pre-copy plan for this program's rows, stored; returns what slot
    resolution needs: rows, slots, ``live``, query lengths, ``src_col``, ``src_off``,
    ``new_col`` and the per-slot ``acc`` as left behind (1 on crossing rows)."""
    r, in_batch, slot, live = _batch_rows(idx_mapping_ptr, num_rows, num_slots, BLOCK)
    q = tl.load(query_len_ptr + r, mask=live, other=0).to(tl.int64)
    col = tl.load(state_idx_ptr + slot, mask=live, other=-1).to(tl.int64)
    acc = tl.load(acc_ptr + slot, mask=live, other=1).to(tl.int64)
    nc = tl.load(num_computed_ptr + slot, mask=live, other=0).to(tl.int64)

    src_off = tl.where(live, tl.maximum(acc - 1, 0), 0)
    last = (nc + q + block_size - 1) // block_size - 1
    new = tl.where(live, tl.maximum(col, last), -1)
    crossing = live & (col >= 0) & (col != new)

    tl.store(state_idx_ptr + slot, new.to(state_idx_ptr.dtype.element_ty), mask=live)
    tl.store(acc_ptr + slot, tl.full(r.shape, 1, acc_ptr.dtype.element_ty), mask=crossing)
    src_col = tl.where(live, col, -1)
    tl.store(src_col_ptr + r, src_col, mask=in_batch)
    tl.store(src_off_ptr + r, src_off, mask=in_batch)
    tl.store(new_col_ptr + r, new, mask=in_batch)

    # the pre-copy: copy_block(src_col, new, src_off) on crossing rows
    _store_copy_plan(block_table_ptr, slot, col, new, src_off, crossing, bt_stride, max_cols,
                     copy_tsrc_ptr, copy_csrc_ptr, copy_dst_ptr, copy_shift_ptr, r, in_batch)
    return r, in_batch, slot, live, q, src_col, src_off, new, tl.where(crossing, 1, acc)


@triton.jit
def preprocess_kernel(
    idx_mapping_ptr,
    query_len_ptr,
    block_table_ptr,
    state_idx_in_ptr,
    acc_in_ptr,
    num_computed_ptr,  # read only
    num_rows,
    num_slots,  # rows of the per-slot arrays and of the block table, whichever is fewer
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
    state_idx_ptr,
    acc_ptr,
    BLOCK: tl.constexpr,
):
    _preprocess_rows(idx_mapping_ptr, query_len_ptr, block_table_ptr, num_computed_ptr,
                     num_rows, num_slots, block_size, bt_stride, max_cols,
                     src_col_ptr, src_off_ptr, new_col_ptr, copy_tsrc_ptr, copy_csrc_ptr,
                     copy_dst_ptr, copy_shift_ptr, state_idx_ptr, acc_ptr, BLOCK)


@triton.jit
def postprocess_kernel(
    idx_mapping_ptr,
    query_len_ptr,
    is_spec_ptr,
    num_sampled_ptr,
    block_table_ptr,
    state_idx_ptr,  # read only
    acc_in_ptr,
    num_computed_in_ptr,
    num_rows,
    num_slots,  # rows of the per-slot arrays and of the block table, whichever is fewer
    block_size,
    bt_stride,
    max_cols,
    cache_col_ptr,
    copy_tsrc_ptr,
    copy_csrc_ptr,
    copy_dst_ptr,
    copy_shift_ptr,
    acc_ptr,
    num_computed_ptr,
    BLOCK: tl.constexpr,
):
    r, in_batch, slot, live = _batch_rows(idx_mapping_ptr, num_rows, num_slots, BLOCK)
    q = tl.load(query_len_ptr + r, mask=live, other=0).to(tl.int64)
    spec = tl.load(is_spec_ptr + r, mask=live, other=0) != 0
    ns = tl.load(num_sampled_ptr + r, mask=live, other=0).to(tl.int64)
    col = tl.load(state_idx_ptr + slot, mask=live, other=-1).to(tl.int64)
    nc = tl.load(num_computed_ptr + slot, mask=live, other=0).to(tl.int64)

    # accept: spec rows keep max(num_sampled, 1) candidates, others a single state; a
    # num_sampled outside [0, query_len] (bad input) is clamped rather than trusted
    ns = tl.minimum(tl.maximum(ns, 0), q)
    acc = tl.where(spec, tl.maximum(ns, 1), 1)
    nc = nc + tl.where(spec, ns, q)

    # post-process: the boundary reached by the accepted tokens, if any
    running = nc - acc + 1
    aligned = (nc // block_size) * block_size
    bias = aligned - running
    dest = aligned // block_size - 1
    # a boundary lands in the running block or the kept one before it (SPEC.md §2 step 6);
    # anything else means inconsistent bookkeeping, which must not copy or cache
    hit = live & (col >= 0) & (aligned >= running) & (aligned >= block_size)
    hit = hit & ((dest == col) | (dest == col - 1))
    same = hit & (dest == col)
    copy = hit & ~(same & (bias == 0))

    tl.store(acc_ptr + slot, tl.where(same, 1, acc).to(acc_ptr.dtype.element_ty), mask=live)
    tl.store(num_computed_ptr + slot, nc.to(num_computed_ptr.dtype.element_ty), mask=live)
    tl.store(cache_col_ptr + r, tl.where(hit, dest, -1), mask=in_batch)
    _store_copy_plan(block_table_ptr, slot, col, dest, bias, copy, bt_stride, max_cols,
                     copy_tsrc_ptr, copy_csrc_ptr, copy_dst_ptr, copy_shift_ptr, r, in_batch)


def _row_grid(num_rows: int):
    return (max(1, cdiv(num_rows, ROWS_PER_PROGRAM)),)


@functools.lru_cache(maxsize=256)
def plan_add_requests(num_new: int) -> LaunchPlan:
    return LaunchPlan(
        kernel=add_requests_kernel,
        grid=_row_grid(num_new),
        inputs=("slots", "num_computed_new", "state_idx", "acc", "num_computed"),
        scalars=("num_new", "num_slots", "block_size"),
        outputs=("state_idx", "acc", "num_computed"),
        constexprs={"BLOCK": ROWS_PER_PROGRAM},
        aliases={"state_idx": "state_idx", "acc": "acc", "num_computed": "num_computed"},
    )


@functools.lru_cache(maxsize=256)
def plan_preprocess(num_rows: int) -> LaunchPlan:
    return LaunchPlan(
        kernel=preprocess_kernel,
        grid=_row_grid(num_rows),
        inputs=("idx_mapping", "query_len", "block_table", "state_idx", "acc", "num_computed"),
        scalars=("num_rows", "num_slots", "block_size", "bt_stride", "max_cols"),
        outputs=("src_col", "src_off", "new_col", "copy_tsrc", "copy_csrc", "copy_dst",
                 "copy_shift", "state_idx", "acc"),
        constexprs={"BLOCK": ROWS_PER_PROGRAM},
        aliases={"state_idx": "state_idx", "acc": "acc"},
    )


@functools.lru_cache(maxsize=256)
def plan_postprocess(num_rows: int) -> LaunchPlan:
    return LaunchPlan(
        kernel=postprocess_kernel,
        grid=_row_grid(num_rows),
        inputs=("idx_mapping", "query_len", "is_spec", "num_sampled", "block_table",
                "state_idx", "acc", "num_computed"),
        scalars=("num_rows", "num_slots", "block_size", "bt_stride", "max_cols"),
        outputs=("cache_col", "copy_tsrc", "copy_csrc", "copy_dst", "copy_shift", "acc",
                 "num_computed"),
        constexprs={"BLOCK": ROWS_PER_PROGRAM},
        aliases={"acc": "acc", "num_computed": "num_computed"},
    )

"""Per-step bookkeeping kernels (docs/semantics.md §1-2), one program per tile of batch rows.

Every batch row maps to a distinct request slot (or -1 = skip; a slot id outside the
arrays is skipped too, so a bad slot id never writes out of bounds), so the program that
reads a slot's ``state_idx`` / ``acc`` / ``num_computed`` is the only one writing them
(duplicate slots in one batch are a precondition violation: they race). Per-slot arrays
are in place: passed as inputs and as outputs, read and written through the output
pointer. Index arrays may be int32 or int64; all arithmetic is int64. Triton divides by
truncation, so every division whose result is used has a non-negative numerator for valid
input (``(nc - 1) // B`` at ``nc = 0`` is computed and discarded).

* ``add_requests``: seed slots, ``state_idx = (num_computed - 1) // B`` (-1 when fresh).
* ``_preprocess_rows``: step 1 for every row, plus the pre-copy's physical copy plan (step
  2); launched fused with the resolution of read / write blocks (:mod:`.resolve`).
* ``postprocess``: accept (step 5) and post-process (step 6): the copy plan and the
  prefix-cache column (step 7); ``acc`` is reset by the same program that read it.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from typing import Optional

from .plan import (FLAG_DTYPES, ArraySpec, LaunchPlan, Op, Output, Static, cdiv, check_array,
                   check_step_scalars, table_scalars)

ROWS_PER_PROGRAM = 128


@triton.jit
def add_requests_kernel(
    slots_ptr,
    num_computed_new_ptr,
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
    nc = tl.load(num_computed_new_ptr + i, mask=m, other=0).to(tl.int64)
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
                     tsrc_ptr, csrc_ptr, dst_ptr, bias_ptr, r, in_batch):
    """``copy_block(src_col, dst_col, bias)`` resolved to physical blocks where ``on``:
    temporal ``bt[src_col + bias]``, conv ``bt[src_col]``, destination ``bt[dst_col]``."""
    tl.store(tsrc_ptr + r, _gather_col(block_table_ptr, slot, src_col + bias, bt_stride, max_cols, on),
             mask=in_batch)
    tl.store(csrc_ptr + r, _gather_col(block_table_ptr, slot, src_col, bt_stride, max_cols, on),
             mask=in_batch)
    tl.store(dst_ptr + r, _gather_col(block_table_ptr, slot, dst_col, bt_stride, max_cols, on),
             mask=in_batch)
    tl.store(bias_ptr + r, tl.where(on, bias, 0), mask=in_batch)


@triton.jit
def _preprocess_rows(idx_mapping_ptr, query_len_ptr, is_spec_ptr, block_table_ptr,
                     num_computed_ptr, num_rows, num_slots, block_size, bt_stride, max_cols,
                     src_col_ptr, src_bias_ptr, run_col_ptr, copy_tsrc_ptr, copy_csrc_ptr,
                     copy_dst_ptr, copy_bias_ptr, state_idx_ptr, acc_ptr, WIN: tl.constexpr,
                     BLOCK: tl.constexpr):
    """Step 1 and the pre-copy plan for this program's rows, stored; returns what block
    resolution needs: rows, slots, ``live``, query lengths, ``src_col``, ``src_bias``,
    ``run_col`` and the per-slot ``acc`` as left behind (1 on crossing rows). A row without
    tokens, or a spec row with more than ``WIN = 1 + S`` (more candidates than its window
    holds), is handled as a skipped row: it changes nothing and gets no blocks."""
    r, in_batch, slot, live = _batch_rows(idx_mapping_ptr, num_rows, num_slots, BLOCK)
    q = tl.load(query_len_ptr + r, mask=live, other=0).to(tl.int64)
    spec = tl.load(is_spec_ptr + r, mask=live, other=0) != 0
    live = live & (q >= 1) & ~(spec & (q > WIN))
    col = tl.load(state_idx_ptr + slot, mask=live, other=-1).to(tl.int64)
    acc = tl.load(acc_ptr + slot, mask=live, other=1).to(tl.int64)
    nc = tl.load(num_computed_ptr + slot, mask=live, other=0).to(tl.int64)

    src_bias = tl.where(live, tl.maximum(acc - 1, 0), 0)
    last = (nc + q + block_size - 1) // block_size - 1
    new = tl.where(live, tl.maximum(col, last), -1)
    crossing = live & (col >= 0) & (col != new)

    tl.store(state_idx_ptr + slot, new.to(state_idx_ptr.dtype.element_ty), mask=live)
    tl.store(acc_ptr + slot, tl.full(r.shape, 1, acc_ptr.dtype.element_ty), mask=crossing)
    src_col = tl.where(live, col, -1)
    tl.store(src_col_ptr + r, src_col, mask=in_batch)
    tl.store(src_bias_ptr + r, src_bias, mask=in_batch)
    tl.store(run_col_ptr + r, new, mask=in_batch)

    # the pre-copy: copy_block(src_col, new, src_bias) on crossing rows
    _store_copy_plan(block_table_ptr, slot, col, new, src_bias, crossing, bt_stride, max_cols,
                     copy_tsrc_ptr, copy_csrc_ptr, copy_dst_ptr, copy_bias_ptr, r, in_batch)
    return r, in_batch, slot, live, q, src_col, src_bias, new, tl.where(crossing, 1, acc)


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
    num_slots,  # rows of the per-slot arrays (the block table has at least as many)
    block_size,
    num_spec,
    bt_stride,
    max_cols,
    cache_col_ptr,
    copy_tsrc_ptr,
    copy_csrc_ptr,
    copy_dst_ptr,
    copy_bias_ptr,
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

    # a row whose step cannot have written its candidates as docs/semantics.md §2 says
    # (a spec row with query_len outside [1, 1 + S] or num_sampled outside [1, query_len],
    # a non-spec row without tokens) changes nothing: no bookkeeping, no copy, no cache
    fault = (q < 1) | (spec & ((q > 1 + num_spec) | (ns < 1) | (ns > q)))
    live = live & ~fault

    # accept: spec rows keep num_sampled candidates, others a single state
    acc = tl.where(spec, ns, 1)
    nc = nc + tl.where(spec, ns, q)

    # post-process: the boundary reached by the accepted tokens, if any
    running = nc - acc + 1
    aligned = (nc // block_size) * block_size
    bias = aligned - running
    dest = aligned // block_size - 1
    # a boundary lands in the running block or the kept one before it (docs/semantics.md §2 step 6);
    # anything else means inconsistent bookkeeping, which must not copy or cache
    hit = live & (col >= 0) & (aligned >= running) & (aligned >= block_size)
    hit = hit & ((dest == col) | (dest == col - 1))
    same = hit & (dest == col)
    copy = hit & ~(same & (bias == 0))

    tl.store(acc_ptr + slot, tl.where(same, 1, acc).to(acc_ptr.dtype.element_ty), mask=live)
    tl.store(num_computed_ptr + slot, nc.to(num_computed_ptr.dtype.element_ty), mask=live)
    tl.store(cache_col_ptr + r, tl.where(hit, dest, -1), mask=in_batch)
    _store_copy_plan(block_table_ptr, slot, col, dest, bias, copy, bt_stride, max_cols,
                     copy_tsrc_ptr, copy_csrc_ptr, copy_dst_ptr, copy_bias_ptr, r, in_batch)


def _row_grid(num_rows: int):
    return (max(1, cdiv(num_rows, ROWS_PER_PROGRAM)),)


ROW = "int64"  # per-row outputs (JAX without x64 stores them as int32)


def slot_arrays(state_idx: ArraySpec, acc: ArraySpec, num_computed: ArraySpec) -> int:
    """Checks the per-slot bookkeeping (int ``[num_slots]`` each); returns ``num_slots``."""
    check_array("state_idx", state_idx, (None,))
    n = state_idx.shape[0]
    check_array("acc", acc, (n,))
    check_array("num_computed", num_computed, (n,))
    return n


def batch_rows(idx_mapping: ArraySpec, query_len: ArraySpec,
               is_spec: Optional[ArraySpec] = None) -> int:
    """Checks the per-row step inputs (int ``[rows]``; ``is_spec`` bool or int, nonzero =
    true); returns ``rows``."""
    check_array("idx_mapping", idx_mapping, (None,))
    rows = idx_mapping.shape[0]
    check_array("query_len", query_len, (rows,))
    if is_spec is not None:
        check_array("is_spec", is_spec, (rows,), FLAG_DTYPES)
    return rows


@functools.lru_cache(maxsize=256, typed=True)
def plan_add_requests(state_idx: ArraySpec, acc: ArraySpec, num_computed: ArraySpec,
                      slots: ArraySpec, num_computed_new: ArraySpec, *,
                      block_size: int) -> LaunchPlan:
    check_step_scalars(block_size)
    num_slots = slot_arrays(state_idx, acc, num_computed)
    check_array("slots", slots, (None,))
    n = slots.shape[0]
    check_array("num_computed_new", num_computed_new, (n,))
    return LaunchPlan(
        kernel=add_requests_kernel,
        grid=_row_grid(n),
        inputs=("slots", "num_computed_new", "state_idx", "acc", "num_computed"),
        scalars=(("num_new", n), ("num_slots", num_slots), ("block_size", block_size)),
        outputs=("state_idx", "acc", "num_computed"),
        constexprs={"BLOCK": ROWS_PER_PROGRAM},
        aliases={"state_idx": "state_idx", "acc": "acc", "num_computed": "num_computed"},
        skip=n == 0,
    )


@functools.lru_cache(maxsize=256, typed=True)
def plan_postprocess(state_idx: ArraySpec, acc: ArraySpec, num_computed: ArraySpec,
                     idx_mapping: ArraySpec, query_len: ArraySpec, is_spec: ArraySpec,
                     num_sampled: ArraySpec, block_table: ArraySpec, *,
                     block_size: int, num_spec: int) -> LaunchPlan:
    check_step_scalars(block_size, num_spec)
    num_slots = slot_arrays(state_idx, acc, num_computed)
    rows = batch_rows(idx_mapping, query_len, is_spec)
    check_array("num_sampled", num_sampled, (rows,))
    names = ("cache_col", "copy_tsrc", "copy_csrc", "copy_dst", "copy_bias")
    return LaunchPlan(
        kernel=postprocess_kernel,
        grid=_row_grid(rows),
        inputs=("idx_mapping", "query_len", "is_spec", "num_sampled", "block_table",
                "state_idx", "acc", "num_computed"),
        scalars=(("num_rows", rows), ("num_slots", num_slots), ("block_size", block_size),
                 ("num_spec", num_spec)) + table_scalars(block_table, num_slots),
        outputs=names + ("acc", "num_computed"),
        out_specs={n: Output((rows,), ROW) for n in names},
        constexprs={"BLOCK": ROWS_PER_PROGRAM},
        aliases={"acc": "acc", "num_computed": "num_computed"},
        skip=rows == 0,
    )


ADD_REQUESTS = Op(
    name="add_requests",
    arrays=("state_idx", "acc", "num_computed", "slots", "num_computed_new"),
    statics=(Static("block_size", int),),
    plan=plan_add_requests,
    mutates=("state_idx", "acc", "num_computed"),
    returns=(),
    doc="""Seed request slots ``slots`` (int ``[n]``) with ``num_computed_new`` (int ``[n]``:
    0 when fresh, ``c·B`` after a prefix-cache hit of ``c`` blocks): ``state_idx =
    (num_computed - 1) // B``, ``acc = 1``. The per-slot arrays (int32/int64
    ``[num_slots]``) are updated in place.""",
)

POSTPROCESS = Op(
    name="postprocess",
    arrays=("state_idx", "acc", "num_computed", "idx_mapping", "query_len", "is_spec",
            "num_sampled", "block_table"),
    statics=(Static("block_size", int), Static("num_spec", int)),
    plan=plan_postprocess,
    mutates=("acc", "num_computed"),
    returns=("cache_col", "copy_tsrc", "copy_csrc", "copy_dst", "copy_bias"),
    doc="""Steps 5-7 of docs/semantics.md §2 on the device: accept ``num_sampled`` (int
    ``[rows]``), then the boundary decision. ``acc`` / ``num_computed`` are updated in
    place; returns per-row ``cache_col`` (the column whose block may enter the prefix cache,
    -1 if none) and the post-process copy plan ``copy_tsrc``, ``copy_csrc``, ``copy_dst``,
    ``copy_bias`` (int64 ``[rows]``; int32 in JAX without x64). A faulty row (a spec row
    with ``query_len`` outside ``[1, 1 + num_spec]`` or ``num_sampled`` outside ``[1,
    query_len]``, a non-spec row with ``query_len < 1``) changes nothing and gets
    ``cache_col = -1``.""",
)

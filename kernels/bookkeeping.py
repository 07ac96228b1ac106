"""Per-step bookkeeping kernels (docs/semantics.md §1-2), one program per tile of batch rows.

Per-slot arrays are in place: passed as inputs and as outputs, read and written through
the output pointer. Every batch row maps to a distinct request slot (or -1 = skip), so the
program that reads a slot's ``state_idx`` / ``acc`` / ``num_computed`` is the only one
writing them; rows that break this or any other rule are found on the device and served
as skipped rows, their slot left faulty (``acc = 0``) and the fault flagged in ``errors``
(:mod:`.rows`). Index arrays may be int32 or int64; all arithmetic is int64. Triton
divides by truncation, so every division whose result is used has a non-negative
numerator for valid input.

* ``add_requests``: seed slots, ``state_idx = (num_computed - 1) // B`` (-1 when fresh).
* ``postprocess``: accept (step 5) and post-process (step 6): the copy plan and the
  prefix-cache column (step 7); ``acc`` is reset by the same program that read it.

Preprocess (step 1, the pre-copy plan) is launched fused with the resolution of read /
write blocks (:mod:`.resolve`).
"""

from __future__ import annotations

import functools
from typing import Any, Dict, Optional

import triton
import triton.language as tl

from ..core.faults import index_max
from .plan import (FLAG_DTYPES, ArraySpec, LaunchPlan, Op, Output, Static, cdiv, check_array,
                   check_step_scalars, next_pow2, table_scalars)
from .rows import (BAD_IS_SPEC, BAD_NUM_COMPUTED, BAD_NUM_SAMPLED, BAD_QUERY_LEN,
                   DUPLICATE_SLOT, INCONSISTENT, OVERFLOW, STEP_ORDER, batch_ids, batch_rows,
                   block_at, duplicated, exceeds, flag)

#: Batch rows per program. Small, because each program also compares its rows with every
#: row of the batch (duplicate slots): more programs share that work (benchmarks/README.md).
ROWS_PER_PROGRAM = 8
#: The duplicate check (:func:`.rows.duplicated`) compares a program's rows with the
#: batch's first ``width`` ids unrolled, ``width`` the batch size rounded up to a power of
#: two within [32, DUP_UNROLL] (one compile per size bucket); larger batches compare the
#: rest ``DUP_CHUNK`` ids per loop trip. Both are multiples of 32 (the compare's parts).
DUP_CHUNK = 128
DUP_UNROLL = 1024
#: Warps per program of the bookkeeping launches (1, 2 and 8 measured: benchmarks/README.md).
WARPS = 4


@triton.jit
def add_requests_kernel(
    slots_ptr,
    num_computed_new_ptr,
    state_idx_in_ptr,
    acc_in_ptr,
    num_computed_in_ptr,
    errors_in_ptr,
    num_new,
    num_slots,
    block_size,
    state_idx_ptr,
    acc_ptr,
    num_computed_ptr,
    errors_ptr,
    NC_MAX: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    WIDTH: tl.constexpr,
):
    i, in_batch, slot, live, fault = batch_rows(slots_ptr, num_new, num_slots, BLOCK)
    head = batch_ids(slots_ptr, num_new, num_slots, WIDTH)
    fault |= tl.where(duplicated(slots_ptr, head, slot, live, num_new, num_slots, CHUNK, WIDTH),
                      DUPLICATE_SLOT, 0)
    nc = tl.load(num_computed_new_ptr + i, mask=live, other=0).to(tl.int64)
    fault |= tl.where(live & ((nc < 0) | (nc > NC_MAX)), BAD_NUM_COMPUTED, 0)
    ok = live & (fault == 0)
    col = tl.where(nc > 0, (nc - 1) // block_size, -1)
    tl.store(state_idx_ptr + slot, col.to(state_idx_ptr.dtype.element_ty), mask=ok)
    # a slot whose admission faulted is left faulty (acc = 0) rather than stale
    tl.store(acc_ptr + slot, tl.where(ok, 1, 0).to(acc_ptr.dtype.element_ty), mask=live)
    tl.store(num_computed_ptr + slot, nc.to(num_computed_ptr.dtype.element_ty), mask=ok)
    flag(errors_ptr, i, fault)


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
    errors_in_ptr,
    num_rows,
    num_slots,  # rows of the per-slot arrays (the block table has at least as many)
    block_size,
    num_spec,
    bt_stride,
    max_cols,
    num_blocks,
    cache_col_ptr,
    copy_tsrc_ptr,
    copy_csrc_ptr,
    copy_dst_ptr,
    copy_bias_ptr,
    acc_ptr,
    num_computed_ptr,
    errors_ptr,
    NC_MAX: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    WIDTH: tl.constexpr,
):
    r, in_batch, slot, live, fault = batch_rows(idx_mapping_ptr, num_rows, num_slots, BLOCK)
    head = batch_ids(idx_mapping_ptr, num_rows, num_slots, WIDTH)
    q = tl.load(query_len_ptr + r, mask=live, other=0).to(tl.int64)
    spec_flag = tl.load(is_spec_ptr + r, mask=live, other=0).to(tl.int64)
    ns = tl.load(num_sampled_ptr + r, mask=live, other=0).to(tl.int64)
    spec = spec_flag != 0
    # a row whose step cannot have written its candidates as docs/semantics.md §2 says
    # changes nothing but becoming faulty: no bookkeeping, no copy, no cache column
    row_fault = tl.where((spec_flag != 0) & (spec_flag != 1), BAD_IS_SPEC, 0)
    row_fault |= tl.where((q < 1) | (spec & (q > 1 + num_spec)), BAD_QUERY_LEN, 0)
    row_fault |= tl.where(spec & ((ns < 1) | (ns > q)), BAD_NUM_SAMPLED, 0)
    # all a row on a duplicated slot is charged with, besides the duplicate
    own = fault | tl.where(live, row_fault, 0)
    # The slot's state and blocks are read as if the row owned the slot, and the duplicate
    # check comes last, so that its compares run while the block loads are in flight. A row
    # on a duplicated slot keeps nothing of what follows: another program may be marking
    # that slot faulty meanwhile, so what it reads is only ever an address inside the table.
    col = tl.load(state_idx_ptr + slot, mask=live, other=-1).to(tl.int64)
    acc_old = tl.load(acc_ptr + slot, mask=live, other=-1).to(tl.int64)
    nc = tl.load(num_computed_ptr + slot, mask=live, other=0).to(tl.int64)
    # a faulty slot (acc = 0) was flagged when it became faulty: its rows are skipped,
    # silently; a step in flight has acc < 0 (preprocess negates it)
    served = live & (acc_old != 0)
    fault |= tl.where(served, row_fault, 0)
    fault |= tl.where(served & (acc_old > 0), STEP_ORDER, 0)
    fault |= tl.where(served & ((col < -1) | (nc < 0) | (acc_old < -1 - num_spec)),
                      INCONSISTENT, 0)

    # accept: spec rows keep num_sampled candidates, others a single state
    acc = tl.where(spec, ns, 1)
    fault |= tl.where(served & exceeds(nc, tl.where(spec, ns, q), NC_MAX), OVERFLOW, 0)
    nc = nc + tl.where(spec, ns, q)

    # post-process: the boundary reached by the accepted tokens, if any
    running = nc - acc + 1
    aligned = (nc // block_size) * block_size
    bias = aligned - running
    dest = aligned // block_size - 1
    hit = served & (fault == 0) & (aligned >= running) & (aligned >= block_size)
    # a boundary lands in the running block or the kept one before it (docs/semantics.md
    # §2 step 6); anything else is inconsistent bookkeeping (postprocess called twice?)
    fault |= tl.where(hit & (dest != col) & (dest != col - 1), INCONSISTENT, 0)
    hit = hit & (fault == 0)
    same = hit & (dest == col)
    copy = hit & ~(same & (bias == 0))
    # a -1 cached block is no block: no fault, but no cache column either (below); so is a
    # -1 copy source of a snapshot into the kept column. A copy into the running column
    # (dest == col) re-bases the row's state on its sources (the last accepted candidate,
    # the running conv block): a -1 there would lose that state, a fault as a missing read
    # block is (a later step would compute from another state and could cache it)
    none = hit & (dest < -1)  # all false
    cached, f_dst = block_at(block_table_ptr, slot, dest, bt_stride, max_cols, num_blocks, hit,
                             none)
    tsrc, f_t = block_at(block_table_ptr, slot, col + bias, bt_stride, max_cols, num_blocks, copy,
                         same)
    csrc, f_c = block_at(block_table_ptr, slot, col, bt_stride, max_cols, num_blocks, copy, same)
    fault |= f_dst | f_t | f_c
    dup = duplicated(idx_mapping_ptr, head, slot, live, num_rows, num_slots, CHUNK, WIDTH)
    fault = tl.where(dup, own | DUPLICATE_SLOT, fault)
    live = tl.where(dup, live, served)
    ok = live & (fault == 0)
    copy = copy & ok
    # the cached block holds the boundary state only if every block of its path exists
    cache = hit & ok & (cached >= 0) & (~copy | ((tsrc >= 0) & (csrc >= 0)))

    tl.store(acc_ptr + slot, tl.where(ok, tl.where(same, 1, acc), 0).to(acc_ptr.dtype.element_ty),
             mask=live)
    tl.store(num_computed_ptr + slot, nc.to(num_computed_ptr.dtype.element_ty), mask=ok)
    tl.store(cache_col_ptr + r, tl.where(cache, dest, -1), mask=in_batch)
    tl.store(copy_tsrc_ptr + r, tl.where(copy, tsrc, -1), mask=in_batch)
    tl.store(copy_csrc_ptr + r, tl.where(copy, csrc, -1), mask=in_batch)
    tl.store(copy_dst_ptr + r, tl.where(copy, cached, -1), mask=in_batch)
    tl.store(copy_bias_ptr + r, tl.where(copy, bias, 0), mask=in_batch)
    flag(errors_ptr, r, fault)


def row_launch(num_rows: int, **constexprs: Any) -> Dict[str, Any]:
    """The launch shape of a kernel over ``num_rows`` batch rows, as keyword arguments of a
    :class:`LaunchPlan`: ``grid``, ``num_warps`` and ``constexprs``, which are
    ``constexprs`` plus ``BLOCK`` (rows per program), ``CHUNK`` and ``WIDTH`` (see
    :func:`.rows.duplicated`)."""
    # a symbolic size (torch.compile's fake tensors, which only allocate) must not be
    # compared: that would pin the compiled graph to one batch size
    bucket = next_pow2(num_rows) if isinstance(num_rows, int) else DUP_UNROLL
    chunk = min(max(32, bucket), DUP_CHUNK)
    width = min(max(chunk, bucket), max(DUP_UNROLL, chunk))
    return {"grid": (max(1, cdiv(num_rows, ROWS_PER_PROGRAM)),),
            "constexprs": {**constexprs, "BLOCK": ROWS_PER_PROGRAM, "CHUNK": chunk,
                           "WIDTH": width},
            "num_warps": WARPS}


ROW = "int64"  # per-row outputs (JAX without x64 stores them as int32)


def slot_arrays(state_idx: ArraySpec, acc: ArraySpec, num_computed: ArraySpec) -> int:
    """Checks the per-slot bookkeeping (int ``[num_slots]`` each, of one dtype: the counts'
    bounds, ``index_max``, are that dtype's, so a narrower ``state_idx`` could wrap;
    ``num_slots < 2**31``: the duplicate check compares slots in 32 bits); returns
    ``num_slots``."""
    check_array("state_idx", state_idx, (None,))
    n = state_idx.shape[0]
    if isinstance(n, int) and n >= 2**31:
        raise ValueError(f"state_idx must have fewer than 2**31 slots, got {n}")
    check_array("acc", acc, (n,))
    check_array("num_computed", num_computed, (n,))
    if not state_idx.dtype == acc.dtype == num_computed.dtype:
        raise TypeError(f"state_idx, acc and num_computed must share one dtype, got "
                        f"{state_idx.dtype}, {acc.dtype} and {num_computed.dtype}")
    return n


def check_rows(idx_mapping: ArraySpec, query_len: ArraySpec,
               is_spec: Optional[ArraySpec] = None) -> int:
    """Checks the per-row step inputs (int ``[rows]``; ``is_spec`` bool or int, nonzero =
    true); returns ``rows``."""
    check_array("idx_mapping", idx_mapping, (None,))
    rows = idx_mapping.shape[0]
    check_array("query_len", query_len, (rows,))
    if is_spec is not None:
        check_array("is_spec", is_spec, (rows,), FLAG_DTYPES)
    return rows


def check_errors(errors: ArraySpec) -> None:
    """The error flag every bookkeeping op updates: int32 ``[2]`` (``[bits, row]``)."""
    check_array("errors", errors, (2,), ("int32",))


@functools.lru_cache(maxsize=256, typed=True)
def plan_add_requests(state_idx: ArraySpec, acc: ArraySpec, num_computed: ArraySpec,
                      errors: ArraySpec, slots: ArraySpec, num_computed_new: ArraySpec, *,
                      block_size: int) -> LaunchPlan:
    check_step_scalars(block_size)
    num_slots = slot_arrays(state_idx, acc, num_computed)
    check_errors(errors)
    check_array("slots", slots, (None,))
    n = slots.shape[0]
    check_array("num_computed_new", num_computed_new, (n,))
    return LaunchPlan(
        kernel=add_requests_kernel,
        inputs=("slots", "num_computed_new", "state_idx", "acc", "num_computed", "errors"),
        scalars=(("num_new", n), ("num_slots", num_slots), ("block_size", block_size)),
        outputs=("state_idx", "acc", "num_computed", "errors"),
        **row_launch(n, NC_MAX=index_max(num_computed.dtype)),
        aliases={n: n for n in ("state_idx", "acc", "num_computed", "errors")},
        skip=n == 0,
    )


@functools.lru_cache(maxsize=256, typed=True)
def plan_postprocess(state_idx: ArraySpec, acc: ArraySpec, num_computed: ArraySpec,
                     errors: ArraySpec, idx_mapping: ArraySpec, query_len: ArraySpec,
                     is_spec: ArraySpec, num_sampled: ArraySpec, block_table: ArraySpec, *,
                     block_size: int, num_spec: int, num_blocks: int) -> LaunchPlan:
    check_step_scalars(block_size, num_spec, num_blocks)
    num_slots = slot_arrays(state_idx, acc, num_computed)
    check_errors(errors)
    rows = check_rows(idx_mapping, query_len, is_spec)
    check_array("num_sampled", num_sampled, (rows,))
    names = ("cache_col", "copy_tsrc", "copy_csrc", "copy_dst", "copy_bias")
    return LaunchPlan(
        kernel=postprocess_kernel,
        inputs=("idx_mapping", "query_len", "is_spec", "num_sampled", "block_table",
                "state_idx", "acc", "num_computed", "errors"),
        scalars=(("num_rows", rows), ("num_slots", num_slots), ("block_size", block_size),
                 ("num_spec", num_spec)) + table_scalars(block_table, num_slots)
        + (("num_blocks", num_blocks),),
        outputs=names + ("acc", "num_computed", "errors"),
        out_specs={n: Output((rows,), ROW) for n in names},
        **row_launch(rows, NC_MAX=index_max(num_computed.dtype)),
        aliases={n: n for n in ("acc", "num_computed", "errors")},
        skip=rows == 0,
    )


#: What every bookkeeping op says of bad values (docs/semantics.md §1).
FAULT_DOC = """

    Bad values do not raise (that would synchronise): a row the kernel cannot trust is
    served as a skipped row (no bookkeeping, no blocks, no copy, ``cache_col = -1``), its
    slot is left faulty (``acc = 0``: skipped by every step until re-admitted) and the
    fault's bit is ORed into ``errors`` (int32 ``[2]``, ``[bits, lowest faulty row]``, in
    place; :func:`mamba_align.core.decode_errors` reads it)."""

ADD_REQUESTS = Op(
    name="add_requests",
    arrays=("state_idx", "acc", "num_computed", "errors", "slots", "num_computed_new"),
    statics=(Static("block_size", int),),
    plan=plan_add_requests,
    mutates=("state_idx", "acc", "num_computed", "errors"),
    returns=(),
    doc="""Seed request slots ``slots`` (int ``[n]``, -1 = skip) with ``num_computed_new``
    (int ``[n]``: 0 when fresh, ``c·B`` after a prefix-cache hit of ``c`` blocks):
    ``state_idx = (num_computed - 1) // B``, ``acc = 1``: the caller states that the state
    after ``num_computed_new`` tokens is in that column's block (unchecked; after a fault,
    re-admit at 0 or at a cached boundary, docs/semantics.md §1). The per-slot arrays
    (int32 or int64, one dtype, ``[num_slots]``, ``num_slots < 2**31``) are updated in
    place. Faults: a slot outside ``[-1, num_slots)``, a slot named twice,
    ``num_computed_new`` negative or past the index dtype.""" + FAULT_DOC,
)

POSTPROCESS = Op(
    name="postprocess",
    arrays=("state_idx", "acc", "num_computed", "errors", "idx_mapping", "query_len",
            "is_spec", "num_sampled", "block_table"),
    statics=(Static("block_size", int), Static("num_spec", int), Static("num_blocks", int)),
    plan=plan_postprocess,
    mutates=("acc", "num_computed", "errors"),
    returns=("cache_col", "copy_tsrc", "copy_csrc", "copy_dst", "copy_bias"),
    skipped={"cache_col": -1, "copy_tsrc": -1, "copy_csrc": -1, "copy_dst": -1, "copy_bias": 0},
    doc="""Steps 5-7 of docs/semantics.md §2 on the device: accept ``num_sampled`` (int
    ``[rows]``), then the boundary decision (``num_spec <= block_size - 1``). ``acc`` /
    ``num_computed`` (the per-slot arrays: int32 or int64, one dtype, ``[num_slots]``,
    ``num_slots < 2**31``) are updated in place; returns per-row
    ``cache_col`` (the column whose block may enter the prefix cache, -1 if none) and the
    post-process copy plan ``copy_tsrc``, ``copy_csrc``, ``copy_dst``,
    ``copy_bias`` (int64 ``[rows]``; int32 in JAX without x64). ``num_blocks``: the blocks
    of the smallest pool. Faults: a bad or repeated slot; a spec row with ``query_len``
    outside ``[1, 1 + num_spec]`` or ``num_sampled`` outside ``[1, query_len]``; a
    non-spec row with ``query_len < 1``; ``is_spec`` not 0/1; a boundary column that is
    neither ``state_idx`` nor ``state_idx - 1``; a copy or cached block outside ``[1,
    NB)`` or a column outside the table; a -1 copy source of a boundary in the running
    column (``state_idx``: the row's state would be lost); ``num_computed`` past the index
    dtype. A row whose cached block (unless it is also that source), or the copy source of
    a boundary in the kept column ``state_idx - 1``, is -1 (no block) gets no cache
    column.""" + FAULT_DOC,
)

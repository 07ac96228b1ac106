"""Row helpers the kernels share: a program's batch rows, block-table reads that check
what they read, duplicate rows, and the error flag (docs/semantics.md §1, "Bad values";
the fault bits are :class:`mamba_align.core.faults.Fault`).

A row the kernels cannot trust is served as a skipped row and its fault bits are ORed
into the error flag ``errors`` (int32 ``[2]``: ``[bits, lowest faulty row]``), an in-place
array every kernel takes (bookkeeping, copies, recurrences).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..core.faults import NO_ROW, Fault

# every fault bit as a constexpr global the kernels can read: BAD_SLOT, BAD_BLOCK, ...
globals().update({f.name: tl.constexpr(int(f)) for f in Fault})
_NO_ROW = tl.constexpr(NO_ROW)


@triton.jit
def batch_rows(ids_ptr, num_rows, num_slots, BLOCK: tl.constexpr):
    """This program's rows ``r``; which exist (``in_batch``); their slots (``ids_ptr``:
    ``idx_mapping`` or ``slots``); which name a slot (``live``: -1 skips a row); and the
    fault of a slot outside ``[-1, num_slots)``."""
    r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_batch = r < num_rows
    slot = tl.load(ids_ptr + r, mask=in_batch, other=-1).to(tl.int64)
    bad = in_batch & ((slot < -1) | (slot >= num_slots))
    live = in_batch & (slot >= 0) & ~bad
    return r, in_batch, slot, live, tl.where(bad, BAD_SLOT, 0)


#: Ids per lane row of the duplicate check's tiles: a warp's lanes (below).
LANES = tl.constexpr(32)


@triton.jit
def batch_ids(ids_ptr, num_rows, num_slots, WIDTH: tl.constexpr):
    """The batch's first ``WIDTH`` ids for :func:`duplicated`, as an int32 ``[WIDTH //
    LANES, LANES]`` tile (id ``j`` at ``[j // LANES, j % LANES]``), every id that names no
    slot (outside ``[0, num_slots)``, or past ``num_rows``) made -1: so a bad int64 id
    cannot alias a slot in 32 bits. Loaded at a kernel's start, so that the load overlaps
    the row's own loads and the compare can wait until the row's block loads are issued."""
    o = tl.arange(0, WIDTH // LANES)[:, None] * LANES + tl.arange(0, LANES)[None, :]
    return _slot_ids(tl.load(ids_ptr + o, mask=o < num_rows, other=-1), num_slots)


@triton.jit
def _slot_ids(ids, num_slots):
    return tl.where((ids >= 0) & (ids < num_slots), ids, -1).to(tl.int32)


@triton.jit
def duplicated(ids_ptr, head, slot, live, num_rows, num_slots, CHUNK: tl.constexpr,
               WIDTH: tl.constexpr):
    """Whether another of the ``num_rows`` rows names the slot of this program's live row
    (``slot``, ``[rows]``): every row of a duplicated slot is found, whatever program holds
    the other. The first ``WIDTH`` ids come in ``head`` (:func:`batch_ids`), the rest
    (batches past ``WIDTH``) are loaded ``CHUNK`` per loop trip. A live row's own id
    matches it once, so a second match is a duplicate.

    The matches are counted in a ``[chunks, rows, LANES]`` tile whose chunk axis each
    thread holds whole and whose lanes are one warp's: both sums stay inside a warp (a
    wider tile spreads the batch over warps: shared memory and CTA barriers,
    benchmarks/README.md)."""
    # whole parts of LANES ids, so that no id is counted twice
    tl.static_assert(WIDTH // LANES * LANES == WIDTH and CHUNK // LANES * LANES == CHUNK)
    mine = tl.where(live, slot, -2).to(tl.int32)  # -2: no id of the batch matches it
    n = tl.sum((head[:, None, :] == mine[None, :, None]).to(tl.int32), axis=0)
    for chunk in range(WIDTH, num_rows, CHUNK):
        for part in tl.static_range(0, CHUNK, LANES):
            o = chunk + part + tl.arange(0, LANES)
            ids = _slot_ids(tl.load(ids_ptr + o, mask=o < num_rows, other=-1), num_slots)
            n += (mine[:, None] == ids[None, :]).to(tl.int32)
    return tl.sum(n, axis=1) > 1


@triton.jit
def block_at(bt_ptr, slot, col, bt_stride, max_cols, num_blocks, use, need):
    """``block_table[slot, col]`` where ``use`` (any shapes that broadcast), checked:
    returns ``(block, fault)``. A column outside the table, a block outside ``[1, NB)``
    other than -1 (0 is the null block), or -1 where ``need`` (a block the row reads or
    copies from must exist) is a fault and reads as -1; unused entries are -1."""
    in_table = (col >= 0) & (col < max_cols)
    b = tl.load(bt_ptr + slot * bt_stride + col, mask=use & in_table, other=-1).to(tl.int64)
    bad_block = use & in_table & ((b < -1) | (b == 0) | (b >= num_blocks) | (need & (b == -1)))
    fault = tl.where(use & ~in_table, BAD_COLUMN, 0) | tl.where(bad_block, BAD_BLOCK, 0)
    return tl.where(fault == 0, b, -1), fault


@triton.jit
def exceeds(nc, add, NC_MAX: tl.constexpr):
    """``nc + add > NC_MAX`` for ``nc >= 0``, without the sum (which could wrap)."""
    return (nc >= 0) & (add > NC_MAX - nc)


@triton.jit
def off_course(col, nc, block_size, S: tl.constexpr):
    """``state_idx`` (``col``) outside what steps leave for ``num_computed`` (``nc`` >= 0):
    ``[cdiv(nc, B) - 1, cdiv(nc + S, B) - 1]`` (``core.screen``), with no sum that could
    wrap: for ``nc - 1 = a B + r``, ``cdiv(nc + S, B) - 1 - a = S // B + (r >= B - S % B)``,
    compared with ``col - a`` where ``col >= a``. Non-negative divisions only (Triton's
    integer division truncates)."""
    m = tl.maximum(nc - 1, 0)
    a = m // block_size
    r = m - a * block_size
    ahead = (col - a) > S // block_size + (r >= block_size - S % block_size)
    behind = col < a
    # nothing computed: [-1, cdiv(S, B) - 1]
    fresh = (col < -1) | (col > ((S - 1) // block_size if S > 0 else -1))
    return tl.where(nc > 0, behind | ahead, fresh) & (nc >= 0)


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def any_fault(fault, axis: tl.constexpr):
    """The OR of fault bits along ``axis``."""
    return tl.reduce(fault, axis, _or)


@triton.jit
def flag(errors_ptr, r, fault):
    """OR this program's fault bits into ``errors[0]`` and its lowest faulty row into
    ``errors[1]``: two atomics, and only in a program that found a fault."""
    bits = any_fault(fault.to(tl.int32), 0)
    if bits != 0:
        tl.atomic_or(errors_ptr, bits)
        tl.atomic_min(errors_ptr + 1, tl.min(tl.where(fault != 0, r, _NO_ROW)).to(tl.int32))


@triton.jit
def flag_row(errors_ptr, row, fault):
    """:func:`flag` for one row (scalars): two atomics, only when ``fault`` is nonzero."""
    if fault != 0:
        tl.atomic_or(errors_ptr, fault.to(tl.int32))
        tl.atomic_min(errors_ptr + 1, row.to(tl.int32))


@triton.jit
def range_fault(t0, t1, num_tokens):
    """``BAD_CU_SEQLENS`` where a row's own token range ``[t0, t1)`` (its two ``cu_seqlens``
    entries) runs backwards or leaves ``[0, num_tokens]``; a row reads no other row's
    entries (docs/semantics.md §4: good rows that overlap give unspecified outputs there)."""
    return tl.where((t0 < 0) | (t1 < t0) | (t1 > num_tokens), BAD_CU_SEQLENS, 0)


@triton.jit
def aligned_base(offset, index, stride, ALIGN: tl.constexpr):
    """``offset + index * stride``, stated to be a multiple of ``ALIGN``. The compiler does
    not carry the alignment through a product with a loaded id or a runtime stride, and
    without it every access of the state (or of an input row) is one element wide; the hint
    must be on the op that computes the sum (not on an argument), hence a helper."""
    base = offset + index * stride
    if ALIGN > 1:
        base = tl.multiple_of(base, ALIGN)
    return base

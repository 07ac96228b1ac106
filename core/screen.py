"""Which rows of a step the device path treats as faulty, and why: the kernels' rules of
docs/semantics.md §1 ("Bad values") in NumPy, without raising, so that the kernels can be
compared with a reference on bad input too.

Each function takes the arrays as the device holds them (integer NumPy arrays; ``acc``
negated on a slot whose step is in flight, 0 on a faulty slot; ``index_dtype`` names the
device's per-slot dtype, which bounds ``num_computed``) and returns the fault bits of
every row, int64 ``[rows]`` (0: a good row; see :class:`.faults.Fault`). A good row then
does exactly what the core's step functions do; a faulty row changes nothing but leaving
its slot faulty. The checks run in the kernels' order: a row's slot state and blocks are
looked at only when the cheaper checks passed (a duplicated slot's state is not read at
all).
"""

from __future__ import annotations

import numpy as np

from .faults import Fault, index_max


def _rows(idx, num_slots):
    idx = np.asarray(idx, np.int64)
    bad = (idx < -1) | (idx >= num_slots)
    live = (idx >= 0) & ~bad
    fault = np.where(bad, int(Fault.BAD_SLOT), 0).astype(np.int64)
    mine = np.where(live, idx, -1)
    dup = live & (np.array([np.count_nonzero(idx == s) for s in mine]) > 1)
    fault |= np.where(dup, int(Fault.DUPLICATE_SLOT), 0)
    return idx, live, dup, fault


def _exceeds(nc, add, index_dtype) -> np.ndarray:
    """``nc + add`` past the dtype's range (for ``nc >= 0``), without the sum."""
    return (nc >= 0) & (add > index_max(index_dtype) - nc)


def _blocks(bt, slot, col, use, num_blocks, need=False):
    """Fault bits of reading ``bt[slot, col]`` where ``use`` (``col`` [rows] or [rows, n]);
    ``need``: a -1 there is a fault too (a block the row reads must exist)."""
    bt = np.asarray(bt, np.int64)
    col = np.asarray(col, np.int64)
    use = np.broadcast_to(use.reshape(use.shape + (1,) * (col.ndim - use.ndim)), col.shape)
    s = np.broadcast_to(slot.reshape(slot.shape + (1,) * (col.ndim - 1)), col.shape)
    in_table = (col >= 0) & (col < bt.shape[1])
    b = np.full(col.shape, -1, np.int64)
    ok = use & in_table
    b[ok] = bt[s[ok], col[ok]]
    f = np.where(use & ~in_table, int(Fault.BAD_COLUMN), 0)
    f |= np.where(ok & ((b < -1) | (b == 0) | (b >= num_blocks) | (need & (b == -1))),
                  int(Fault.BAD_BLOCK), 0)
    if f.ndim == 1:
        return f
    # the row's columns flattened (-1 would be ambiguous in a batch without rows)
    return np.bitwise_or.reduce(f.reshape(f.shape[0], int(np.prod(f.shape[1:]))), axis=1)


def _off_course(col, nc, block_size, num_spec):
    """A slot's ``state_idx`` outside what steps leave for its ``num_computed`` (>= 0):
    ``[cdiv(nc, B) - 1, cdiv(nc + S, B) - 1]`` (docs/semantics.md §1), in a form that
    cannot wrap: with ``nc - 1 = a B + r``, ``cdiv(nc + S, B) - 1 - a = S // B + (r >= B -
    S % B)``, compared with ``col - a`` where ``col >= a``."""
    m = np.maximum(nc - 1, 0)
    a, r = m // block_size, m % block_size
    with np.errstate(over="ignore"):  # col - a wraps only where col < a (then "behind")
        ahead = (col - a) > num_spec // block_size + (r >= block_size - num_spec % block_size)
    behind = col < a
    fresh = (col < -1) | (col > ((num_spec - 1) // block_size if num_spec > 0 else -1))
    return (nc >= 0) & np.where(nc > 0, behind | ahead, fresh)


def screen_add_requests(num_slots: int, slots, num_computed_new, *,
                        index_dtype: str = "int64") -> np.ndarray:
    """Faults of ``add_requests`` rows; ``index_dtype``: that of the per-slot arrays."""
    slots, live, _, fault = _rows(slots, num_slots)
    nc = np.asarray(num_computed_new, np.int64)
    fault |= np.where(live & ((nc < 0) | (nc > index_max(index_dtype))),
                      int(Fault.BAD_NUM_COMPUTED), 0)
    return fault


def screen_preprocess(state_idx, acc, num_computed, idx_mapping, query_len, is_spec,
                      block_table, *, block_size: int, num_spec: int, num_blocks: int,
                      index_dtype: str = "int64") -> np.ndarray:
    """Faults of ``preprocess_resolve`` rows (both modes check the same blocks)."""
    n, win = len(state_idx), 1 + num_spec
    idx, live, dup, fault = _rows(idx_mapping, n)
    q = np.where(live, np.asarray(query_len, np.int64), 0)
    flag = np.where(live, np.asarray(is_spec).astype(np.int64), 0)
    spec = flag != 0
    fault |= np.where(live & (flag != 0) & (flag != 1), int(Fault.BAD_IS_SPEC), 0)
    fault |= np.where(live & ((q < 1) | (spec & (q > win))), int(Fault.BAD_QUERY_LEN), 0)
    sole = live & ~dup
    slot = np.where(sole, idx, 0)
    col = np.where(sole, np.asarray(state_idx, np.int64)[slot], -1)
    a = np.where(sole, np.asarray(acc, np.int64)[slot], 1)
    nc = np.where(sole, np.asarray(num_computed, np.int64)[slot], 0)
    fault |= np.where(sole & (a == 0), int(Fault.FAULTY_SLOT), 0)
    fault |= np.where(sole & (a < 0), int(Fault.STEP_ORDER), 0)
    # (a slot that is faulty or has a step in flight may sit outside the range: its own
    # fault says why)
    fault |= np.where(sole & ((col < -1) | (nc < 0) | (a > win)
                              | ((a > 0) & _off_course(col, nc, block_size, num_spec))),
                      int(Fault.INCONSISTENT), 0)
    fault |= np.where(sole & _exceeds(nc, q, index_dtype), int(Fault.OVERFLOW), 0)
    go = live & (fault == 0)
    bias = np.maximum(a - 1, 0)
    new = np.maximum(col, -(-(nc + q) // block_size) - 1)
    crossing = go & (col >= 0) & (col != new)
    a = np.where(crossing, 1, a)
    j = np.arange(win)[None, :]
    writes = np.where(spec, q, 1)[:, None] > j
    reads = go & (col >= 0)
    fault |= _blocks(block_table, slot, new[:, None] + j, go[:, None] & writes, num_blocks)
    fault |= _blocks(block_table, slot, new, go, num_blocks, need=reads)
    fault |= _blocks(block_table, slot, new + a - 1, reads, num_blocks, need=True)
    fault |= _blocks(block_table, slot, col + bias, crossing, num_blocks, need=True)
    fault |= _blocks(block_table, slot, col, crossing, num_blocks, need=True)
    return fault


def screen_postprocess(state_idx, acc, num_computed, idx_mapping, query_len, is_spec,
                       num_sampled, block_table, *, block_size: int, num_spec: int,
                       num_blocks: int, index_dtype: str = "int64") -> np.ndarray:
    """Faults of ``postprocess`` rows. A row on a faulty slot is skipped without a fault
    of its own (it was flagged when the slot became faulty)."""
    n = len(state_idx)
    idx, live, dup, fault = _rows(idx_mapping, n)
    q = np.where(live, np.asarray(query_len, np.int64), 0)
    flag = np.where(live, np.asarray(is_spec).astype(np.int64), 0)
    ns = np.where(live, np.asarray(num_sampled, np.int64), 0)
    sole = live & ~dup
    slot = np.where(sole, idx, 0)
    col = np.where(sole, np.asarray(state_idx, np.int64)[slot], -1)
    a_old = np.where(sole, np.asarray(acc, np.int64)[slot], -1)
    nc = np.where(sole, np.asarray(num_computed, np.int64)[slot], 0)
    spec = flag != 0
    live = live & (a_old != 0)
    sole = sole & live
    fault |= np.where(sole & (a_old > 0), int(Fault.STEP_ORDER), 0)
    fault |= np.where(live & (flag != 0) & (flag != 1), int(Fault.BAD_IS_SPEC), 0)
    fault |= np.where(live & ((q < 1) | (spec & (q > 1 + num_spec))), int(Fault.BAD_QUERY_LEN), 0)
    fault |= np.where(live & spec & ((ns < 1) | (ns > q)), int(Fault.BAD_NUM_SAMPLED), 0)
    fault |= np.where(sole & ((col < -1) | (nc < 0) | (a_old < -1 - num_spec)),
                      int(Fault.INCONSISTENT), 0)
    a = np.where(spec, ns, 1)
    add = np.where(spec, ns, q)
    fault |= np.where(sole & _exceeds(nc, add, index_dtype), int(Fault.OVERFLOW), 0)
    with np.errstate(over="ignore"):  # a wrapped sum only on rows faulted just above
        nc = nc + add
    running = nc - a + 1
    aligned = (nc // block_size) * block_size
    bias, dest = aligned - running, aligned // block_size - 1
    hit = live & (fault == 0) & (aligned >= running) & (aligned >= block_size)
    fault |= np.where(hit & (dest != col) & (dest != col - 1), int(Fault.INCONSISTENT), 0)
    hit = hit & (fault == 0)
    same = hit & (dest == col)
    copy = hit & ~(same & (bias == 0))
    fault |= _blocks(block_table, slot, dest, hit, num_blocks)
    # a copy into the running column re-bases the row's state on its sources: they must exist
    fault |= _blocks(block_table, slot, col + bias, copy, num_blocks, need=same)
    fault |= _blocks(block_table, slot, col, copy, num_blocks, need=same)
    return fault

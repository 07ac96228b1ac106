"""The faults the device path detects instead of raising (docs/semantics.md §1, "Bad
values"), and the sticky error flag that records them.

The kernels cannot stop a step to raise. A row they cannot trust is served as a skipped
row (it changes nothing, reads and writes no block, gets no cache column), and every
kernel ORs the fault's bit into a small per-runner int32 buffer, the **error flag**
``[bits, lowest offending row]``, which the caller reads whenever it chooses to
synchronise. :func:`decode_errors` turns it into the messages below; the core raises on
the same conditions.

On the device ``acc`` also carries a slot's phase: positive between steps, negated from
preprocess to postprocess (a step in flight: a second postprocess, or a preprocess with no
postprocess, is a fault), and 0 for a **faulty** slot, which a fault leaves behind: no step
serves it and nothing is cached for it until ``add_requests`` seeds it again.
"""

from __future__ import annotations

import enum
from typing import List, Optional

import numpy as np

#: ``errors[1]`` when no row is recorded (the kernels keep the minimum row).
NO_ROW = 2**31 - 1


def index_max(dtype: str) -> int:
    """The largest count per-slot arrays of ``dtype`` ("int32" / "int64") hold: counts past
    it are faults (``BAD_NUM_COMPUTED``, ``OVERFLOW``)."""
    return 2**31 - 1 if str(dtype) == "int32" else 2**63 - 1


class Fault(enum.IntFlag):
    """One bit per kind of fault, as the kernels OR them into ``errors[0]``."""

    BAD_SLOT = 1 << 0
    DUPLICATE_SLOT = 1 << 1
    BAD_QUERY_LEN = 1 << 2
    BAD_NUM_SAMPLED = 1 << 3
    BAD_IS_SPEC = 1 << 4
    BAD_BLOCK = 1 << 5
    BAD_COLUMN = 1 << 6
    BAD_NUM_COMPUTED = 1 << 7
    OVERFLOW = 1 << 8
    INCONSISTENT = 1 << 9
    FAULTY_SLOT = 1 << 10
    STEP_ORDER = 1 << 11
    BAD_OFFSET = 1 << 12
    BAD_CU_SEQLENS = 1 << 13
    BAD_COPY = 1 << 14


MESSAGES = {
    Fault.BAD_SLOT: "idx_mapping / slots name a slot outside [0, num_slots) (-1 skips a row)",
    Fault.DUPLICATE_SLOT: "two rows of one step name the same slot",
    Fault.BAD_QUERY_LEN: "query_len must be >= 1 on every mapped row, and <= 1 + num_spec on "
                         "spec rows; a recurrence's spec row may have at most as many tokens "
                         "as write blocks (write_blocks.shape[1]; conv1d: W - K + 2)",
    Fault.BAD_NUM_SAMPLED: "num_sampled must be in [1, query_len] on spec rows: their window no "
                           "longer holds the step's initial state (re-admit a discarded "
                           "request with add_requests)",
    Fault.BAD_IS_SPEC: "is_spec must be 0 or 1 (were num_sampled and is_spec swapped?)",
    Fault.BAD_BLOCK: "the block table names, where a row reads or writes, a block outside "
                     "[1, NB) (-1 = no block; 0 is the null block; NB: the smallest pool); "
                     "or -1 where a row reads its state or re-bases it in postprocess (a "
                     "boundary in its running column); or a recurrence's read or write "
                     "block is outside [-1, NB)",
    Fault.BAD_COLUMN: "a row reads or writes a column outside the block table",
    Fault.BAD_NUM_COMPUTED: "num_computed must be >= 0 and fit the index dtype",
    Fault.OVERFLOW: "num_computed would pass the range of the index dtype",
    Fault.INCONSISTENT: "inconsistent bookkeeping: the boundary column is neither state_idx "
                        "nor state_idx - 1, or the per-slot arrays hold impossible values",
    Fault.FAULTY_SLOT: "a step names a slot a fault left faulty: re-admit it with "
                       "add_requests",
    Fault.STEP_ORDER: "steps out of order: postprocess of a slot with no preprocess since its "
                      "last postprocess (called twice?), or preprocess of a slot whose step "
                      "was never postprocessed",
    Fault.BAD_OFFSET: "a conv read offset (conv_read_bias) outside [0, W - K + 1]: the history "
                      "would run past the block",
    Fault.BAD_CU_SEQLENS: "cu_seqlens must be non-decreasing and within [0, T_total]",
    Fault.BAD_COPY: "a copy names a physical block outside [0, NB) other than -1 (no copy), "
                    "or a conv copy's bias outside [0, W)",
}


def new_errors() -> np.ndarray:
    """A cleared error flag: int32 ``[2]`` = ``[0, NO_ROW]``."""
    return np.array([0, NO_ROW], np.int32)


def seqlen_faults(cu_seqlens: np.ndarray, num_tokens: int) -> np.ndarray:
    """``BAD_CU_SEQLENS`` on each row (int64 ``[N]``) whose own range ``[cu[r], cu[r+1])``
    is not inside ``[0, num_tokens]`` or runs backwards; 0 on the other rows. A row checks
    only its own two entries: where a bad entry makes good rows overlap, their outputs on
    the shared tokens are unspecified (docs/semantics.md §4)."""
    cu = np.asarray(cu_seqlens, np.int64)
    bad = (cu[:-1] < 0) | (cu[1:] < cu[:-1]) | (cu[1:] > num_tokens)
    return np.where(bad, int(Fault.BAD_CU_SEQLENS), 0).astype(np.int64)


def recurrent_faults(num_blocks: int, num_spec: int, seq_len: np.ndarray,
                     read_block: np.ndarray, write_blocks: np.ndarray,
                     is_spec: np.ndarray) -> np.ndarray:
    """Fault bits per row (int64 ``[rows]``) of a recurrence's launch (gated delta rule,
    selective state update) over a pool of ``num_blocks`` blocks: a read block or a used
    write block outside ``[-1, NB)``, a spec row longer than ``1 + num_spec`` tokens. Only
    the write blocks a row uses are looked at (spec: ``T``, else 1)."""
    rb, wb = np.asarray(read_block, np.int64), np.asarray(write_blocks, np.int64)
    spec = np.asarray(is_spec).astype(bool)
    seq_len = np.asarray(seq_len, np.int64)
    used = np.arange(wb.shape[1])[None, :] < np.where(spec, seq_len, 1)[:, None]
    bad_w = (used & ((wb < -1) | (wb >= num_blocks))).any(axis=1)
    bad = (rb < -1) | (rb >= num_blocks) | bad_w
    too_long = spec & (seq_len > 1 + num_spec)
    return (np.where(bad, int(Fault.BAD_BLOCK), 0)
            | np.where(too_long, int(Fault.BAD_QUERY_LEN), 0)).astype(np.int64)


def flag_of(fault) -> np.ndarray:
    """The error flag (int32 ``[2]``: ``[bits, lowest faulty row]``) a launch leaves for
    the per-row fault bits ``fault`` (int ``[rows]``, 0 = a good row) a reference returns."""
    fault = np.asarray(fault, np.int64).reshape(-1)
    rows = np.flatnonzero(fault)
    return np.array([int(np.bitwise_or.reduce(fault, initial=0)),
                     int(rows[0]) if len(rows) else NO_ROW], np.int32)


def _flag(errors) -> tuple:
    e = np.asarray(errors).reshape(-1)
    if e.shape != (2,):
        raise ValueError(f"errors must have shape [2], got {list(np.asarray(errors).shape)}")
    return int(e[0]), int(e[1])


def decode_errors(errors) -> List[str]:
    """The messages of the faults an error flag (int ``[2]``, read back to the host)
    records, in bit order; ``[]`` when it is clear."""
    bits, _ = _flag(errors)
    out = [MESSAGES[f] for f in Fault if bits & f]
    unknown = bits & ~sum(Fault)
    if unknown:
        out.append(f"unknown fault bits {unknown:#x}")
    return out


def error_row(errors) -> Optional[int]:
    """The lowest batch row (or admission row) any recorded fault came from; ``None``."""
    bits, row = _flag(errors)
    return row if bits and row != NO_ROW else None


def faulty_slots(acc) -> List[int]:
    """The slots a fault left faulty, in order: ``acc = 0`` (int ``[num_slots]``, read
    back between steps: a step in flight marks its slots negative). Each must be re-admitted
    with ``add_requests`` (at 0 or at a cached boundary) before a step names it again."""
    return [int(s) for s in np.flatnonzero(np.asarray(acc).reshape(-1) == 0)]


def raise_errors(errors, what: str = "the device path skipped faulty rows") -> None:
    """Raise ``ValueError`` with every fault an error flag records; nothing if clear."""
    msgs = decode_errors(errors)
    if msgs:
        row = error_row(errors)
        where = f" (lowest offending row: {row})" if row is not None else ""
        raise ValueError(what + where + ": " + "; ".join(msgs))


#: What a checked step (``validate=True``) raises with: nothing was launched for real.
CHECKED = "bad step input, nothing changed"

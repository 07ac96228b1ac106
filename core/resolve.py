"""The physical blocks the recurrent kernels read and write (docs/semantics.md §4), and the
modes.

Given the block table and the bookkeeping after preprocess, every batch row gets:

* ``temporal_read[b]``: the block holding the initial temporal state (-1: zero state);
* ``conv_read[b]``, ``conv_read_bias[b]``: the block and row offset of the conv history
  (-1: zero history);
* ``temporal_write[b, j]``: where the state after token ``j + 1`` goes (spec rows,
  ``j < T``) or the final state (non-spec rows, ``j = 0``); -1 elsewhere;
* ``conv_write[b]``: the block receiving the new conv window.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

import numpy as np

from .bookkeeping import PreprocessPlan, SlotState, check_slots
from .checks import bool_array, index_array, positive_int, unique_mapped

class Mode(str, enum.Enum):
    """How crossing rows reach their initial state (docs/semantics.md §3). A ``str``, so
    ``Mode.COPY_FREE == "copy-free"`` and either spelling is accepted everywhere."""

    PRE_COPY = "pre-copy"  # copy the state into the new running block before the forward
    COPY_FREE = "copy-free"  # the kernels read crossing rows from the old column

    def __str__(self) -> str:
        return self.value


MODES = tuple(m.value for m in Mode)


def check_mode(mode: Union[Mode, str]) -> Mode:
    """``mode`` as a :class:`Mode` after checking it is one (every backend resolves its
    mode once, here)."""
    try:
        return Mode(mode)
    except ValueError:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}") from None


@dataclass(frozen=True)
class KernelBlocks:
    """The blocks a step's kernels read and write, per row; int64, ``[rows]`` except
    ``temporal_write`` ``[rows, 1 + S]``. ``conv_read_bias``: the conv history starts at
    that row of ``conv_read``."""

    temporal_read: np.ndarray
    conv_read: np.ndarray
    conv_read_bias: np.ndarray
    temporal_write: np.ndarray
    conv_write: np.ndarray


def check_block_table(block_table, num_slots: int | None = None) -> np.ndarray:
    """Validate ``block_table`` (int ``[num_slots, max_cols]``, ids >= 0) and copy to int64."""
    return index_array("block_table", block_table, ndim=2, shape=(num_slots, None), low=0)


def gather_columns(block_table, idx_mapping, cols) -> np.ndarray:
    """``block_table[idx_mapping[b], cols[b, ...]]`` per row; -1 where the row is skipped or
    the column is negative. ``cols`` is int ``[rows]`` or ``[rows, n]``.
    """
    bt = check_block_table(block_table)
    idx = index_array("idx_mapping", idx_mapping, low=-1, high=bt.shape[0])
    cols = np.asarray(cols)
    c = index_array("cols", cols, ndim=cols.ndim, shape=(idx.shape[0],) + (None,) * (cols.ndim - 1))
    if c.ndim not in (1, 2):
        raise ValueError(f"cols must be 1-D or 2-D, got shape {tuple(c.shape)}")
    rows = np.broadcast_to(idx.reshape((-1,) + (1,) * (c.ndim - 1)), c.shape)
    use = (rows >= 0) & (c >= 0)
    if np.any(c[use] >= bt.shape[1]):
        bad = np.argwhere(use & (c >= bt.shape[1]))[0]
        raise ValueError(
            f"column {int(c[tuple(bad)])} of batch row {int(bad[0])} is outside the block table "
            f"(max_cols = {bt.shape[1]})"
        )
    out = np.full(c.shape, -1, np.int64)
    out[use] = bt[rows[use], c[use]]
    return out


def window_blocks(block_table, idx_mapping, run_col, num_spec: int) -> np.ndarray:
    """``bt[r, run_col[b] : run_col[b] + 1 + S]`` per batch row: int64 ``[rows, 1 + S]``.

    ``run_col`` is the running column per row (``PreprocessPlan.run_col``); rows with
    ``idx_mapping == -1`` or ``run_col < 0`` give -1.
    """
    s = positive_int("num_spec", num_spec, minimum=0)
    idx = index_array("idx_mapping", idx_mapping, low=-1)
    col = index_array("run_col", run_col, shape=(idx.shape[0],), low=-1)
    cols = col[:, None] + np.arange(1 + s)[None, :]
    cols[col < 0] = -1
    return gather_columns(block_table, idx, cols)


def resolve_blocks(
    block_table,
    idx_mapping,
    state: SlotState,
    plan: PreprocessPlan,
    query_len,
    is_spec,
    num_spec: int,
    mode: Union[Mode, str] = Mode.PRE_COPY,
) -> KernelBlocks:
    """Resolve the kernels' blocks per row after preprocess (and after the pre-copy in
    pre-copy mode).

    ``state`` is the bookkeeping returned by :func:`preprocess` (its ``acc`` already reset
    for crossing rows), ``plan`` the plan it returned. ``query_len`` int ``[rows]``;
    ``is_spec`` bool ``[rows]`` or one bool; spec rows need ``query_len <= 1 + S``.
    ``mode`` is ``"pre-copy"`` or ``"copy-free"``.
    """
    mode = check_mode(mode)
    state = check_slots(state)
    s = positive_int("num_spec", num_spec, minimum=0)
    idx = index_array("idx_mapping", idx_mapping, low=-1, high=state.num_slots)
    unique_mapped("idx_mapping", idx)
    rows = idx.shape[0]
    q = index_array("query_len", query_len, shape=(rows,), low=0)
    spec = bool_array("is_spec", is_spec, rows)
    if not isinstance(plan, PreprocessPlan):
        raise TypeError(f"plan must be a PreprocessPlan, got {type(plan).__name__}")
    src_col = index_array("plan.src_col", plan.src_col, shape=(rows,), low=-1)
    src_bias = index_array("plan.src_bias", plan.src_bias, shape=(rows,), low=0)
    col = index_array("plan.run_col", plan.run_col, shape=(rows,), low=-1)
    live = idx >= 0
    if np.any(spec & live & (q > 1 + s)):
        raise ValueError(f"spec rows need query_len <= 1 + num_spec = {1 + s}")
    if np.any(live & (col != state.state_idx[np.where(live, idx, 0)])):
        raise ValueError("plan.run_col does not match state.state_idx: pass the preprocess output")

    win = window_blocks(block_table, idx, col, s)
    acc = np.where(live, state.acc[np.where(live, idx, 0)], 1)
    if np.any(live & (acc > 1 + s)):
        raise ValueError(f"state.acc must be <= 1 + num_spec = {1 + s} on mapped slots")
    arange = np.arange(rows)
    t_read = win[arange, acc - 1]
    c_read = win[:, 0].copy()
    c_off = np.where(live, acc - 1, 0)

    fresh = src_col < 0
    if mode is Mode.COPY_FREE:
        cross = live & ~fresh & (src_col != col)
        t_read[cross] = gather_columns(block_table, idx, src_col + src_bias)[cross]
        c_read[cross] = gather_columns(block_table, idx, src_col)[cross]
        c_off[cross] = src_bias[cross]
    t_read[fresh] = -1
    c_read[fresh] = -1
    c_off[fresh] = 0

    j = np.arange(1 + s)[None, :]
    n_writes = np.where(spec, q, 1)[:, None]
    t_write = np.where(j < n_writes, win, -1)
    return KernelBlocks(t_read, c_read, c_off, t_write, win[:, 0].copy())

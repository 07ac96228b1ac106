"""Per-step bookkeeping of align mode (docs/semantics.md §1-2), vectorized over requests.

Per request slot ``r`` three integers live on the device: ``state_idx[r]`` (the running
column), ``acc[r]`` (tokens accepted by the last step, >= 1) and ``num_computed[r]``.
:class:`SlotState` holds them as int64 arrays ``[num_slots]``. Every function here is
pure: it validates its inputs, never mutates them and returns new arrays.

Batch rows ``b`` map to slots through ``idx_mapping[b]``; ``-1`` marks a row to skip
(e.g. CUDA-graph padding). Per-row outputs of skipped rows are ``-1`` (columns, slots)
or ``0`` (offsets, biases).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .checks import bool_array, index_array, positive_int, unique_mapped


@dataclass(frozen=True)
class SlotState:
    """Per-slot bookkeeping, each an int64 array ``[num_slots]``."""

    state_idx: np.ndarray
    acc: np.ndarray
    num_computed: np.ndarray

    @property
    def num_slots(self) -> int:
        return int(self.state_idx.shape[0])

    def copy(self) -> "SlotState":
        return SlotState(self.state_idx.copy(), self.acc.copy(), self.num_computed.copy())


@dataclass(frozen=True)
class PreprocessPlan:
    """Per batch row (int64 ``[rows]``): previous column, bias, new column, crossing flag."""

    src_col: np.ndarray  # previous running column, -1 when fresh or skipped
    src_bias: np.ndarray  # accepted-token bias max(acc - 1, 0)
    run_col: np.ndarray  # the row's running column (state_idx after step 1), -1 if skipped
    crossing: np.ndarray  # bool: src_col >= 0 and src_col != run_col


@dataclass(frozen=True)
class PostprocessPlan:
    """Per batch row: boundary snapshot decision after acceptance (docs/semantics.md §2 steps 6-7).

    ``copy[b]``: whether ``copy_block(src=state_idx, dst=dest, bias)`` runs;
    ``dest[b]``/``bias[b]``: its column and bias (-1/0 when no boundary was reached);
    ``cache_col[b]``: the column whose block may be recorded in the prefix cache, -1 if none;
    ``run_col[b]``: the row's running column (the copy's source column), -1 if skipped.
    """

    copy: np.ndarray
    dest: np.ndarray
    bias: np.ndarray
    cache_col: np.ndarray
    run_col: np.ndarray


def init_slots(num_slots: int) -> SlotState:
    """Empty bookkeeping for ``num_slots`` slots (``state_idx=-1, acc=1, num_computed=0``)."""
    n = positive_int("num_slots", num_slots)
    return SlotState(
        state_idx=np.full(n, -1, np.int64),
        acc=np.ones(n, np.int64),
        num_computed=np.zeros(n, np.int64),
    )


def check_slots(state: SlotState) -> SlotState:
    """Validate a :class:`SlotState` and return it with int64 copies of its arrays."""
    if not isinstance(state, SlotState):
        raise TypeError(f"state must be a SlotState, got {type(state).__name__}")
    state_idx = index_array("state.state_idx", state.state_idx, low=-1)
    n = state_idx.shape[0]
    acc = index_array("state.acc", state.acc, shape=(n,), low=1)
    num_computed = index_array("state.num_computed", state.num_computed, shape=(n,), low=0)
    return SlotState(state_idx, acc, num_computed)


def _rows(state: SlotState, idx_mapping) -> np.ndarray:
    idx = index_array("idx_mapping", idx_mapping, low=-1, high=state.num_slots)
    unique_mapped("idx_mapping", idx)
    return idx


def running_column(state_idx, num_tokens, block_size: int) -> np.ndarray:
    """``max(state_idx, cdiv(num_tokens, B) - 1)``: the column of the last scheduled token,
    never moving backwards. ``num_tokens`` counts computed plus scheduled tokens (>= 1).
    """
    b = positive_int("block_size", block_size)
    s = index_array("state_idx", state_idx, low=-1)
    n = index_array("num_tokens", num_tokens, shape=(s.shape[0],), low=1)
    return np.maximum(s, -(-n // b) - 1)


def add_requests(state: SlotState, slots, num_computed, block_size: int) -> SlotState:
    """Seed slots for new or resumed requests (also after a prefix-cache hit).

    ``slots`` and ``num_computed`` are int arrays ``[n]``; a slot gets
    ``state_idx = (num_computed - 1) // B`` (-1 when fresh, the hit block's column on a hit)
    and ``acc = 1``.
    """
    state = check_slots(state)
    b = positive_int("block_size", block_size)
    slots = index_array("slots", slots, low=0, high=state.num_slots)
    unique_mapped("slots", slots)
    nc = index_array("num_computed", num_computed, shape=(slots.shape[0],), low=0)
    out = state.copy()
    out.state_idx[slots] = (nc - 1) // b
    out.acc[slots] = 1
    out.num_computed[slots] = nc
    return out


def preprocess(state: SlotState, idx_mapping, query_len, block_size: int):
    """docs/semantics.md §2 step 1 for every batch row. Returns ``(new_state, PreprocessPlan)``.

    ``idx_mapping``: int ``[rows]`` (-1 = skip); ``query_len``: int ``[rows]``, tokens
    scheduled this step (drafts included, >= 1 for mapped rows).
    """
    state = check_slots(state)
    b = positive_int("block_size", block_size)
    idx = _rows(state, idx_mapping)
    q = index_array("query_len", query_len, shape=(idx.shape[0],), low=0)
    live = idx >= 0
    if np.any(q[live] < 1):
        raise ValueError("query_len must be >= 1 for every row whose idx_mapping is >= 0")
    slot = idx[live]
    behind = state.state_idx[slot] < -(-state.num_computed[slot] // b) - 1
    if np.any(behind):
        i = int(np.flatnonzero(behind)[0])
        raise ValueError(f"inconsistent bookkeeping for slot {int(slot[i])}: state_idx "
                         f"{int(state.state_idx[slot][i])} is behind the column of its "
                         f"{int(state.num_computed[slot][i])} computed tokens (no step leaves "
                         "that; docs/semantics.md §1)")

    src_col = np.full(idx.shape, -1, np.int64)
    src_bias = np.zeros(idx.shape, np.int64)
    run_col = np.full(idx.shape, -1, np.int64)
    src_col[live] = state.state_idx[slot]
    src_bias[live] = np.maximum(state.acc[slot] - 1, 0)
    run_col[live] = running_column(src_col[live], state.num_computed[slot] + q[live], b)
    crossing = live & (src_col >= 0) & (src_col != run_col)

    out = state.copy()
    out.state_idx[slot] = run_col[live]
    out.acc[idx[crossing]] = 1
    return out, PreprocessPlan(src_col, src_bias, run_col, crossing)


def accept(state: SlotState, idx_mapping, query_len, num_sampled, is_spec) -> SlotState:
    """docs/semantics.md §2 step 5. Spec rows: ``acc = num_sampled``, ``num_computed +=
    num_sampled``; non-spec rows: ``acc = 1``, ``num_computed += query_len``.

    ``num_sampled``: int ``[rows]`` with ``1 <= num_sampled <= query_len`` on spec rows (a
    spec row's window no longer holds its initial state: 0 cannot be accepted), unread on
    other rows;
    ``is_spec``: bool ``[rows]`` or one bool for the whole batch.
    """
    state = check_slots(state)
    idx = _rows(state, idx_mapping)
    rows = idx.shape[0]
    q = index_array("query_len", query_len, shape=(rows,), low=0)
    ns = index_array("num_sampled", num_sampled, shape=(rows,))  # read on spec rows only
    spec = bool_array("is_spec", is_spec, rows)
    live = idx >= 0
    if np.any(ns[live & spec] > q[live & spec]):
        raise ValueError("num_sampled must be <= query_len on spec rows")
    if np.any(ns[live & spec] < 1):
        raise ValueError("num_sampled must be >= 1 on spec rows: their window no longer holds "
                         "the step's initial state (re-admit a discarded request with "
                         "add_requests)")
    out = state.copy()
    s_rows, n_rows = live & spec, live & ~spec
    out.acc[idx[s_rows]] = ns[s_rows]
    out.num_computed[idx[s_rows]] += ns[s_rows]
    out.acc[idx[n_rows]] = 1
    out.num_computed[idx[n_rows]] += q[n_rows]
    return out


def postprocess(state: SlotState, idx_mapping, block_size: int):
    """docs/semantics.md §2 steps 6-7 for every batch row. Returns ``(new_state, PostprocessPlan)``.

    With ``running = num_computed - acc + 1`` and ``aligned = (num_computed // B) * B``:
    when ``aligned >= running`` (and ``aligned >= B``), ``bias = aligned - running`` and
    ``dest = aligned // B - 1``; ``acc`` is reset to 1 when ``dest == state_idx``; the copy
    runs unless ``dest == state_idx and bias == 0``. All decisions read the input ``acc``.
    """
    state = check_slots(state)
    b = positive_int("block_size", block_size)
    idx = _rows(state, idx_mapping)
    live = idx >= 0
    slot = idx[live]
    nc, acc, col = state.num_computed[slot], state.acc[slot], state.state_idx[slot]
    running = nc - acc + 1
    aligned = (nc // b) * b
    hit = (aligned >= running) & (aligned >= b)
    bias = np.where(hit, aligned - running, 0)
    dest = np.where(hit, aligned // b - 1, -1)
    bad = hit & (dest != col) & (dest != col - 1)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"inconsistent bookkeeping for slot {int(slot[i])}: boundary column {int(dest[i])} "
            f"is neither state_idx {int(col[i])} nor state_idx - 1"
        )
    same = hit & (dest == col)

    def per_row(values, fill):
        full = np.full(idx.shape, fill, values.dtype)
        full[live] = values
        return full

    out = state.copy()
    out.acc[slot[same]] = 1
    plan = PostprocessPlan(
        copy=per_row(hit & ~(same & (bias == 0)), False),
        dest=per_row(dest, -1),
        bias=per_row(bias, 0),
        cache_col=per_row(dest, -1),
        run_col=per_row(col, -1),
    )
    return out, plan

"""What one scheduler step hands to a runner (:class:`StepBatch`) and what it reports
back after the step (:class:`StepResult`), plus :func:`pad_batch` for skipped rows."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Sequence, Tuple

import numpy as np

from .checks import index_array, instance


@dataclass(frozen=True)
class StepBatch:
    """One step's input for the runner. Per batch row (``[rows]``): ``idx_mapping`` (slot,
    -1 = padding), ``query_len``, ``is_spec`` and the input ``tokens`` (drafts included);
    ``req_ids`` (-1 on padding). ``block_table`` int64 ``[max_num_seqs, max_cols]`` (0 =
    null block). ``added_slots``/``added_num_computed``: slots to seed with
    ``add_requests`` before preprocess (admissions and resumptions, hits included).
    """

    step: int
    idx_mapping: np.ndarray
    query_len: np.ndarray
    is_spec: np.ndarray
    tokens: Tuple[Tuple[int, ...], ...]
    req_ids: np.ndarray
    block_table: np.ndarray
    added_slots: np.ndarray
    added_num_computed: np.ndarray
    preempted: Tuple[int, ...] = ()

    @property
    def num_rows(self) -> int:
        return int(self.idx_mapping.shape[0])

    @property
    def cu_seqlens(self) -> np.ndarray:
        """int64 ``[rows + 1]`` prefix sums of ``query_len``."""
        return np.concatenate([[0], np.cumsum(self.query_len)]).astype(np.int64)


@dataclass(frozen=True)
class CachedBlock:
    """A block recorded in the prefix cache this step."""

    req_id: int
    column: int
    block: int
    num_tokens: int  # the state it holds is after exactly this many tokens


@dataclass(frozen=True)
class StepResult:
    cached: Tuple[CachedBlock, ...]
    finished: Tuple[int, ...]
    released: Tuple[int, ...]  # blocks whose reference this step dropped


def pad_batch(batch: StepBatch, positions: Sequence[int]) -> StepBatch:
    """Insert skipped rows (``idx_mapping = -1``) before the given row positions, as a CUDA-
    graph-padded batch would have them. ``positions`` index the padded batch."""
    instance("batch", batch, StepBatch)
    if not isinstance(positions, (Sequence, np.ndarray)):
        raise TypeError(f"positions must be a sequence of ints, got {type(positions).__name__}")
    rows = batch.num_rows + len(positions)
    is_pad = np.zeros(rows, bool)
    pos = index_array("positions", list(positions), low=0, high=max(rows, 1))
    is_pad[pos] = True
    if is_pad.sum() != len(positions):
        raise ValueError("positions must be distinct")
    real = np.flatnonzero(~is_pad)

    def spread(values, fill):
        out = np.full(rows, fill, np.asarray(values).dtype)
        out[real] = values
        return out

    tokens: List[Tuple[int, ...]] = [()] * rows
    for r, t in zip(real, batch.tokens):
        tokens[r] = t
    return replace(
        batch,
        idx_mapping=spread(batch.idx_mapping, -1),
        query_len=spread(batch.query_len, 0),
        is_spec=spread(batch.is_spec, False),
        tokens=tuple(tokens),
        req_ids=spread(batch.req_ids, -1),
    )

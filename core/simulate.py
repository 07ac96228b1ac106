"""Drive the reference scheduler, the bookkeeping and the copy reference step by step on
symbolic pools (:mod:`.symbolic`): a complete NumPy "runner" of align mode.

Every step records what each row read next to what it should have read (the labels of
the true token prefix), what it wrote, and the content of every block recorded in the
prefix cache. Tests check those records; a cache simulation study can use the same loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from .bookkeeping import SlotState, accept, add_requests, init_slots, postprocess, preprocess
from .checks import instance, optional_callable
from .config import ConvSpec
from .copy_ref import CopyPlan, apply_copy, postprocess_copy_plan, precopy_plan
from .scheduler import Scheduler
from .step_batch import CachedBlock, StepBatch
from .resolve import KernelBlocks, Mode, check_mode, resolve_blocks
from .symbolic import Labels, RowReads, conv_rows, symbolic_config, symbolic_forward
from .symbolic import symbolic_pools


@dataclass(frozen=True)
class RowRecord:
    """One batch row: what it read and what the true prefix says it should have read."""

    req_id: int
    num_computed: int  # before the step
    reads: RowReads
    expected: RowReads
    writes: Tuple[int, ...]  # every block the row's kernels and copies wrote

    @property
    def ok(self) -> bool:
        return self.reads == self.expected


@dataclass(frozen=True)
class StepRecord:
    batch: StepBatch
    num_sampled: np.ndarray
    blocks: KernelBlocks
    precopy: Optional[CopyPlan]
    postcopy: CopyPlan
    rows: Tuple[RowRecord, ...]
    cached: Tuple[Tuple[CachedBlock, RowReads, RowReads], ...]  # (block, content, expected)
    cached_at_forward: frozenset  # blocks in the prefix cache while the kernels ran
    finished: Tuple[int, ...]


class SymbolicRunner:
    """Runs ``scheduler`` on label pools in ``mode`` (``"pre-copy"`` or ``"copy-free"``).

    ``pad(batch) -> batch`` may insert skipped rows (e.g. :func:`~.step_batch.pad_batch`).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        mode: str = "pre-copy",
        pad: Optional[Callable[[StepBatch], StepBatch]] = None,
    ) -> None:
        instance("scheduler", scheduler, Scheduler)
        mode = check_mode(mode)
        optional_callable("pad", pad)
        self.sched = scheduler
        self.config = scheduler.config
        self.sym = symbolic_config(self.config)
        self.mode = mode
        self.pad = pad
        self.labels = Labels()
        self.pools = symbolic_pools(self.config, scheduler.pool.num_blocks)
        self.state: SlotState = init_slots(scheduler.max_num_seqs)  # the "device" copy
        self._truth: Dict[int, List[int]] = {}
        self.block_copies = 0  # block copies, counted once per state pool

    # -- expected labels -------------------------------------------------------------
    def prefix_label(self, req_id: int, n: int) -> int:
        """Label of the first ``n`` true tokens of ``req_id`` (0 for the empty prefix)."""
        if req_id not in self._truth:
            self._truth[req_id] = self.labels.chain(self.sched.requests[req_id].tokens)
        return 0 if n == 0 else self._truth[req_id][n - 1]

    def expected_state(self, req_id: int, n: int) -> RowReads:
        """The temporal labels and conv history after exactly ``n`` true tokens."""
        temporal, conv = {}, {}
        for name, spec in self.sym.states.items():
            if isinstance(spec, ConvSpec):
                k = spec.kernel_size
                conv[name] = tuple(
                    self.prefix_label(req_id, p + 1) if p >= 0 else 0 for p in range(n - k + 1, n)
                )
            else:
                temporal[name] = self.prefix_label(req_id, n)
        return RowReads(temporal, conv)

    def block_state(self, block: int) -> RowReads:
        """Temporal labels and conv rows ``0 .. K-2`` held by a physical block."""
        temporal, conv = {}, {}
        for name, spec in self.sym.states.items():
            pool = self.pools[name]
            if isinstance(spec, ConvSpec):
                rows = conv_rows(pool, spec.layout, block)[: spec.kernel_size - 1]
                conv[name] = tuple(int(x) for x in rows)
            else:
                temporal[name] = int(pool[0, block, 0])
        return RowReads(temporal, conv)

    # -- one step --------------------------------------------------------------------
    def step(self) -> StepRecord:
        sched, b_size, s = self.sched, self.config.block_size, self.config.num_spec
        batch = sched.schedule()
        if self.pad is not None:
            batch = self.pad(batch)
        idx, q, spec, bt = batch.idx_mapping, batch.query_len, batch.is_spec, batch.block_table
        cached_at_forward = frozenset(sched.pool.cached_blocks().values())

        state = add_requests(self.state, batch.added_slots, batch.added_num_computed, b_size)
        live = idx >= 0
        nc_before = np.where(live, state.num_computed[np.where(live, idx, 0)], 0)
        state, pre = preprocess(state, idx, q, b_size)
        pre_plan = None
        if self.mode is Mode.PRE_COPY:
            pre_plan = precopy_plan(bt, idx, pre)
            self._copy(pre_plan)
        blocks = resolve_blocks(bt, idx, state, pre, q, spec, s, self.mode)
        prefix = [self.prefix_label(int(r), int(n)) if r >= 0 else 0
                  for r, n in zip(batch.req_ids, nc_before)]
        reads = symbolic_forward(self.pools, self.sym, blocks, batch.tokens, prefix, spec,
                                 self.labels)

        ns = sched.sample(batch)
        state = accept(state, idx, q, ns, spec)
        state, post = postprocess(state, idx, b_size)
        post_plan = postprocess_copy_plan(bt, idx, post)
        self._copy(post_plan)
        self.state = state
        result = sched.update(batch, ns)

        rows = []
        for b in np.flatnonzero(live):
            rid, n = int(batch.req_ids[b]), int(nc_before[b])
            writes = [int(x) for x in blocks.temporal_write[b] if x >= 0] + [int(blocks.conv_write[b])]
            for plan in (pre_plan, post_plan):
                if plan is not None and plan.active[b]:
                    writes.append(int(plan.dst[b]))
            rows.append(RowRecord(rid, n, reads[b], self.expected_state(rid, n), tuple(writes)))
        cached = tuple(
            (c, self.block_state(c.block), self.expected_state(c.req_id, c.num_tokens))
            for c in result.cached
        )
        return StepRecord(batch, ns, blocks, pre_plan, post_plan, tuple(rows), cached,
                          cached_at_forward, result.finished)

    def _copy(self, plan: CopyPlan) -> None:
        apply_copy(self.pools, self.sym, plan)
        self.block_copies += int(plan.active.sum()) * len(self.sym.states)

    def run(self, max_steps: int = 100_000) -> List[StepRecord]:
        """Step until every request finished; returns the records."""
        out = []
        while self.sched.has_unfinished():
            if len(out) >= max_steps:
                raise RuntimeError(f"requests still unfinished after {max_steps} steps")
            out.append(self.step())
        return out

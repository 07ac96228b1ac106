"""A reference scheduler for the recurrent-state group in align mode.

Deterministic and framework-free: it admits requests, cuts prefill chunks at block
boundaries under a token budget (a prompt's tail shorter than a block runs as its own
last chunk, so the largest block-aligned prefix of every prompt gets a boundary
snapshot), schedules decode steps with up to ``S`` draft tokens, allocates and rotates state blocks as docs/semantics.md §1 "Block lifetime" requires, records
boundary snapshots in a prefix cache (docs/semantics.md §2 step 7), preempts when blocks run out
and resumes from the cache. Each :meth:`Scheduler.schedule` emits a :class:`StepBatch`
that a runner (NumPy, torch or JAX) feeds to the bookkeeping and the kernels; after the
forward pass :meth:`Scheduler.update` takes the sampler's ``num_sampled``.

The scheduler holds each request's full token sequence (prompt and the outputs the model
"will" produce), so a draft is correct exactly when it equals the next true token. This
makes acceptance checkable and lets a simulation label every state by its token prefix.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .block_pool import BlockPool
from .bookkeeping import SlotState, accept, add_requests, init_slots, postprocess, preprocess
from .bookkeeping import running_column
from .checks import index_array, instance, optional_callable, positive_int, token_ids
from .config import CacheConfig
from .step_batch import CachedBlock, StepBatch, StepResult


@dataclass
class Request:
    """A request's host-side record. ``tokens`` is the whole sequence (prompt + outputs)."""

    req_id: int
    tokens: Tuple[int, ...]
    prompt_len: int
    known: int  # tokens known so far: prompt plus everything sampled
    num_computed: int = 0
    slot: int = -1
    state_idx: int = -1
    has_window: bool = False  # the 1 + S window blocks are allocated
    prefill_done: bool = False  # the last prefill chunk ran and a token was sampled
    status: str = "waiting"  # waiting | running | finished
    hit_tokens: int = 0  # tokens served from the prefix cache at the latest admission
    prompt_hit_tokens: int = 0  # ... at its first admission: prompt tokens only
    cached_tokens: int = 0  # ... summed over its admissions (a preempted one comes back)
    num_preemptions: int = 0

    @property
    def total_len(self) -> int:
        return len(self.tokens)


#: ``drafter(request, max_drafts) -> draft token ids`` (at most ``max_drafts`` of them).
Drafter = Callable[[Request, int], Sequence[int]]


def exact_drafter(request: Request, max_drafts: int) -> List[int]:
    """Proposes ``max_drafts`` drafts, all correct (the true next tokens)."""
    return list(request.tokens[request.known : request.known + max_drafts])


def random_drafter(seed: int) -> Drafter:
    """A drafter proposing a random number of drafts of which a random leading part is
    correct; wrong drafts are token -2, which no true token equals. Deterministic in
    ``(seed, request, position, max_drafts)``, so two runs of one workload that schedule
    alike (e.g. pre-copy and copy-free) see the same drafts; runs that leave a row another
    token budget (prefix caching on and off) may not."""

    def drafter(request: Request, max_drafts: int) -> List[int]:
        rng = random.Random(hash((seed, request.req_id, request.known, max_drafts)))
        true = list(request.tokens[request.known : request.known + max_drafts])
        n = rng.randint(0, len(true))
        ok = rng.randint(0, n)
        return true[:ok] + [-2] * (n - ok)

    return drafter


class Scheduler:
    """Reference scheduler for one state group (see module docstring).

    ``num_blocks`` physical blocks (block 0 is null), ``max_num_seqs`` request slots,
    ``max_num_tokens`` tokens per step, ``max_model_len`` tokens per request.
    """

    def __init__(
        self,
        config: CacheConfig,
        num_blocks: int,
        max_num_seqs: int,
        max_num_tokens: int,
        max_model_len: int,
        drafter: Optional[Drafter] = None,
        enable_prefix_caching: bool = True,
    ) -> None:
        if not isinstance(config, CacheConfig):
            raise TypeError(f"config must be a CacheConfig, got {type(config).__name__}")
        self.config = config
        self.block_size = config.block_size
        self.num_spec = config.num_spec
        self.pool = BlockPool(num_blocks)
        self.max_num_seqs = positive_int("max_num_seqs", max_num_seqs)
        self.max_num_tokens = positive_int("max_num_tokens", max_num_tokens)
        self.max_model_len = positive_int("max_model_len", max_model_len)
        if num_blocks - 1 < 2 + config.num_spec + 1:
            raise ValueError(
                f"num_blocks must be >= {4 + config.num_spec} so one request fits "
                f"(window 1 + S, the kept block and a hit block, plus the null block)"
            )
        if self.max_num_tokens < self.block_size:
            raise ValueError(
                f"max_num_tokens must be >= block_size = {self.block_size} so every prefill "
                f"chunk can reach a block boundary, got {self.max_num_tokens}"
            )
        self.max_cols = config.columns_needed(self.max_model_len)
        self.drafter: Drafter = optional_callable("drafter", drafter) or exact_drafter
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.block_table = np.zeros((self.max_num_seqs, self.max_cols), np.int64)
        self.slots: SlotState = init_slots(self.max_num_seqs)  # host mirror of the runner's
        self.requests: Dict[int, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: List[Request] = []
        self._free_slots: List[int] = list(range(self.max_num_seqs))
        self._by_slot: Dict[int, Request] = {}
        self._step = 0
        self._last: Optional[StepBatch] = None

    # -- requests --------------------------------------------------------------------
    def add_request(self, req_id: int, prompt: Sequence[int], output: Sequence[int]) -> None:
        """Queue a request: ``prompt`` token ids (>= 1) and the ``output`` ids it will produce
        (>= 1). Prompt plus output must fit in ``max_model_len``."""
        if isinstance(req_id, bool):
            raise TypeError(f"req_id must be an int, got {type(req_id).__name__}")
        if not isinstance(req_id, int) or req_id < 0 or req_id in self.requests:
            raise ValueError(f"req_id must be a new int >= 0, got {req_id!r}")
        prompt, output = token_ids("prompt", prompt), token_ids("output", output)
        if not prompt or not output:
            raise ValueError("prompt and output must each hold at least one token")
        if len(prompt) + len(output) > self.max_model_len:
            raise ValueError(
                f"prompt + output = {len(prompt) + len(output)} tokens exceeds max_model_len "
                f"= {self.max_model_len}"
            )
        for name, ids in (("prompt", prompt), ("output", output)):
            if min(ids) < 0:
                raise ValueError(
                    f"{name} token ids must be >= 0 (negative ids are reserved for wrong "
                    f"drafts), got {min(ids)}"
                )
        req = Request(req_id, prompt + output, len(prompt), known=len(prompt))
        self.requests[req_id] = req
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def blocks_of(self, req: Request) -> Dict[int, int]:
        """``{column: block}`` of a running request's non-null block-table entries."""
        if req.slot < 0:
            return {}
        row = self.block_table[req.slot]
        return {int(c): int(row[c]) for c in np.flatnonzero(row)}

    # -- scheduling ------------------------------------------------------------------
    def schedule(self) -> StepBatch:
        """Pick this step's rows, allocate their windows and return the batch."""
        if self._last is not None:
            raise RuntimeError("update() must be called with the previous batch first")
        budget = self.max_num_tokens
        rows: List[Tuple[Request, Tuple[int, ...], bool]] = []
        preempted: List[int] = []
        added: List[Tuple[int, int]] = []

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            tokens, spec = self._plan_tokens(req, budget)
            if not tokens:
                i += 1
                continue
            need = self._fresh_needed(req, len(tokens))
            while self.pool.num_available() < need:
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim.req_id)
                if victim is req:
                    break
            if req.status != "running":
                break
            self._grow(req, len(tokens))
            rows.append((req, tokens, spec))
            budget -= len(tokens)
            i += 1

        while self.waiting and budget > 0 and self._free_slots and not preempted:
            req = self.waiting[0]
            hit_col, hit_block = self._lookup(req)
            req.num_computed = (hit_col + 1) * self.block_size
            tokens, spec = self._plan_tokens(req, budget)
            if not tokens:
                req.num_computed = 0
                break
            if hit_block is not None:
                self.pool.hold(hit_block)
            if self.pool.num_available() < self.config.window:
                if hit_block is not None:
                    self.pool.release(hit_block)
                req.num_computed = 0
                break
            self.waiting.popleft()
            self._admit(req, hit_col, hit_block)
            added.append((req.slot, req.num_computed))
            self._grow(req, len(tokens))
            rows.append((req, tokens, spec))
            budget -= len(tokens)

        batch = StepBatch(
            step=self._step,
            idx_mapping=np.array([r.slot for r, _, _ in rows], np.int64),
            query_len=np.array([len(t) for _, t, _ in rows], np.int64),
            is_spec=np.array([s for _, _, s in rows], bool),
            tokens=tuple(t for _, t, _ in rows),
            req_ids=np.array([r.req_id for r, _, _ in rows], np.int64),
            block_table=self.block_table.copy(),
            added_slots=np.array([s for s, _ in added], np.int64),
            added_num_computed=np.array([n for _, n in added], np.int64),
            preempted=tuple(preempted),
        )
        self._last = batch
        return batch

    def _plan_tokens(self, req: Request, budget: int) -> Tuple[Tuple[int, ...], bool]:
        """Input tokens of ``req`` this step (drafts included) and whether it is a spec row."""
        nc, b = req.num_computed, self.block_size
        if req.prefill_done:  # decode: the last sampled token plus drafts
            max_drafts = max(0, min(self.num_spec, req.total_len - req.known, budget - 1))
            drafts = tuple(int(t) for t in self.drafter(req, max_drafts))
            if len(drafts) > max_drafts:
                raise ValueError(f"drafter returned {len(drafts)} drafts, at most {max_drafts} allowed")
            return (req.tokens[nc],) + drafts, self.num_spec > 0
        # Chunks end on block boundaries so that each one leaves a boundary snapshot; only
        # the prompt's tail (shorter than a block) ends elsewhere, in a chunk of its own.
        end = min(nc + budget, req.known)
        aligned = (end // b) * b
        if aligned > nc:
            end = aligned
        elif end < req.known:
            end = nc  # the budget cannot reach the next boundary this step
        return tuple(req.tokens[nc:end]), False

    def _window_moves(self, req: Request, num_tokens: int):
        """New running column, old spec blocks that fall behind it, and empty window columns."""
        s = self.num_spec
        old = req.state_idx
        new = int(running_column([old], [req.num_computed + num_tokens], self.block_size)[0])
        window = range(new, new + 1 + s)
        row = self.block_table[req.slot] if req.slot >= 0 else None
        fallen, empty = [], []
        if req.has_window:
            fallen = [c for c in range(old + 1, min(old + 1 + s, new)) if row[c] != 0]
            empty = [c for c in window if row[c] == 0]
        else:
            empty = list(window)
        return new, fallen, empty

    def _fresh_needed(self, req: Request, num_tokens: int) -> int:
        _, fallen, empty = self._window_moves(req, num_tokens)
        return len(empty) - len(fallen)

    def _grow(self, req: Request, num_tokens: int) -> None:
        """Make the window ``[new, new + S]`` real: spec blocks that fell behind the running
        column move to the empty tail columns first, fresh blocks fill the rest."""
        new, fallen, empty = self._window_moves(req, num_tokens)
        row = self.block_table[req.slot]
        movers = [int(row[c]) for c in fallen]
        for c in fallen:
            row[c] = 0
        for c in empty:
            row[c] = movers.pop(0) if movers else self.pool.allocate()
        req.state_idx = new
        req.has_window = True

    def _lookup(self, req: Request) -> Tuple[int, Optional[int]]:
        """Largest ``c`` with ``c * B <= known - 1`` whose prefix is cached: ``(c - 1, block)``;
        ``(-1, None)`` on a miss."""
        if not self.enable_prefix_caching:
            return -1, None
        b = self.block_size
        for c in range((req.known - 1) // b, 0, -1):
            block = self.pool.lookup(req.tokens[: c * b])
            if block is not None:
                return c - 1, block
        return -1, None

    def _admit(self, req: Request, hit_col: int, hit_block: Optional[int]) -> None:
        req.slot = self._free_slots.pop(0)
        req.status = "running"
        req.prefill_done = False
        req.has_window = False
        req.state_idx = hit_col
        req.hit_tokens = req.num_computed
        if req.num_preemptions == 0:
            req.prompt_hit_tokens = req.num_computed
        req.cached_tokens += req.num_computed
        self.block_table[req.slot] = 0
        if hit_block is not None:
            self.block_table[req.slot, hit_col] = hit_block
        self.slots = add_requests(self.slots, [req.slot], [req.num_computed], self.block_size)
        self._by_slot[req.slot] = req
        self.running.append(req)

    def _free_request(self, req: Request) -> List[int]:
        released = [int(b) for b in self.block_table[req.slot] if b != 0]
        for block in released:
            self.pool.release(block)
        self.block_table[req.slot] = 0
        del self._by_slot[req.slot]
        self._free_slots.append(req.slot)
        self._free_slots.sort()
        self.running.remove(req)
        req.slot, req.has_window, req.state_idx = -1, False, -1
        return released

    def _preempt(self, req: Request) -> None:
        """Drop all of ``req``'s blocks; it restarts by recomputing its known tokens."""
        self._free_request(req)
        req.status, req.num_computed, req.prefill_done = "waiting", 0, False
        req.num_preemptions += 1
        self.waiting.appendleft(req)

    # -- after the forward pass ------------------------------------------------------
    def sample_limits(self, batch: StepBatch) -> np.ndarray:
        """int64 ``[rows]``: the most tokens each row may sample, whatever the drafts: 0 on
        a padding row or a prefill chunk that is not the prompt's last, 1 on the last, the
        tokens the request has left on a decode row (what a device-side sampler needs
        besides the logits and the drafts)."""
        out = np.zeros(batch.num_rows, np.int64)
        for b in range(batch.num_rows):
            if batch.idx_mapping[b] < 0:
                continue
            req = self.requests[int(batch.req_ids[b])]
            if not req.prefill_done:
                out[b] = int(req.num_computed + len(batch.tokens[b]) == req.known)
            else:
                out[b] = req.total_len - req.known
        return out

    def sample(self, batch: StepBatch) -> np.ndarray:
        """Reference sampler: int64 ``[rows]`` tokens sampled per row. Prefill rows sample 1
        on their last chunk, 0 otherwise; decode rows accept the leading correct drafts plus
        one token; never more than :meth:`sample_limits`."""
        out = self.sample_limits(batch)
        for b in range(batch.num_rows):
            if out[b] == 0 or not self.requests[int(batch.req_ids[b])].prefill_done:
                continue
            req = self.requests[int(batch.req_ids[b])]
            ok = 0
            for j, t in enumerate(batch.tokens[b][1:]):
                if t != req.tokens[req.known + j]:
                    break
                ok += 1
            out[b] = min(ok + 1, out[b])
        return out

    def update(self, batch: StepBatch, num_sampled) -> StepResult:
        """Advance the bookkeeping after sampling, record boundary snapshots in the prefix
        cache, release blocks that fell behind, finish requests. ``num_sampled`` is int
        ``[rows]`` as :meth:`sample` returns it (padding rows ignored)."""
        instance("batch", batch, StepBatch)
        if batch is not self._last and not (
            self._last is not None and batch.step == self._last.step
        ):
            raise ValueError("update() takes the batch of the latest schedule()")
        ns = index_array("num_sampled", num_sampled, shape=(batch.num_rows,))  # live rows: below
        want = self.sample(batch)
        live = batch.idx_mapping >= 0
        if np.any(ns[live] != want[live]):
            b = int(np.flatnonzero(live & (ns != want))[0])
            raise ValueError(
                f"num_sampled[{b}] = {int(ns[b])} disagrees with the drafts and the request's "
                f"tokens (expected {int(want[b])})"
            )
        b_size = self.block_size
        state, _ = preprocess(self.slots, batch.idx_mapping, batch.query_len, b_size)
        state = accept(state, batch.idx_mapping, batch.query_len, ns, batch.is_spec)
        state, post = postprocess(state, batch.idx_mapping, b_size)
        self.slots = state

        cached: List[CachedBlock] = []
        finished: List[int] = []
        released: List[int] = []
        for b in np.flatnonzero(live):
            req = self._by_slot[int(batch.idx_mapping[b])]
            slot = req.slot
            req.num_computed = int(state.num_computed[slot])
            assert req.state_idx == int(state.state_idx[slot]), "scheduler and bookkeeping disagree"
            if req.prefill_done:
                req.known += int(ns[b])
            elif req.num_computed == req.known:
                req.known += 1
                req.prefill_done = True
            col = int(post.cache_col[b])
            if col >= 0 and self.enable_prefix_caching:
                block = int(self.block_table[slot, col])
                n = (col + 1) * b_size
                if self.pool.record(block, req.tokens[:n]):
                    cached.append(CachedBlock(req.req_id, col, block, n))
            row = self.block_table[slot]
            for c in range(req.state_idx):
                if row[c] != 0 and req.num_computed >= (c + 1) * b_size:
                    released.append(int(row[c]))
                    self.pool.release(int(row[c]))
                    row[c] = 0
            if req.known >= req.total_len:
                released += self._free_request(req)
                req.status = "finished"
                finished.append(req.req_id)
        self._last = None
        self._step += 1
        return StepResult(tuple(cached), tuple(finished), tuple(released))

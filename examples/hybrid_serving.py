"""Serving the hybrid model (``hybrid_model.py``) with align-mode prefix caching, from torch
and from JAX: the reference scheduler feeds batches, the backend's runner does the
bookkeeping and the copies, the model runs on the resolved blocks, greedy decoding with
speculative drafts from a deliberately imperfect drafter.

The scheduler is told each request's whole token sequence in advance (prompt and greedy
continuation, from :func:`generate`, the model run on its own without a cache), so it can
judge drafts; every served step then checks that the model's argmax at each accepted
position is that continuation's token, and records the logits of every position it
computed, for :func:`compare`.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
from hybrid_model import ModelConfig

from mamba_align.core import Scheduler

Logits = Dict[Tuple[int, int], np.ndarray]  # (request, position) -> fp32 [vocab]


@dataclass(frozen=True)
class Workload:
    """Requests ``{id: (arrival step, prompt)}``, each to generate ``new_tokens`` tokens."""

    requests: Dict[int, Tuple[int, Tuple[int, ...]]]
    new_tokens: int


def multi_turn_workload(cfg: ModelConfig, seed: int, conversations: int, block_size: int,
                        new_tokens: int, forward_one: Callable
                        ) -> Tuple[Workload, Dict[int, List[int]], Logits]:
    """Chats of two turns: a first prompt of 1 to 3 blocks plus a tail, then, arriving
    later, a second request whose prompt is the first prompt, the model's answer to it
    and a new user message: the second turn resumes from the latest of the first turn's
    snapshots (with answers of a block or more, one taken while it decoded). Request
    ``2c`` / ``2c + 1`` are
    conversation ``c``'s turns. Returns the workload, every request's greedy continuation
    and the logits of running each request alone (:func:`generate`)."""
    rng = np.random.default_rng(seed)
    words = lambda n: tuple(int(t) for t in rng.integers(1, cfg.vocab, size=n))  # noqa: E731
    # (a tail of 1 to B - 1 tokens; none where B = 1)
    first = {2 * c: (c, words(int(rng.integers(1, 4)) * block_size
                              + (int(rng.integers(1, block_size)) if block_size > 1 else 0)))
             for c in range(conversations)}
    out1, lg1 = generate(forward_one, Workload(first, new_tokens))
    second = {r + 1: (8 + 2 * (r // 2), p + tuple(out1[r]) + words(int(rng.integers(1, 4))))
              for r, (_, p) in first.items()}
    out2, lg2 = generate(forward_one, Workload(second, new_tokens))
    return (Workload({**first, **second}, new_tokens), {**out1, **out2}, {**lg1, **lg2})


def draft_is_right(seed: int, req_id: int, position: int, miss: float) -> bool:
    """Whether the drafter proposes the true token at ``position`` (a fixed function of
    its arguments, so every run of a workload drafts the same tokens)."""
    h = hashlib.sha256(f"{seed}/{req_id}/{position}".encode()).digest()
    return int.from_bytes(h[:4], "little") / 2**32 >= miss


def perturbed_drafter(seed: int, vocab: int, miss: float = 0.3):
    """The true continuation with a fraction ``miss`` of its tokens replaced by another
    id: acceptance varies from 1 to 1 + S per step."""
    def drafter(req, max_drafts: int) -> List[int]:
        out = []
        for j in range(max_drafts):
            pos = req.known + j
            t = req.tokens[pos]
            out.append(t if draft_is_right(seed, req.req_id, pos, miss) else t % (vocab - 1) + 1)
        return out
    return drafter


class StepInputs(NamedTuple):
    """One step's arrays for a runner (NumPy int32; ``is_spec`` bool). Per batch row
    (``[rows]``, padding rows at the end: slot -1, no tokens): ``added_slots`` /
    ``added_num_computed`` (the slots to seed first, -1 / 0 padded), ``idx_mapping``,
    ``query_len``, ``is_spec`` and ``limit``, the most tokens the row may sample
    (``Scheduler.sample_limits``; 0 on padding); ``block_table`` ``[max_num_seqs,
    cols]``; ``tokens`` ``[T_pad]`` (past ``cu_seqlens[-1]``: in no row, 0);
    ``cu_seqlens`` ``[rows + 1]``."""

    added_slots: np.ndarray
    added_num_computed: np.ndarray
    idx_mapping: np.ndarray
    query_len: np.ndarray
    is_spec: np.ndarray
    limit: np.ndarray
    block_table: np.ndarray
    tokens: np.ndarray
    cu_seqlens: np.ndarray


def step_inputs(batch, limit: np.ndarray, rows: Optional[int] = None,
                bucket: bool = False) -> StepInputs:
    """``batch`` (a ``StepBatch``) and its rows' ``limit`` as :class:`StepInputs`; with
    ``rows``, padded to that many rows (and the added slots to as many), with ``bucket``,
    the tokens to the next power of two: a few shapes, so that a jitted step compiles (or a
    CUDA graph is captured) once per shape."""
    n = batch.num_rows
    rows = n if rows is None else rows
    if rows < n or len(batch.added_slots) > rows:
        raise ValueError(f"a batch of {n} rows does not fit {rows} rows")
    tokens = [x for row in batch.tokens for x in row]
    t_pad = max(1, 1 << (len(tokens) - 1).bit_length()) if bucket else len(tokens)

    def pad(a, size, fill, dtype=np.int32):
        out = np.full(size, fill, dtype)
        out[:len(a)] = a
        return out

    cu = batch.cu_seqlens
    return StepInputs(
        pad(batch.added_slots, rows, -1), pad(batch.added_num_computed, rows, 0),
        pad(batch.idx_mapping, rows, -1), pad(batch.query_len, rows, 0),
        pad(batch.is_spec, rows, False, bool), pad(limit, rows, 0),
        np.asarray(batch.block_table, np.int32), pad(tokens, t_pad, 0),
        pad(cu, rows + 1, cu[-1]))


@dataclass
class Served:
    """What one serving run produced: logits per computed position, the tokens of the
    prefix cache it used and recomputed, draft counts, the copies of every step."""

    logits: Logits = field(default_factory=dict)
    #: per request, the prompt tokens served from the prefix cache at its first admission
    hit_tokens: Dict[int, int] = field(default_factory=dict)
    #: ... and the tokens served from it when it came back after a preemption
    readmit_hit_tokens: Dict[int, int] = field(default_factory=dict)
    computed_tokens: int = 0
    drafts: int = 0
    accepted: int = 0
    steps: int = 0
    preemptions: int = 0
    recomputed: int = 0  # positions computed a second time (after a preemption)
    #: (request, tokens, the block's states) of every block entering the prefix cache
    cached: List[Tuple[int, int, Dict[str, np.ndarray]]] = field(default_factory=list)
    #: seconds from a request's admission to the end of the step that sampled its first
    #: token (time to first token)
    ttft: Dict[int, float] = field(default_factory=dict)
    #: (whether every row decoded, seconds) of each step, the step call only
    step_seconds: List[Tuple[bool, float]] = field(default_factory=list)


def serve(cfg: ModelConfig, workload: Workload, outputs: Dict[int, Sequence[int]],
          step: Callable, *, block_size: int, num_spec: int, num_blocks: int,
          caching: bool = True, seed: int = 0, miss: float = 0.3, max_num_seqs: int = 4,
          max_num_tokens: int = 16, snapshot: Optional[Callable] = None,
          check_argmax: bool = True, pad: bool = False, record: bool = True) -> Served:
    """Serve ``workload`` (whose greedy continuations are ``outputs``) through ``step``:
    ``step(inputs, sample) -> (logits [T_pad, vocab], num_sampled [rows])`` runs the
    bookkeeping, the model and the post-process for one step's :class:`StepInputs`
    (padded to ``max_num_seqs`` rows and a power-of-two of tokens with ``pad``);
    ``sample()`` is the reference sampler's count per row, which a step may use or
    compute on the device (greedy acceptance of the drafts): the two must agree. Checks
    the argmax at every accepted position (unless not ``check_argmax``); a position
    computed twice (after a preemption) must give the same bits both times. With
    ``snapshot`` (``block -> {state: array}``), keeps the states of every block the
    scheduler records in the prefix cache, as they are when it records them. Without
    ``record``, the logits stay where the step left them (no checks of them, no
    ``logits`` kept): a timing run. Where ``step`` has ``errors`` (``() -> [messages]``,
    the device's error flag), it is read after every step and a fault stops the run
    before anything of that step is recorded in the prefix cache (docs/semantics.md §1: a
    fault the kernels find cannot withdraw a cache column; this scheduler has no path to
    re-admit a faulty request). Returns :class:`Served`."""
    if not workload.requests:
        raise ValueError("the workload has no requests")
    for rid, (_, prompt) in workload.requests.items():
        cfg.check_tokens(prompt, f"request {rid}'s prompt")
        cfg.check_tokens(outputs[rid], f"request {rid}'s outputs")
    cache = cfg.cache_config(block_size, num_spec)
    max_len = max(len(p) + max(workload.new_tokens, len(outputs[rid]))
                  for rid, (_, p) in workload.requests.items())
    sched = Scheduler(cache, num_blocks, max_num_seqs=max_num_seqs,
                      max_num_tokens=max_num_tokens, max_model_len=max_len,
                      drafter=perturbed_drafter(seed, cfg.vocab, miss),
                      enable_prefix_caching=caching)
    out = Served()
    pending, t, admitted = dict(workload.requests), 0, {}
    rows = max_num_seqs if pad else None
    while pending or sched.has_unfinished():
        for rid in sorted(r for r, (at, _) in pending.items() if at <= t):
            _, prompt = pending.pop(rid)
            sched.add_request(rid, prompt, outputs[rid])
            admitted[rid] = time.perf_counter()
        t += 1
        if not sched.has_unfinished():
            continue
        batch = sched.schedule()
        out.preemptions += len(batch.preempted)
        for rid in batch.req_ids:  # (each admission's row is in that step's batch)
            if rid >= 0:
                req = sched.requests[int(rid)]
                out.hit_tokens[int(rid)] = req.prompt_hit_tokens
                if req.cached_tokens > req.prompt_hit_tokens:
                    out.readmit_hit_tokens[int(rid)] = req.cached_tokens - req.prompt_hit_tokens
        before = {int(r): (sched.requests[int(r)].num_computed, sched.requests[int(r)].prefill_done)
                  for r in batch.req_ids if r >= 0}
        ns = sched.sample(batch)
        padded = step_inputs(batch, sched.sample_limits(batch), rows, bucket=pad)
        full = np.zeros(len(padded.idx_mapping), np.int64)
        full[:len(ns)] = ns
        t0 = time.perf_counter()
        logits, got = step(padded, lambda: full)
        got = np.asarray(got)  # (the step's end: its sampled counts reach the host)
        done = time.perf_counter()
        out.step_seconds.append((all(d for _, d in before.values()), done - t0))
        faults = step.errors() if hasattr(step, "errors") else []  # (after the timing)
        if faults:  # (first: a faulty row's logits and counts are not the model's)
            raise RuntimeError(f"step {out.steps}: the device flagged faults, nothing of the "
                               f"step is recorded: {'; '.join(faults)}")
        if not np.array_equal(got, full):
            raise AssertionError(f"step {out.steps}: the step sampled {got.tolist()}, the "
                                 f"reference sampler {full.tolist()}")
        logits = np.asarray(logits) if record else None
        cu = batch.cu_seqlens
        for b, rid in enumerate(batch.req_ids):
            if rid < 0:
                continue
            req = sched.requests[int(rid)]
            nc, decoding = before[int(rid)]
            n = int(batch.query_len[b])
            if ns[b] > 0 and int(rid) not in out.ttft:
                out.ttft[int(rid)] = done - admitted[int(rid)]
            out.computed_tokens += n
            if decoding:
                out.drafts += n - 1
                out.accepted += max(0, int(ns[b]) - 1)
            if not record:
                continue
            valid = int(ns[b]) if decoding else n  # spec positions past the accepted: drafts
            for j in range(valid):
                key, row = (int(rid), nc + j), logits[cu[b] + j]
                if key in out.logits:
                    out.recomputed += 1
                    if not np.array_equal(out.logits[key], row):
                        raise AssertionError(f"request {key[0]} position {key[1]}: "
                                             "recomputed with other bits")
                out.logits[key] = row
            for j in range(int(ns[b]) if check_argmax else 0):  # accepted: the argmax
                at = nc + j if decoding else nc + n - 1  # the position whose logits predict
                want, top = req.tokens[at + 1], int(np.argmax(logits[cu[b] + at - nc]))
                if top != want:
                    raise AssertionError(f"request {int(rid)} position {at + 1}: the "
                                         f"model's argmax is {top}, its continuation {want}")
        result = sched.update(batch, ns)
        if snapshot is not None:
            out.cached += [(c.req_id, c.num_tokens, snapshot(c.block)) for c in result.cached]
        out.steps += 1
    return out


def generate(forward_one: Callable, workload: Workload) -> Tuple[Dict[int, List[int]], Logits]:
    """Each request's greedy continuation and its logits, the model run on one request at
    a time without a cache: ``forward_one(tokens, read, write) -> logits`` runs a single
    non-spec row from state block ``read`` (-1: empty) into block ``write``."""
    outputs: Dict[int, List[int]] = {}
    logits: Logits = {}
    for rid, (_, prompt) in workload.requests.items():
        seq = list(prompt)
        lg = np.asarray(forward_one(seq, -1, 1))
        for j in range(len(seq)):
            logits[(rid, j)] = lg[j]
        read = 1
        for _ in range(workload.new_tokens):
            seq.append(int(np.argmax(logits[(rid, len(seq) - 1)])))
            if len(seq) - len(prompt) == workload.new_tokens:
                break
            write = 3 - read
            logits[(rid, len(seq) - 1)] = np.asarray(forward_one(seq[-1:], read, write))[0]
            read = write
        outputs[rid] = seq[len(prompt):]
    return outputs, logits


def compare(a: Logits, b: Logits) -> Tuple[int, int]:
    """``(positions both computed, positions whose logits differ in any bit)``."""
    common = sorted(set(a) & set(b))
    return len(common), sum(not np.array_equal(a[k], b[k]) for k in common)


def tp_summary(on: Served, off: Served, alone: Logits) -> Tuple[dict, list, np.ndarray]:
    """What a tensor-parallel run reports (examples/serve_tp_*.py): the cached (``on``)
    against the uncached run (``off``) and the logits of every position against the
    whole model's run alone (``alone``, tp = 1). Returns the summary, the positions in
    order and the cached run's logits stacked in that order (fp32 ``[positions, vocab]``)."""
    common, differ = compare(on.logits, off.logits)
    keys = sorted(on.logits)
    mine, ref = (np.stack([d[k] for k in keys]) for d in (on.logits, alone))
    return {
        "positions": len(keys), "hit_tokens": sum(on.hit_tokens.values()),
        "cached_equals_uncached": differ == 0 and common > 0, "compared": common,
        "max_abs_diff_vs_tp1": float(np.max(np.abs(mine - ref))),
        "max_abs_logit": float(np.max(np.abs(ref))),
        "bitwise_equal_to_tp1": int(np.sum(np.all(mine == ref, axis=1))),
    }, keys, mine

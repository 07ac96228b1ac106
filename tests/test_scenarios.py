"""Scripted scenarios, step by step: the tiny hybrid model served through the torch runner
with prompts of 1, 2, 3 and 10 blocks, a scripted drafter whose accepted counts run
through 1 ... 1 + S, and a fifth request that shares the 10-block prompt and resumes
from the snapshot its prefill left. Per step the test checks the tokens scheduled, every
copy the runner made (source and destination columns, bias) against the rules of
docs/semantics.md §2 written out here on their own, the columns entering the prefix cache,
and that the fifth request takes its hit; every position's logits are those of the
request run alone."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from hybrid_model import TINY, init_weights  # noqa: E402
from hybrid_serving import Workload, generate, step_inputs  # noqa: E402

from mamba_align.core import Scheduler  # noqa: E402

B, S, NB, SLOTS, BUDGET, NEW = 4, 2, 64, 4, 16, 7
CACHE = TINY.cache_config(B, S)
RNG = np.random.default_rng(7)
PROMPTS = {r: [int(t) for t in RNG.integers(1, TINY.vocab, size=n * B)]
           for r, n in enumerate((1, 2, 3, 10))}
PROMPTS[4] = PROMPTS[3] + [5, 6, 7]  # shares request 3's 10 blocks
ARRIVAL = {0: 0, 1: 6, 2: 12, 3: 18, 4: 30}  # one request at a time
# correct leading drafts per decode step of each request: accepted = 1 + that (capped)
SCRIPT = {0: [2, 0, 1, 2], 1: [0, 2, 1], 2: [1, 1, 2], 3: [2, 2, 0, 1], 4: [0, 1, 2]}


def cdiv(a, b):
    return -(-a // b)


class Rules:
    """docs/semantics.md §2 for one request, in columns: what the runner must copy."""

    def __init__(self, num_computed):
        self.nc, self.acc = num_computed, 1
        self.col = (num_computed - 1) // B  # add_requests: -1 when fresh

    def preprocess(self, q):
        src, off = self.col, max(self.acc - 1, 0)
        self.col = max(src, cdiv(self.nc + q, B) - 1)
        if src >= 0 and src != self.col:
            self.acc = 1
            # (temporal source column, conv source column, destination column, bias)
            return [(src + off, src, self.col, off)]
        return []

    def postprocess(self, q, ns, spec):
        self.nc += ns if spec else q
        self.acc = max(ns, 1) if spec else 1
        running, aligned = self.nc - self.acc + 1, (self.nc // B) * B
        if aligned < running:
            return [], -1
        bias, dest = aligned - running, aligned // B - 1
        copies = [] if dest == self.col and bias == 0 else [(self.col + bias, self.col, dest,
                                                             bias)]
        if dest == self.col:
            self.acc = 1
        return copies, dest


DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def model():
    from hybrid_torch import TorchModel
    return TorchModel(TINY, init_weights(TINY, seed=0), DEV)


@pytest.fixture(scope="module")
def served(model, monkeypatch_module):
    from hybrid_torch import new_pools, serving_step, single_row

    import mamba_align.backends.torch.runner as runner_module
    from mamba_align.backends.torch import StateRunner
    outputs, alone = generate(single_row(model, S), Workload(
        {r: (ARRIVAL[r], tuple(p)) for r, p in PROMPTS.items()}, NEW))
    made = []  # the physical copies of each call, as the runner hands them to the kernels
    real = runner_module.ops.copy_pools_

    def record(pools, kinds, plan, errors):
        made.append({k: plan[k].tolist() for k in ("copy_tsrc", "copy_csrc", "copy_dst",
                                                   "copy_bias")})
        real(pools, kinds, plan, errors)
    monkeypatch_module.setattr(runner_module.ops, "copy_pools_", record)

    script = {r: list(s) for r, s in SCRIPT.items()}

    def drafter(req, max_drafts):
        right = script[req.req_id].pop(0) if max_drafts else 0
        truth = req.tokens[req.known:req.known + max_drafts]
        return [t if j < right else t % (TINY.vocab - 1) + 1 for j, t in enumerate(truth)]

    sched = Scheduler(CACHE, NB, max_num_seqs=SLOTS, max_num_tokens=BUDGET,
                      max_model_len=64, drafter=drafter)
    runner = StateRunner(CACHE, SLOTS, DEV)
    step = serving_step(model, runner, new_pools(CACHE, NB, DEV))
    steps, t, pending = [], 0, dict(ARRIVAL)
    while pending or sched.has_unfinished():
        for r in [r for r, at in pending.items() if at <= t]:
            del pending[r]
            sched.add_request(r, PROMPTS[r], outputs[r])
        t += 1
        if not sched.has_unfinished():
            continue
        batch = sched.schedule()
        assert batch.num_rows == 1  # one request at a time
        rid, slot = int(batch.req_ids[0]), int(batch.idx_mapping[0])
        req = sched.requests[rid]
        before = dict(nc=req.num_computed, hit=req.hit_tokens, decode=req.prefill_done)
        ns = sched.sample(batch)
        made.clear()
        logits, _ = step(step_inputs(batch, sched.sample_limits(batch)), lambda: ns)
        result = sched.update(batch, ns)
        bt = batch.block_table[slot]
        cols = lambda ids: {int(np.flatnonzero(bt == i)[0]) for i in ids}  # noqa: E731
        copies = []
        for call in made:  # [pre-copy (pre-copy mode), post-process]
            copies.append([(min(cols([ts])), min(cols([cs])), min(cols([d])), bias)
                           for ts, cs, d, bias in zip(call["copy_tsrc"], call["copy_csrc"],
                                                      call["copy_dst"], call["copy_bias"])
                           if d >= 0])
        steps.append(dict(rid=rid, q=int(batch.query_len[0]), spec=bool(batch.is_spec[0]),
                          ns=int(ns[0]), copies=copies, bt=bt.copy(),
                          cached=[c.column for c in result.cached],
                          blocks=[c.block for c in result.cached],
                          logits=np.asarray(logits), **before))
    runner.raise_errors()
    return steps, alone, sched


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_scheduled_tokens_per_step(served):
    steps, _, _ = served
    got = {r: [(s["q"], s["ns"]) for s in steps if s["rid"] == r] for r in PROMPTS}
    # prefill chunks end on block boundaries within the 16-token budget; then decode rows
    # of 1 + S tokens that accept 1 + the script's correct drafts, the last ones capped
    # by the tokens the request has left (7 new tokens: 1 from the prefill, 6 decoded)
    assert got[0] == [(4, 1), (3, 3), (3, 1), (3, 2)]
    assert got[1] == [(8, 1), (3, 1), (3, 3), (3, 2)]
    assert got[2] == [(12, 1), (3, 2), (3, 2), (3, 2)]
    assert got[3] == [(16, 0), (16, 0), (8, 1), (3, 3), (3, 3)]
    # request 4 resumes after 40 cached tokens: only its 3 new prompt tokens are computed
    assert got[4] == [(3, 1), (3, 1), (3, 2), (3, 3)]
    # every accepted count 1 ... 1 + S occurs on decode rows
    assert {s["ns"] for s in steps if s["spec"]} == set(range(1, 2 + S))


def test_copies_and_cache_columns_follow_the_rules(served):
    steps, _, _ = served
    rules = {}
    for s in steps:
        r = s["rid"]
        if r not in rules:
            rules[r] = Rules(s["nc"])
        pre = rules[r].preprocess(s["q"])
        post, col = rules[r].postprocess(s["q"], s["ns"], s["spec"])
        assert s["copies"] == [pre, post], (r, s["nc"], s["copies"], pre, post)
        assert s["cached"] == ([col] if col >= 0 else []), (r, s["nc"])
    # spelled out for the 10-block request: each prefill chunk pre-copies the state from
    # the previous chunk's column and leaves a cacheable block (16, 32, 40 tokens: columns
    # 3, 7, 9; no post-process copy); the first decode step pre-copies column 9 into the
    # new window's column 10; the next, after 3 accepted (candidate 2 of the window, column
    # 12), moves column 12's state and column 10's conv window (shifted by 2) into column
    # 11, then saves the boundary at 44 tokens from column 11 into the kept column 10
    mine = [s for s in steps if s["rid"] == 3]
    assert [s["cached"] for s in mine] == [[3], [7], [9], [], [10]]
    assert [s["copies"] for s in mine] == [
        [[], []], [[(3, 3, 7, 0)], []], [[(7, 7, 9, 0)], []], [[(9, 9, 10, 0)], []],
        [[(12, 10, 11, 2)], [(11, 11, 10, 0)]]]


def test_the_shared_prefix_hit_is_taken_from_the_prefill_snapshot(served):
    steps, _, sched = served
    first = next(s for s in steps if s["rid"] == 4)
    assert first["hit"] == 40 and first["nc"] == 40
    # its column 9 is the very block request 3's last prefill chunk recorded at 40 tokens
    recorded = next(s for s in steps if s["rid"] == 3 and s["cached"] == [9])
    assert first["bt"][9] == recorded["blocks"][0]
    assert sched.requests[4].hit_tokens == 40


def test_every_position_is_the_request_run_alone(served):
    steps, alone, _ = served
    compared = 0
    for s in steps:
        valid = s["ns"] if s["decode"] else s["q"]
        for j in range(valid):
            np.testing.assert_array_equal(s["logits"][j], alone[s["rid"], s["nc"] + j])
            compared += 1
    assert compared == sum(len(p) for p in PROMPTS.values()) - 40 + 5 * NEW - 5

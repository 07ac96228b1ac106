"""End to end: the hybrid model served with align-mode prefix caching (examples/
hybrid_serving.py) on two-turn chats (the second turn resumes from snapshots of the first
turn's prompt and answer) with speculative drafts. Every
position's logits, served with the cache, without it, in copy-free mode and from JAX, are
the bits of the model run on each request alone without a cache; every block entering the
prefix cache holds the state at its boundary; a corrupted cache hit makes the check fail."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import torch  # noqa: E402
from hybrid_model import GPU, TINY, init_weights  # noqa: E402
from e2e_checks import check_cached_blocks, check_jax_serves_torchs_bits  # noqa: E402
from hybrid_serving import compare, multi_turn_workload, serve  # noqa: E402

CUDA = torch.cuda.is_available()
MODEL = GPU if CUDA else TINY  # on the GPU machine: Qwen3-Next's head shapes (make gpu)
B, S, NB, SLOTS = 4, 2, 48, 4
CACHE = MODEL.cache_config(B, S)
WEIGHTS = init_weights(MODEL, seed=0)


@pytest.fixture(scope="module")
def torch_model():
    from hybrid_torch import TorchModel
    return TorchModel(MODEL, WEIGHTS, "cuda" if CUDA else "cpu")


@pytest.fixture(scope="module")
def plain(torch_model):
    """The workload, each request's greedy continuation, and its logits run alone
    without a cache."""
    from hybrid_torch import single_row
    return multi_turn_workload(MODEL, seed=0, conversations=2, block_size=B, new_tokens=6,
                               forward_one=single_row(torch_model, S))


def serve_torch(model, plain, *, caching=True, mode="pre-copy", runner_type=None,
                check_argmax=True, num_blocks=NB, **step_kw):
    from hybrid_torch import new_pools, serving_step

    from mamba_align.backends.torch import StateRunner
    runner = (runner_type or StateRunner)(CACHE, SLOTS, model.device, mode=mode)
    pools = new_pools(CACHE, num_blocks, model.device)
    workload, outputs, _ = plain
    step = serving_step(model, runner, pools, **step_kw)
    served = serve(MODEL, workload, outputs, step, block_size=B, num_spec=S,
                   num_blocks=num_blocks, caching=caching, snapshot=step.snapshot,
                   check_argmax=check_argmax, pad=bool(step_kw))
    runner.raise_errors()
    return served


@pytest.fixture(scope="module")
def served(torch_model, plain):
    """``served(caching, mode)``: :func:`serve_torch` with the plain runner, each run once
    and shared by the tests that only read it (a run costs ~12 s in the interpreter)."""
    runs = {}

    def get(caching: bool = True, mode: str = "pre-copy"):
        if (caching, mode) not in runs:
            runs[caching, mode] = serve_torch(torch_model, plain, caching=caching, mode=mode)
        return runs[caching, mode]
    return get


def test_the_workload_hits_the_cache_and_drafts_vary(served, plain):
    served = served()
    # both second turns resume from a prefix, from a snapshot taken while the first turn
    # was decoding (past the first turn's prompt)
    workload = plain[0]
    assert sorted(r for r, n in served.hit_tokens.items() if n) == [1, 3]
    for r in (1, 3):
        assert served.hit_tokens[r] > len(workload.requests[r - 1][1])
    assert 0 < served.accepted < served.drafts  # some drafts accepted, some rejected
    common, differ = compare(served.logits, plain[2])
    assert common >= 40 and differ == 0


@pytest.mark.parametrize("mode", ["pre-copy", "copy-free"])
def test_every_cached_block_holds_the_state_at_its_boundary(torch_model, plain, served, mode):
    # each block recorded in the prefix cache, as it was then, against the request's first
    # n tokens run alone from an empty state: the recurrent state and the conv history
    served = served(mode=mode)
    assert len(served.cached) >= 4
    check_cached_blocks(torch_model, plain, served.cached, S)


def test_preemption_keeps_the_bits(torch_model, plain):
    # 8 blocks for 4 slots. Without the cache a preempted request restarts from nothing and
    # computes positions a second time, which must repeat their bits (serve checks it);
    # with the cache a preempted request resumes from a snapshot of its own
    off = serve_torch(torch_model, plain, caching=False, num_blocks=8)
    assert off.preemptions >= 1 and off.recomputed >= 1
    assert compare(off.logits, plain[2]) == (len(off.logits), 0)
    on = serve_torch(torch_model, plain, num_blocks=8)
    assert on.preemptions >= 1
    assert compare(on.logits, plain[2]) == (len(on.logits), 0)


def test_cached_equals_uncached_bit_for_bit(served, plain):
    on, off = served(caching=True), served(caching=False)
    assert on.computed_tokens < off.computed_tokens  # the hits saved work
    common, differ = compare(on.logits, off.logits)
    assert common >= 40 and differ == 0
    assert compare(off.logits, plain[2]) == (len(off.logits), 0)


def test_copy_free_equals_pre_copy_bit_for_bit(served):
    pre, free = served(mode="pre-copy"), served(mode="copy-free")
    assert compare(pre.logits, free.logits) == (len(pre.logits), 0)
    assert pre.logits.keys() == free.logits.keys()


def test_torch_equals_jax_bit_for_bit(served, plain):
    check_jax_serves_torchs_bits(MODEL, WEIGHTS, CACHE, NB, SLOTS, plain, served())


@pytest.mark.parametrize("mode", ["pre-copy", pytest.param("copy-free", marks=pytest.mark.skipif(
    not CUDA, reason="CPU time: copy-free = pre-copy is checked above; runs on the GPU"))])
def test_one_device_step_per_scheduler_step(torch_model, plain, mode):
    # the runners as a server runs them: batches padded to a fixed number of rows and a
    # power of two of tokens, greedy acceptance on the device, the whole step one CUDA
    # graph replay (torch on a GPU; eager on the CPU) or one jitted call (JAX). serve
    # checks every step's sampled counts against the reference sampler's; the logits
    # must be the bits of each request run alone, padding and all
    from hybrid_jax import load_weights, new_pools, serving_step

    from mamba_align.backends import jax as mj
    torch_run = serve_torch(torch_model, plain, mode=mode, fused=True, graphs=True)
    assert compare(torch_run.logits, plain[2]) == (len(torch_run.logits), 0)
    step = serving_step(MODEL, load_weights(MODEL, WEIGHTS), CACHE, new_pools(CACHE, NB), SLOTS,
                        mode, fused=True)
    jax_run = serve(MODEL, plain[0], plain[1], step, block_size=B, num_spec=S,
                    num_blocks=NB, pad=True)
    assert mj.errors(step.carry["state"]) == []
    assert jax_run.logits.keys() == torch_run.logits.keys()
    assert compare(jax_run.logits, torch_run.logits) == (len(torch_run.logits), 0)
    assert 0 < torch_run.accepted < torch_run.drafts


def test_a_corrupted_cache_hit_is_caught(torch_model, plain):
    # negative control: a runner that corrupts the block a request resumes from when it is
    # admitted with a prefix-cache hit. The requests that hit, and only they, must differ,
    # from their first computed position on; without the cache nothing differs
    from mamba_align.backends.torch import StateRunner

    class CorruptsHits(StateRunner):
        hits = []

        def add_requests(self, slots, num_computed):
            self.hits = [(s, n) for s, n in zip(slots.tolist(), num_computed.tolist())
                         if s >= 0 and n > 0]
            super().add_requests(slots, num_computed)

        def preprocess(self, pools, idx_mapping, query_len, is_spec, bt):
            for slot, n in self.hits:  # column n / B - 1 holds the state after n tokens
                pools["ssm"][:, int(bt[slot, n // B - 1])] += 0.5
            self.hits = []
            return super().preprocess(pools, idx_mapping, query_len, is_spec, bt)

    for caching in (True, False):
        broken = serve_torch(torch_model, plain, caching=caching, runner_type=CorruptsHits,
                             check_argmax=False)
        differ = {k for k in broken.logits if not np.array_equal(broken.logits[k],
                                                                 plain[2][k])}
        hits = {r: n for r, n in broken.hit_tokens.items() if n}
        if not caching:
            assert not hits and not differ
            continue
        assert sorted(hits) == [1, 3]
        assert {r for r, _ in differ} == set(hits)
        for r, n in hits.items():  # its first computed position on
            assert (r, n) in differ and all(p >= n for q, p in differ if q == r)


def test_a_broken_post_process_copy_is_caught(torch_model, plain):
    # negative control: a runner whose post-process does its bookkeeping but skips the
    # copies that save boundary snapshots. Blocks then enter the prefix cache without the
    # state at their boundary: the snapshot check and the second turns' logits must fail
    import mamba_align.backends.torch.runner as runner_module
    from hybrid_torch import single_row, to_numpy

    from mamba_align.backends.torch import StateRunner

    class SkipsSnapshotCopies(StateRunner):
        def postprocess(self, *args, **kwargs):
            real = runner_module.ops.copy_pools_
            runner_module.ops.copy_pools_ = lambda *a, **k: None
            try:
                return super().postprocess(*args, **kwargs)
            finally:
                runner_module.ops.copy_pools_ = real

    broken = serve_torch(torch_model, plain, runner_type=SkipsSnapshotCopies,
                         check_argmax=False)
    workload, outputs, alone = plain
    stale = 0
    for rid, n, got in broken.cached:
        tokens = (list(workload.requests[rid][1]) + list(outputs[rid]))[:n]
        single = single_row(torch_model, S)
        single(tokens, -1, 1)
        stale += not np.array_equal(got["ssm"], to_numpy(single.pools["ssm"][:, 1]))
    assert stale >= 1
    differ = {r for r, p in broken.logits if not np.array_equal(broken.logits[r, p], alone[r, p])}
    assert differ and differ <= {r for r, n in broken.hit_tokens.items() if n}


def test_a_device_fault_stops_serving_before_its_step_is_recorded(torch_model, plain,
                                                                  monkeypatch):
    # docs/semantics.md §1: a fault the kernels find cannot withdraw a cache column, so
    # the caller reads the flag before the scheduler records the step's blocks; serve()
    # reads it after every step (the step's errors) and stops there
    from hybrid_torch import new_pools, serving_step

    import mamba_align.core.scheduler as sched_mod
    from mamba_align.backends.torch import StateRunner
    updates = []
    update = sched_mod.Scheduler.update

    def spy(self, batch, ns):
        updates.append(len(updates))
        return update(self, batch, ns)
    monkeypatch.setattr(sched_mod.Scheduler, "update", spy)
    runner = StateRunner(CACHE, SLOTS, torch_model.device)
    step = serving_step(torch_model, runner, new_pools(CACHE, NB, torch_model.device))
    calls = []

    def faulty(inputs, sample):  # at the third step, a block id past the pools in one row
        calls.append(1)
        if len(calls) == 3:
            bt = inputs.block_table.copy()
            bt[int(inputs.idx_mapping[0])] = NB + 5
            inputs = inputs._replace(block_table=bt)
        return step(inputs, sample)
    faulty.errors = step.errors
    workload, outputs, _ = plain
    with pytest.raises(RuntimeError, match="step 2: the device flagged faults, nothing of the "
                                           "step is recorded: the block table names"):
        serve(MODEL, workload, outputs, faulty, block_size=B, num_spec=S, num_blocks=NB)
    assert updates == [0, 1]  # the scheduler recorded steps 0 and 1 only

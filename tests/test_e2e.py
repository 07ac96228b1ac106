"""End to end: the hybrid model served with align-mode prefix caching (examples/
hybrid_serving.py) on a workload with shared prefixes and speculative drafts. Every
position's logits, served with the cache, without it, in copy-free mode and from JAX, are
the bits of the model run on each request alone without a cache; a snapshot corrupted
after its post-process copy makes the check fail."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from hybrid_model import TINY, init_weights  # noqa: E402
from hybrid_serving import compare, generate, serve, shared_prefix_workload  # noqa: E402

B, S, NB, SLOTS = 4, 2, 40, 4
CACHE = TINY.cache_config(B, S)
WEIGHTS = init_weights(TINY, seed=0)
WORKLOAD = shared_prefix_workload(TINY, seed=0, num_requests=4, block_size=B, new_tokens=6)


@pytest.fixture(scope="module")
def torch_model():
    import torch
    from hybrid_torch import TorchModel
    return TorchModel(TINY, WEIGHTS, "cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="module")
def plain(torch_model):
    """Each request's greedy continuation and logits, run alone without a cache."""
    from hybrid_torch import single_row
    return generate(single_row(torch_model, S), WORKLOAD)


def serve_torch(model, outputs, *, caching=True, mode="pre-copy", runner_type=None):
    from hybrid_torch import new_pools, serving_step

    from mamba_align.backends.torch import StateRunner
    runner = (runner_type or StateRunner)(CACHE, SLOTS, model.device, mode=mode)
    pools = new_pools(CACHE, NB, model.device)
    served = serve(TINY, WORKLOAD, outputs, serving_step(model, runner, pools), block_size=B,
                   num_spec=S, num_blocks=NB, caching=caching)
    runner.raise_errors()
    return served


def test_the_workload_hits_the_cache_and_drafts_vary(torch_model, plain):
    served = serve_torch(torch_model, plain[0])
    assert sum(served.hit_tokens.values()) >= 2 * B  # two requests resume from a prefix
    assert 0 < served.accepted < served.drafts  # some drafts accepted, some rejected
    common, differ = compare(served.logits, plain[1])
    assert common >= 40 and differ == 0


def test_cached_equals_uncached_bit_for_bit(torch_model, plain):
    on, off = (serve_torch(torch_model, plain[0], caching=c) for c in (True, False))
    assert on.computed_tokens < off.computed_tokens  # the hits saved work
    common, differ = compare(on.logits, off.logits)
    assert common >= 40 and differ == 0
    assert compare(off.logits, plain[1]) == (len(off.logits), 0)


def test_copy_free_equals_pre_copy_bit_for_bit(torch_model, plain):
    pre, free = (serve_torch(torch_model, plain[0], mode=m) for m in ("pre-copy", "copy-free"))
    assert compare(pre.logits, free.logits) == (len(pre.logits), 0)
    assert pre.logits.keys() == free.logits.keys()


def test_torch_equals_jax_bit_for_bit(torch_model, plain):
    from hybrid_jax import load_weights, new_pools, serving_step

    from mamba_align.backends import jax as mj
    want = serve_torch(torch_model, plain[0])
    step = serving_step(TINY, load_weights(WEIGHTS), CACHE, new_pools(CACHE, NB), SLOTS)
    got = serve(TINY, WORKLOAD, plain[0], step, block_size=B, num_spec=S, num_blocks=NB)
    assert mj.errors(step.carry["state"]) == []
    assert got.logits.keys() == want.logits.keys()
    assert compare(got.logits, want.logits) == (len(want.logits), 0)


def test_a_corrupted_snapshot_is_caught(torch_model, plain):
    # negative control: a runner whose post-process leaves a wrong state in every block it
    # hands to the prefix cache; the requests that resume from one must differ
    from mamba_align.backends.torch import StateRunner

    class BrokenSnapshots(StateRunner):
        def postprocess(self, pools, idx_mapping, query_len, is_spec, num_sampled, bt):
            cols = super().postprocess(pools, idx_mapping, query_len, is_spec, num_sampled, bt)
            for b in np.flatnonzero(cols.cpu().numpy() >= 0):
                block = bt[idx_mapping[b].long(), cols[b]].long()
                pools["ssm"][:, block] += 0.5
            return cols

    try:
        broken = serve_torch(torch_model, plain[0], runner_type=BrokenSnapshots)
    except AssertionError as e:  # an argmax left the continuation
        assert "argmax" in str(e)
        return
    common, differ = compare(broken.logits, plain[1])
    assert differ > 0

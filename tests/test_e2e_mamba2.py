"""End to end with Mamba2's recurrence: the hybrid model of examples/hybrid_model.py with
``mixer="mamba2"`` (``TINY_MAMBA2``: its selective state update on the state pool the
gated delta rule's model uses) served with align-mode prefix caching on two-turn chats
with speculative drafts (tests/test_e2e.py's workload). Every position's logits, served
with the cache in pre-copy and in copy-free mode and from JAX, are the bits of the model
run on each request alone; every block entering the prefix cache holds the state at its
boundary."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import torch  # noqa: E402
from hybrid_model import TINY_MAMBA2, init_weights  # noqa: E402
from e2e_checks import check_cached_blocks, check_jax_serves_torchs_bits  # noqa: E402
from hybrid_serving import compare, multi_turn_workload, serve  # noqa: E402

MODEL = TINY_MAMBA2
B, S, NB, SLOTS = 4, 2, 48, 4
CACHE = MODEL.cache_config(B, S)
WEIGHTS = init_weights(MODEL, seed=0)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def torch_model():
    from hybrid_torch import TorchModel
    return TorchModel(MODEL, WEIGHTS, DEV)


@pytest.fixture(scope="module")
def plain(torch_model):
    """The workload, each request's greedy continuation, and its logits run alone."""
    from hybrid_torch import single_row
    return multi_turn_workload(MODEL, seed=0, conversations=2, block_size=B, new_tokens=6,
                               forward_one=single_row(torch_model, S))


@pytest.fixture(scope="module")
def served(torch_model, plain):
    """``served(mode)``: the torch runner's run with the cache on, once per mode."""
    from hybrid_torch import new_pools, serving_step

    from mamba_align.backends.torch import StateRunner
    runs = {}

    def get(mode="pre-copy"):
        if mode not in runs:
            runner = StateRunner(CACHE, SLOTS, torch_model.device, mode=mode)
            step = serving_step(torch_model, runner, new_pools(CACHE, NB, torch_model.device))
            runs[mode] = serve(MODEL, plain[0], plain[1], step, block_size=B, num_spec=S,
                               num_blocks=NB, snapshot=step.snapshot)
            runner.raise_errors()
        return runs[mode]
    return get


def test_cached_serving_gives_the_bits_of_each_request_alone(served, plain):
    on = served()
    assert sorted(r for r, n in on.hit_tokens.items() if n) == [1, 3]  # the second turns hit
    assert 0 < on.accepted < on.drafts
    common, differ = compare(on.logits, plain[2])
    assert common >= 40 and differ == 0


def test_copy_free_equals_pre_copy_bit_for_bit(served):
    pre, free = served("pre-copy"), served("copy-free")
    assert pre.logits.keys() == free.logits.keys()
    assert compare(pre.logits, free.logits) == (len(pre.logits), 0)


def test_every_cached_block_holds_the_state_at_its_boundary(torch_model, plain, served):
    on = served()
    assert len(on.cached) >= 4
    check_cached_blocks(torch_model, plain, on.cached, S)


def test_torch_equals_jax_bit_for_bit(served, plain):
    check_jax_serves_torchs_bits(MODEL, WEIGHTS, CACHE, NB, SLOTS, plain, served())

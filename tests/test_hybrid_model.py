"""The hybrid model of examples/hybrid_model.py on the library's kernels, with the gated
delta rule and with Mamba2's recurrence: against its float64 reference, torch and JAX bit
for bit, a row the same in any batch, and a prompt served in chunks through the state
blocks giving the bits of the prompt served at once (what makes a prefix-cache hit
exact)."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from hybrid_model import TINY, TINY_MAMBA2, Blocks, init_weights, reference_logits  # noqa: E402

from mamba_align.core import new_errors  # noqa: E402

S, NB = 2, 12  # drafts per step, blocks per pool
CFG = TINY.cache_config(block_size=4, num_spec=S)
WEIGHTS = init_weights(TINY, seed=0)
MODELS = {"gdn": (TINY, WEIGHTS), "mamba2": (TINY_MAMBA2, init_weights(TINY_MAMBA2, seed=0))}
assert TINY_MAMBA2.cache_config(4, S) == CFG  # the same pools
RNG = np.random.default_rng(0)
PROMPT = RNG.integers(0, TINY.vocab, size=10)


def empty_pools():
    return {n: np.zeros(CFG.pool_shape(n, NB), np.float32) for n in CFG.states}


class TorchRun:
    name = "torch"

    def __init__(self, mixer="gdn"):
        import torch
        from hybrid_torch import TorchModel
        self.torch = torch
        self.cfg, self.weights = MODELS[mixer]
        self.dev = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = TorchModel(self.cfg, self.weights, self.dev)

    def step(self, pools, tokens, rows):
        """``rows``: per row ``(length, temporal_read, conv_read, conv_bias,
        temporal_write [1 + S], conv_write, is_spec)``; returns (logits, pools, errors)."""
        t = self.torch
        T = lambda a, dt=t.int32: t.as_tensor(np.asarray(a), dtype=dt, device=self.dev)  # noqa
        pools = {n: t.as_tensor(p.copy(), device=self.dev) for n, p in pools.items()}
        errors = t.as_tensor(new_errors(), device=self.dev)
        cu = np.concatenate([[0], np.cumsum([r[0] for r in rows])])
        blocks = Blocks(*(T([r[i] for r in rows]) for i in range(1, 6)))
        spec = T([r[6] for r in rows], t.bool)
        logits = self.model.forward(pools, errors, T(tokens), T(cu), blocks, spec)
        return (logits.cpu().numpy(), {n: p.cpu().numpy() for n, p in pools.items()},
                errors.cpu().numpy())


class JaxRun:
    name = "jax"

    def __init__(self, mixer="gdn"):
        import jax
        import jax.numpy as jnp
        from hybrid_jax import forward, load_weights
        self.cfg, self.weights = MODELS[mixer]
        self.jnp, self.w = jnp, load_weights(self.cfg, self.weights)
        self.fn = jax.jit(forward, static_argnums=0, donate_argnums=(2, 3))

    def step(self, pools, tokens, rows):
        jnp = self.jnp
        A = lambda a, dt=jnp.int32: jnp.asarray(np.asarray(a), dt)  # noqa: E731
        cu = np.concatenate([[0], np.cumsum([r[0] for r in rows])])
        blocks = Blocks(*(A([r[i] for r in rows]) for i in range(1, 6)))
        logits, pools, errors = self.fn(self.cfg, self.w, {n: jnp.asarray(p) for n, p in
                                                           pools.items()},
                                        jnp.asarray(new_errors()), A(tokens), A(cu), blocks,
                                        A([r[6] for r in rows], bool))
        return np.asarray(logits), {n: np.asarray(p) for n, p in pools.items()}, \
            np.asarray(errors)


RUNS = {"torch": TorchRun, "jax": JaxRun}
_MADE = {}


def made(name, mixer):
    if (name, mixer) not in _MADE:
        _MADE[name, mixer] = RUNS[name](mixer)
    return _MADE[name, mixer]


@pytest.fixture(params=[(b, m) for m in MODELS for b in RUNS], ids="-".join)
def run(request):
    return made(*request.param)


def fresh(n, t_write=1, c_write=2):
    """A non-spec row of ``n`` tokens from an empty state, writing blocks t_write, c_write."""
    return (n, -1, -1, 0, [t_write] + [-1] * S, c_write, False)


def test_matches_the_float64_reference(run):
    logits, _, errors = run.step(empty_pools(), PROMPT, [fresh(len(PROMPT))])
    want = reference_logits(run.cfg, run.weights, PROMPT)
    np.testing.assert_allclose(logits, want, rtol=2e-4, atol=2e-4)
    assert errors.tolist() == new_errors().tolist()


@pytest.mark.parametrize("mixer", MODELS)
def test_torch_and_jax_give_the_same_bits(mixer):
    # a prefill row, a decode row reading the first row's blocks, a spec row of 1 + S
    pools = empty_pools()
    rng = np.random.default_rng(1)
    pools["ssm"][:, 3] = rng.normal(size=pools["ssm"][:, 3].shape)
    pools["conv"][:, 4] = rng.normal(size=pools["conv"][:, 4].shape)
    rows = [fresh(6), (1, 3, 4, 1, [5, -1, -1], 6, False), (1 + S, 3, 4, 0, [7, 8, 9], 10, True)]
    tokens = rng.integers(0, TINY.vocab, size=6 + 1 + 1 + S)
    got = [made(name, mixer).step(pools, tokens, rows) for name in ("torch", "jax")]
    for a, b in zip(got[0][:2], got[1][:2]):
        for x, y in (zip(a.values(), b.values()) if isinstance(a, dict) else [(a, b)]):
            np.testing.assert_array_equal(x, y)
    assert got[0][2].tolist() == got[1][2].tolist() == new_errors().tolist()


def test_a_row_gives_the_same_bits_in_any_batch(run):
    others = RNG.integers(0, TINY.vocab, size=9)
    alone, _, _ = run.step(empty_pools(), PROMPT[:3], [fresh(3)])
    batch, _, _ = run.step(empty_pools(), np.concatenate([others[:5], PROMPT[:3], others[5:]]),
                           [fresh(5, 3, 4), fresh(3), fresh(4, 5, 6)])
    np.testing.assert_array_equal(alone, batch[5:8])


def test_a_prompt_in_chunks_gives_the_bits_of_the_prompt_at_once(run):
    # 10 tokens at once, against 4 then 6 through the blocks written by the first chunk:
    # the logits of the last 6 tokens and the final states are the same bits
    whole, wp, _ = run.step(empty_pools(), PROMPT, [fresh(10, 1, 2)])
    _, mid, _ = run.step(empty_pools(), PROMPT[:4], [fresh(4, 3, 4)])
    part, pp, errors = run.step(mid, PROMPT[4:], [(6, 3, 4, 0, [5, -1, -1], 6, False)])
    np.testing.assert_array_equal(part, whole[4:])
    np.testing.assert_array_equal(pp["ssm"][:, 5], wp["ssm"][:, 1])
    K = TINY.conv_kernel
    np.testing.assert_array_equal(pp["conv"][:, 6, :, :K - 1], wp["conv"][:, 2, :, :K - 1])
    assert errors.tolist() == new_errors().tolist()


def test_logits_read_on_the_host_follow_numpys_copy_protocol():
    torch = pytest.importorskip("torch")
    from hybrid_torch import OnHost
    logits = OnHost(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert np.array_equal(np.asarray(logits), np.arange(6, dtype=np.float32).reshape(2, 3))
    assert np.asarray(logits, dtype=np.int64).dtype == np.int64
    with pytest.raises(ValueError, match="copy"):
        np.array(logits, copy=False)


@pytest.mark.parametrize("field,value,match", [
    ("eps", 0.0, "eps must be a finite float > 0"),
    ("eps", float("nan"), "eps must be a finite float > 0"),
    ("value_heads", 3, "must be a multiple of heads"),
    ("heads", 0, "heads must be >= 1"),
    ("conv_kernel", 1, "conv_kernel must be >= 2"),
    ("dtype", "int8", "dtype must be one of"),
    ("mixer", "mamba", "mixer must be one of"),
])
def test_the_model_config_refuses_what_it_cannot_run(field, value, match):
    from dataclasses import replace
    with pytest.raises(ValueError, match=match):
        replace(TINY, **{field: value})


@pytest.mark.parametrize("tokens,match", [([3, -1], "token -1 is not an id"),
                                          ([TINY.vocab], f"token {TINY.vocab} is not an id"),
                                          ([1.5], "must be integers")])
def test_token_ids_outside_the_vocabulary_are_refused(tokens, match):
    # a negative id would have read the embedding's last row (NumPy and torch wrap it)
    with pytest.raises(ValueError, match=match):
        reference_logits(TINY, init_weights(TINY), tokens)


def test_serving_refuses_a_request_outside_the_vocabulary():
    from hybrid_serving import Workload, serve
    work = Workload({0: (0, (1, 2, TINY.vocab))}, new_tokens=1)
    with pytest.raises(ValueError, match=f"request 0's prompt: token {TINY.vocab}"):
        serve(TINY, work, {0: [1]}, None, block_size=4, num_spec=1, num_blocks=8)


def test_serving_counts_the_cache_hits_of_every_admission(monkeypatch):
    # a preempted request is admitted again, often from the prefix cache: those hits are
    # reported beside the prompt's (they were dropped: only a request's first admission
    # was counted)
    import mamba_align.core.scheduler as sched_mod
    from hybrid_serving import Workload, serve
    admissions = []
    admit = sched_mod.Scheduler._admit

    def spy(self, req, hit_col, hit_block):
        admit(self, req, hit_col, hit_block)
        admissions.append((req.req_id, req.num_computed))
    monkeypatch.setattr(sched_mod.Scheduler, "_admit", spy)

    def step(inputs, sample):  # no model: the bookkeeping alone decides the hits
        return np.zeros((len(inputs.tokens), TINY.vocab), np.float32), sample()
    rng = np.random.default_rng(0)
    prefix = tuple(int(x) for x in rng.integers(1, TINY.vocab, 9))
    work = Workload({i: (0, prefix + (i + 1,)) for i in range(4)}, 8)
    outputs = {i: [int(x) for x in rng.integers(1, TINY.vocab, 8)] for i in range(4)}
    served = serve(TINY, work, outputs, step, block_size=4, num_spec=2, num_blocks=7,
                   check_argmax=False)
    hits = {}  # request -> the cached tokens of each of its admissions
    for r, n in admissions:
        hits.setdefault(r, []).append(n)
    assert served.preemptions > 0
    assert any(len(h) > 1 and any(h[1:]) for h in hits.values())  # back from the cache
    assert served.hit_tokens == {r: h[0] for r, h in hits.items()}
    assert served.readmit_hit_tokens == {r: sum(h[1:]) for r, h in hits.items() if sum(h[1:])}
    assert all(served.hit_tokens[r] < len(p) for r, (_, p) in work.requests.items())


def test_serving_helpers_take_the_edges_of_their_arguments():
    from hybrid_serving import Workload, multi_turn_workload, serve

    def forward_one(tokens, read, write):  # no model: token 1 follows every token
        lg = np.zeros((len(tokens), TINY.vocab), np.float32)
        lg[:, 1] = 1
        return lg
    # block size 1: no tail of 1 to B - 1 tokens (NumPy's "low >= high" before)
    work, outputs, _ = multi_turn_workload(TINY, 0, 2, 1, 2, forward_one)
    assert all(1 <= len(p) for _, p in work.requests.values())
    assert all(o == [1, 1] for o in outputs.values())
    with pytest.raises(ValueError, match="the workload has no requests"):
        serve(TINY, Workload({}, 1), {}, None, block_size=4, num_spec=1, num_blocks=8)

    def step(inputs, sample):
        return np.zeros((len(inputs.tokens), TINY.vocab), np.float32), sample()
    # outputs longer than new_tokens: the model length follows them ("exceeds
    # max_model_len" before)
    served = serve(TINY, Workload({0: (0, (1, 2, 3))}, 1), {0: [4, 5, 6]}, step, block_size=4,
                   num_spec=1, num_blocks=8, check_argmax=False)
    assert served.computed_tokens >= 5


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_the_toy_layers_drop_a_write_to_no_block(backend):
    # the serving-loop examples' toy layers: a write block of -1 is "no write"; index -1
    # would be the pool's last block
    from types import SimpleNamespace

    from prefix_scenario import CFG, NUM_BLOCKS
    window = np.full((1, 1 + CFG.num_spec), -1)
    window[0, 0] = 2
    ids = dict(temporal_read=[-1], conv_read=[-1], conv_read_bias=[0], temporal_write=window,
               conv_write=[-1])
    batch = SimpleNamespace(tokens=[(3, 4)], idx_mapping=[0], is_spec=[False])
    if backend == "torch":
        import torch
        import torch_serving_loop as loop
        pools = {n: torch.zeros(CFG.pool_shape(n, NUM_BLOCKS), device=loop.dev)
                 for n in CFG.states}
        blocks = SimpleNamespace(**{k: torch.tensor(np.asarray(v), device=loop.dev)
                                    for k, v in ids.items()})
        loop.toy_layer(pools, blocks, batch)
        pools = {n: p.cpu() for n, p in pools.items()}
    else:
        import jax.numpy as jnp
        import jax_serving_loop as loop
        blocks = SimpleNamespace(**{k: jnp.asarray(np.asarray(v)) for k, v in ids.items()})
        pools, _ = loop.toy_layer({n: jnp.zeros(CFG.pool_shape(n, NUM_BLOCKS))
                                   for n in CFG.states}, blocks, batch)
    assert not np.asarray(pools["conv"]).any()  # nothing written anywhere
    assert np.asarray(pools["ssm"])[0, 2].any()  # (the temporal write went where it was told)


def test_init_weights_and_shards_are_what_the_configs_need():
    from dataclasses import replace

    from hybrid_model import check_weights, shard
    bf16 = replace(TINY, dtype="bfloat16")
    check_weights(bf16, init_weights(bf16))
    part, w = shard(TINY, WEIGHTS, 2, 1)  # (shard checks its output too)
    check_weights(part, w)
    assert part.value_heads == TINY.value_heads // 2
    # Mamba2: rank 1 of 2 holds group 1's C and B channels, heads 2-3's x, dt, A, D
    m2, w2 = MODELS["mamba2"]
    part, w = shard(m2, w2, 2, 1)
    G, H, N, P = m2.heads, m2.value_heads, m2.head_k, m2.head_v
    heads = np.arange(H // 2, H)
    for n in ("A", "D", "dt_bias"):
        np.testing.assert_array_equal(w["l0." + n], w2["l0." + n][heads])
    np.testing.assert_array_equal(w["l0.w_dt"], w2["l0.w_dt"][:, heads])
    group = np.arange(N * G // 2, N * G)  # the second group's state-size channels
    conv = np.concatenate([group, G * N + group, 2 * G * N + np.arange(H // 2 * P, H * P)])
    np.testing.assert_array_equal(w["l1.conv_w"], w2["l1.conv_w"][conv])
    assert part.cache_config(4, S).states["ssm"].shape == (H // 2, P, N)


def _wrong_weights(kind):
    from dataclasses import replace
    w = dict(WEIGHTS)
    if kind == "dtype":  # fp32 weights given to a bf16 model: its pools are bf16
        return replace(TINY, dtype="bfloat16"), w, r"weight 'embed' is float32 \[64, 32\]; " \
            r"the config needs bfloat16 \[64, 32\]"
    if kind == "shape":
        w["l1.w_o"] = w["l1.w_o"][:, :-1]
        return TINY, w, r"weight 'l1.w_o' is float32 \[32, 31\]; the config needs float32 \[32, 32\]"
    if kind == "gate_dtype":
        w["l0.A_log"] = w["l0.A_log"].astype(np.float16)
        return TINY, w, "weight 'l0.A_log' is float16"
    w.pop("l0.conv_b")
    w["l0.conv_bias"] = WEIGHTS["l0.conv_b"]
    return TINY, w, r"missing \['l0.conv_b'\], unknown \['l0.conv_bias'\]"


@pytest.mark.parametrize("kind", ["dtype", "shape", "gate_dtype", "names"])
@pytest.mark.parametrize("entry", ["reference", "torch", "jax", "shard"])
def test_weights_the_config_cannot_run_are_refused(kind, entry):
    cfg, w, match = _wrong_weights(kind)
    with pytest.raises(ValueError, match=match):
        if entry == "reference":
            reference_logits(cfg, w, PROMPT)
        elif entry == "torch":
            from hybrid_torch import TorchModel
            TorchModel(cfg, w, "cpu")
        elif entry == "jax":
            from hybrid_jax import load_weights
            load_weights(cfg, w)
        else:
            from hybrid_model import shard
            shard(cfg, w, 2, 0)

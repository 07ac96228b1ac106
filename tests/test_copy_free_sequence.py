"""Pre-copy and copy-free at the kernel level (docs/semantics.md §3): the same sequence of
steps (prefill chunks, decode, spec rows with varying acceptance, block crossings) through
the torch runner and the JAX step functions, each step's resolved blocks fed to the conv1d
update, the gated delta rule and Mamba2's selective state update (a second temporal pool),
from the same start in both modes. Outputs, cache columns and temporal pools must be
bit-identical; conv pools on rows 0..K-2 of every block (rows K-1..W-1 are scratch,
unspecified, and may differ)."""

import numpy as np
import pytest
import torch

from mamba_align.core import CacheConfig, ConvSpec, TemporalSpec

B, S, KC, D, HV, KD = 4, 2, 3, 8, 2, 8
H, P, N = 2, 4, 8  # Mamba2: heads, head dim, state size (one group)
SLOTS, COLS = 2, 10
NB = SLOTS * COLS + 1
CFG = CacheConfig(B, S, 1, {"conv": ConvSpec(KC, D, "SD", "float32"),
                            "ssm": TemporalSpec((HV, KD, KD), "float32"),
                            "mamba": TemporalSpec((H, P, N), "float32")})
SSU = ("x", "dt", "A", "B", "C", "D", "dt_bias")
# per step, per slot: (tokens, spec, accepted); prompts of 6 and 3 tokens
STEPS = [[(6, 0, 6), (3, 0, 3)], [(3, 1, 1), (1, 0, 1)], [(3, 1, 3), (4, 0, 4)],
         [(2, 1, 2), (3, 1, 2)], [(1, 0, 1), (3, 1, 1)], [(3, 1, 3), (5, 0, 5)],
         [(3, 1, 2), (3, 1, 3)], [(2, 1, 1), (1, 0, 1)]]


def step_inputs(rng, n_tokens):
    return {"x": rng.normal(size=(n_tokens, D)).astype(np.float32),
            "q": rng.normal(size=(n_tokens, 1, KD)).astype(np.float32),
            "k": rng.normal(size=(n_tokens, 1, KD)).astype(np.float32),
            "v": rng.normal(size=(n_tokens, HV, KD)).astype(np.float32),
            "g": -rng.uniform(0.05, 0.5, (n_tokens, HV)).astype(np.float32),
            "beta": rng.uniform(0, 1, (n_tokens, HV)).astype(np.float32),
            "ssu": {"x": rng.normal(size=(n_tokens, H, P)).astype(np.float32),
                    "dt": rng.normal(size=(n_tokens, H)).astype(np.float32),
                    "A": -rng.uniform(0.5, 2, H).astype(np.float32),
                    "B": rng.normal(size=(n_tokens, 1, N)).astype(np.float32),
                    "C": rng.normal(size=(n_tokens, 1, N)).astype(np.float32),
                    "D": rng.normal(size=H).astype(np.float32),
                    "dt_bias": rng.normal(size=H).astype(np.float32)}}


def start():
    rng = np.random.default_rng(0)
    pools = {n: rng.normal(size=CFG.pool_shape(n, NB)).astype(np.float32) for n in CFG.states}
    bt = 1 + np.arange(SLOTS * COLS).reshape(SLOTS, COLS)
    w, cb = rng.normal(size=(D, KC)).astype(np.float32), rng.normal(size=D).astype(np.float32)
    return pools, bt, w, cb


def run_torch(mode, algorithm="recurrent"):
    from mamba_align.backends.torch import (StateRunner, conv1d_update_, gated_delta_rule_,
                                            selective_state_update_)
    pools, bt, w, cb = start()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    T = lambda a: torch.as_tensor(np.asarray(a), device=dev)  # noqa: E731, N806
    runner = StateRunner(CFG, SLOTS, dev, mode)
    runner.add_requests(T([0, 1]), T([0, 0]))
    pools = {n: T(p) for n, p in pools.items()}
    rng, trace, crossings = np.random.default_rng(1), [], 0
    errors = torch.zeros(2, dtype=torch.int32, device=dev)
    for step in STEPS:
        q_len = [t for t, _, _ in step]
        cu, spec = T(np.concatenate([[0], np.cumsum(q_len)])), T([s for _, s, _ in step])
        inp = step_inputs(rng, sum(q_len))
        ssu = inp.pop("ssu")
        ssu = [T(ssu[n]) for n in SSU]
        inp = {n: T(a) for n, a in inp.items()}
        idx, ql, ns, btt = T([0, 1]), T(q_len), T([a for _, _, a in step]), T(bt)
        blocks = runner.preprocess(pools, idx, ql, spec, btt)
        crossings += int(((blocks.src_col >= 0) & (blocks.src_col != blocks.run_col)).sum())
        y = conv1d_update_(pools["conv"], errors, inp["x"], T(w), T(cb), cu, blocks.conv_read,
                           blocks.conv_read_bias, blocks.conv_write, spec, layer=0,
                           layout="SD")["y"]
        o = gated_delta_rule_(pools["ssm"], errors, inp["q"], inp["k"], inp["v"], inp["g"],
                              inp["beta"], cu, blocks.temporal_read, blocks.temporal_write,
                              spec, layer=0, algorithm=algorithm)["o"]
        ym = selective_state_update_(pools["mamba"], errors, *ssu, cu, blocks.temporal_read,
                                     blocks.temporal_write, spec, layer=0,
                                     algorithm=algorithm)["y"]
        cache = runner.postprocess(pools, idx, ql, spec, ns, btt)
        trace.append((y.cpu().numpy(), o.cpu().numpy(), ym.cpu().numpy(), cache.cpu().numpy()))
    assert not runner.errors() and errors.tolist() == [0, 0]
    return trace, {n: p.cpu().numpy() for n, p in pools.items()}, crossings


def run_jax(mode, algorithm="recurrent"):
    import jax.numpy as jnp

    from mamba_align.backends import jax as mj
    from mamba_align.backends.jax import ops
    from mamba_align.core import new_errors
    pools, bt, w, cb = start()
    J = jnp.asarray  # noqa: N806
    state = mj.add_requests(mj.init_state(SLOTS), J([0, 1]), J([0, 0]), config=CFG)
    pools = {n: J(p) for n, p in pools.items()}
    rng, trace, errors = np.random.default_rng(1), [], J(new_errors())
    for step in STEPS:
        q_len = [t for t, _, _ in step]
        cu, spec = J(np.concatenate([[0], np.cumsum(q_len)])), J([s for _, s, _ in step])
        inp = step_inputs(rng, sum(q_len))
        ssu = inp.pop("ssu")
        ssu = [J(ssu[n]) for n in SSU]
        inp = {n: J(a) for n, a in inp.items()}
        idx, ql, ns = J([0, 1]), J(q_len), J([a for _, _, a in step])
        state, pools, blocks = mj.preprocess(state, pools, idx, ql, spec, J(bt), config=CFG,
                                             mode=mode)
        c = ops.conv1d_update(pools["conv"], errors, inp["x"], J(w), J(cb), cu,
                              blocks.conv_read, blocks.conv_read_bias, blocks.conv_write, spec,
                              layer=0, layout="SD")
        t = ops.gated_delta_rule(pools["ssm"], c["errors"], inp["q"], inp["k"], inp["v"],
                                 inp["g"], inp["beta"], cu, blocks.temporal_read,
                                 blocks.temporal_write, spec, layer=0, algorithm=algorithm)
        m = ops.selective_state_update(pools["mamba"], t["errors"], *ssu, cu,
                                       blocks.temporal_read, blocks.temporal_write, spec, layer=0,
                                       algorithm=algorithm)
        pools, errors = {"conv": c["pool"], "ssm": t["pool"], "mamba": m["pool"]}, m["errors"]
        state, pools, cache = mj.postprocess(state, pools, idx, ql, spec, ns, J(bt), config=CFG)
        trace.append((np.asarray(c["y"]), np.asarray(t["o"]), np.asarray(m["y"]),
                      np.asarray(cache)))
    assert not mj.errors(state) and np.asarray(errors).tolist()[0] == 0
    return trace, {n: np.asarray(p) for n, p in pools.items()}, None


@pytest.mark.parametrize("run,algorithm", [(run_torch, "recurrent"), (run_jax, "recurrent"),
                                           (run_torch, "chunked")],
                         ids=["torch", "jax", "torch-chunked"])
def test_pre_copy_and_copy_free_compute_the_same_bits(run, algorithm):
    pre, pre_pools, crossings = run("pre-copy", algorithm)
    free, free_pools, _ = run("copy-free", algorithm)
    if crossings is not None:
        assert crossings >= 4  # the sequence exercises the modes' difference
    caches = 0
    for (*out1, c1), (*out2, c2) in zip(pre, free):
        for a, b in zip(out1, out2):  # conv y, gated delta rule o, selective state update y
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(c1.astype(np.int64), c2.astype(np.int64))
        caches += int((np.asarray(c1) >= 0).sum())
    assert caches >= 2
    np.testing.assert_array_equal(pre_pools["ssm"], free_pools["ssm"])
    np.testing.assert_array_equal(pre_pools["mamba"], free_pools["mamba"])
    np.testing.assert_array_equal(pre_pools["conv"][:, :, :KC - 1], free_pools["conv"][:, :, :KC - 1])


def test_torch_and_jax_run_the_same_sequence_bit_for_bit():
    (t_trace, t_pools, _), (j_trace, j_pools, _) = run_torch("copy-free"), run_jax("copy-free")
    for a, b in zip(t_trace, j_trace):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(np.asarray(x).astype(np.float64) if x.dtype.kind == "f"
                                          else x.astype(np.int64),
                                          np.asarray(y).astype(np.float64) if y.dtype.kind == "f"
                                          else y.astype(np.int64))
    for n in t_pools:
        np.testing.assert_array_equal(t_pools[n], j_pools[n])

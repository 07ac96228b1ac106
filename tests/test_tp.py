"""Tensor parallelism over two ranks on the CPU: torch with gloo, two processes launched
with torchrun (examples/serve_tp_torch.py), and JAX on a mesh of two host devices
(examples/serve_tp_jax.py). Each rank holds its heads' share of the weights and the state
pools, the bookkeeping is replicated. The tp = 2 run samples the tokens of tp = 1, cached
equals uncached bit for bit within it, both torch ranks compute the same logits, the
logits are within fp32 reduction-order error of tp = 1, and torch's tp = 2 logits are
JAX's, bit for bit."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from hybrid_model import TINY, init_weights, shard  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_shards_partition_the_heads_and_the_mlp():
    w = init_weights(TINY, seed=0)
    parts = [shard(TINY, w, 2, r) for r in range(2)]
    cfg = parts[0][0]
    assert (cfg.heads, cfg.value_heads, cfg.mlp) == (1, 2, 32)
    assert cfg.cache_config(4, 2).states["ssm"].shape == (2, TINY.head_v, TINY.head_k)
    for name in ("l0.w_o", "l1.w_down"):  # row-parallel: the ranks' rows make the whole
        np.testing.assert_array_equal(np.concatenate([p[1][name] for p in parts]), w[name])
    for name in ("l0.w_gate", "l1.w_up"):  # column-parallel
        np.testing.assert_array_equal(np.concatenate([p[1][name] for p in parts], 1), w[name])
    # every q/k/v/z column and conv channel goes to exactly one rank
    cols = sorted(c for p in parts for c in p[1]["l0.w_qkvz"][0].tolist())
    assert cols == sorted(w["l0.w_qkvz"][0].tolist())
    with pytest.raises(ValueError, match="must divide"):
        shard(TINY, w, 3, 0)


def run_tp(tmp_path, framework: str):
    out, logits = tmp_path / f"{framework}.json", tmp_path / f"{framework}.npz"
    script = [str(ROOT / "examples" / f"serve_tp_{framework}.py"), "--out", str(out),
              "--logits", str(logits), "--new-tokens", "3"]
    launch = ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(free_port())] if framework == "torch" else
              [sys.executable])
    # on the CPU even on a GPU machine (its one GPU cannot hold two ranks): the interpreter,
    # gloo, two host devices; two GPUs are the run this suite cannot make on one
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    r = subprocess.run(launch + script, capture_output=True, text=True, timeout=900, env=env)
    # serve's argmax check raises (a non-zero exit) at any token other than tp = 1's
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["tp"] == 2 and got["positions"] > 0 and got["hit_tokens"] > 0
    assert got["cached_equals_uncached"] and got["compared"] == got["positions"]
    # the all-reduce adds two fp32 partial sums where one device's kernel adds in one pass
    assert got["max_abs_diff_vs_tp1"] <= 1e-5 * max(1.0, got["max_abs_logit"])
    return got, np.load(logits)


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tp")
    return {f: run_tp(tmp, f) for f in ("torch", "jax")}


def test_two_torch_ranks_serve_like_one(tp_runs):
    got, _ = tp_runs["torch"]
    assert got["ranks_agree"]


def test_a_two_device_jax_mesh_serves_like_one(tp_runs):
    got, _ = tp_runs["jax"]
    assert len(set(got["devices"])) == 2  # the mesh spans two devices


def test_torch_and_jax_shard_alike_bit_for_bit(tp_runs):
    (_, a), (_, b) = tp_runs["torch"], tp_runs["jax"]
    np.testing.assert_array_equal(a["keys"], b["keys"])
    np.testing.assert_array_equal(a["logits"], b["logits"])

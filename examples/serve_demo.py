"""`make demo`: a small Gated-DeltaNet model served with align-mode prefix caching, from
torch and from JAX, on one multi-turn workload (each chat's second turn resumes from the
first turn's snapshots) with speculative decoding.

The same workload runs five ways: each request alone without a cache (the ground truth),
then through the reference scheduler and each backend's runner with the prefix cache on
and off, in pre-copy and copy-free mode, and from JAX. The table shows what the cache
saved; the checks compare the logits of every position, bit for bit, between the runs.
Runs on the CPU (Triton's interpreter) or a GPU:
``python examples/serve_demo.py [--conversations N] [--new-tokens N] [--png PATH]
[--mixer mamba2]`` (``mamba2``: the same model with Mamba2's recurrence in place of the
gated delta rule).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from hybrid_model import TINY, TINY_MAMBA2, init_weights  # noqa: E402
from hybrid_serving import compare, multi_turn_workload, serve  # noqa: E402

warnings.filterwarnings("ignore", message=".*called outside jax.jit")  # eager bookkeeping
B, S = 4, 2  # block size, drafts per step


class Progress:
    """A one-line progress bar over a run's scheduler steps."""

    def __init__(self, label: str, step):
        self.label, self.inner, self.n = label, step, 0

    def __call__(self, *args):
        self.n += 1
        if sys.stdout.isatty():
            print(f"\r  {self.label:34s} step {self.n:3d} " + "#" * min(40, self.n), end="",
                  flush=True)
        return self.inner(*args)

    def done(self, seconds: float) -> None:
        print(f"\r  {self.label:34s} {self.n:3d} steps in {seconds:5.1f} s" + " " * 40)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", type=int, default=3, help="chats of two turns each")
    ap.add_argument("--new-tokens", type=int, default=6, help="at least 1")
    ap.add_argument("--png", type=Path, default=Path("demo_tokens_saved.png"))
    ap.add_argument("--mixer", choices=("gdn", "mamba2"), default="gdn",
                    help="the recurrence: the gated delta rule or Mamba2's")
    args = ap.parse_args()
    if args.new_tokens < 1 or args.conversations < 1:
        ap.error("--new-tokens and --conversations must be at least 1")

    import jax
    from hybrid_jax import load_weights, new_pools as jax_pools, serving_step as jax_step
    from hybrid_torch import TorchModel, new_pools, serving_step, single_row

    from mamba_align.backends import jax as mj
    from mamba_align.backends.torch import StateRunner

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = TINY_MAMBA2 if args.mixer == "mamba2" else TINY
    cache, num_blocks, slots = cfg.cache_config(B, S), 64, 4
    weights = init_weights(cfg, seed=0)
    layers = (f"{cfg.layers} Mamba2 layers, d_model {cfg.d_model}, {cfg.value_heads} heads"
              if cfg.mixer == "mamba2" else
              f"{cfg.layers} GDN layers, d_model {cfg.d_model}, {cfg.value_heads} value heads")
    print(f"model: {layers} of {cfg.head_v}x{cfg.head_k}, vocab {cfg.vocab}; block size {B}, "
          f"{S} drafts per step; torch on {dev}, JAX on {jax.default_backend()}")
    model = TorchModel(cfg, weights, dev)

    t = time.perf_counter()
    workload, outputs, alone = multi_turn_workload(cfg, 0, args.conversations, B,
                                                   args.new_tokens, single_row(model, S))
    print(f"  {'each request alone, no cache':34s} {time.perf_counter() - t:5.1f} s")

    def run_torch(caching: bool, mode: str):
        runner = StateRunner(cache, slots, dev, mode=mode)
        step = Progress(f"torch, cache {'on ' if caching else 'off'}, {mode}",
                        serving_step(model, runner, new_pools(cache, num_blocks, dev)))
        t0 = time.perf_counter()
        out = serve(cfg, workload, outputs, step, block_size=B, num_spec=S,
                    num_blocks=num_blocks, caching=caching)
        step.done(time.perf_counter() - t0)
        runner.raise_errors()
        return out, time.perf_counter() - t0

    runs = {("torch", "on", "pre-copy"): run_torch(True, "pre-copy"),
            ("torch", "off", "pre-copy"): run_torch(False, "pre-copy"),
            ("torch", "on", "copy-free"): run_torch(True, "copy-free")}
    jstep = jax_step(cfg, load_weights(cfg, weights), cache, jax_pools(cache, num_blocks), slots)
    step = Progress("JAX, cache on , pre-copy", jstep)
    t0 = time.perf_counter()
    served = serve(cfg, workload, outputs, step, block_size=B, num_spec=S,
                   num_blocks=num_blocks)
    step.done(time.perf_counter() - t0)
    if mj.errors(jstep.carry["state"]):
        sys.exit(f"JAX run flagged faults: {mj.errors(jstep.carry['state'])}")
    runs[("jax", "on", "pre-copy")] = (served, time.perf_counter() - t0)

    prompt_tokens = sum(len(p) for _, p in workload.requests.values())
    print(f"\n{args.conversations} chats of two turns: {len(workload.requests)} requests, "
          f"{prompt_tokens} prompt tokens, {args.new_tokens} new tokens each\n")
    print(f"| backend | cache | mode | tokens from the prefix cache | tokens computed | "
          f"drafts accepted | steps | wall s |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for (be, caching, mode), (r, sec) in runs.items():
        rate = f"{r.accepted}/{r.drafts} ({100 * r.accepted / max(1, r.drafts):.0f} %)"
        print(f"| {be} | {caching} | {mode} | {sum(r.hit_tokens.values())} | "
              f"{r.computed_tokens} | {rate} | {r.steps} | {sec:.1f} |")

    def check(name: str, a, b, same_positions: bool = False) -> bool:
        a, b = (x.logits if hasattr(x, "logits") else x for x in (a, b))
        common, differ = compare(a, b)
        ok = differ == 0 and common > 0 and (a.keys() == b.keys() or not same_positions)
        print(f"  {'PASS' if ok else 'FAIL'}  {name}: {common} positions compared, "
              f"{differ} differ")
        return ok

    on, off = runs[("torch", "on", "pre-copy")][0], runs[("torch", "off", "pre-copy")][0]
    print("\nchecks (logits of every position both runs computed, bit for bit):")
    ok = all([check("cached == uncached", on, off),
              check("torch == JAX", on, runs[("jax", "on", "pre-copy")][0], True),
              check("pre-copy == copy-free", on, runs[("torch", "on", "copy-free")][0], True),
              check("cached == each request alone", on, alone)])
    plot(workload, on, args.png)
    if not ok:
        sys.exit(1)


def plot(workload, served, path: Path) -> None:
    """Bar chart of the prompt tokens each request took from the prefix cache."""
    try:
        import matplotlib
    except ImportError:
        print(f"(matplotlib is not installed: no {path})")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rids = sorted(workload.requests)
    lens = [len(workload.requests[r][1]) for r in rids]
    hits = [served.hit_tokens.get(r, 0) for r in rids]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar(rids, lens, color="#c8d3e0", label="prompt tokens")
    ax.bar(rids, hits, color="#2f6db5", label="served from the prefix cache")
    ax.set_xlabel("request")
    ax.set_ylabel("tokens")
    ax.set_xticks(rids)
    ax.legend(fontsize=8)
    ax.set_title("Prompt tokens served from the prefix cache", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""The hybrid model served end to end: decode steps per second and time to first token
(TTFT), torch and JAX, with the prefix cache on and off, on one multi-turn workload.

The model is ``examples/hybrid_model.py``'s ``GPU`` configuration (Qwen3-Next's head
shapes: 16 value heads of 128 x 128, 4 layers, d_model 1024, bf16). The workload: chats of
two turns (``hybrid_serving.multi_turn_workload``); each second turn repeats its first
turn's prompt and answer, so with the cache on it resumes from a snapshot and computes
only its new message, with it off it computes the whole prompt. Speculative decoding with
``S`` drafts from the perturbed drafter, greedy acceptance on the device.

Methods, each the runner as a server runs it (batches padded to ``max_num_seqs`` rows and
a power of two of tokens, ``serve(pad=True)``):

- ``torch_graphs``: the whole step (add_requests, preprocess, the model, greedy
  acceptance, postprocess) captured once per shape into a CUDA graph and replayed;
- ``torch_eager``: the same step launched op by op;
- ``jax``: the same step as one jitted call per shape, state and pools donated.

Each method serves the workload once with its logits checked against each request run
alone (every position, bit for bit; that run also compiles and captures), then
``--repeats`` times timed; the run of median wall time is reported. Steps/s: steps whose rows all decode, over their summed step time (the step call,
sampled counts back on the host); TTFT: admission to the end of the step that sampled a
request's first token (host wall clock, queueing included).

Usage::

    python benchmarks/bench_serving.py [--out benchmarks/results] [--small]

Writes ``serving_h200.json`` and ``serving_h200.md``; ``--small``: the tiny model on the
CPU (Triton's interpreter), a smoke run.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before jax is imported

import argparse
import datetime
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))
sys.path.insert(0, str(HERE))
from timing import results_folder  # noqa: E402  (makes mamba_align importable from a checkout)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from hybrid_model import GPU, TINY, init_weights  # noqa: E402
from hybrid_serving import compare, multi_turn_workload, serve  # noqa: E402

warnings.filterwarnings("ignore", message=".*donat")  # CPU: JAX cannot donate buffers


def settings(small: bool) -> Dict[str, Any]:
    if small:
        return dict(model="TINY", block_size=4, num_spec=2, conversations=1, new_tokens=4,
                    max_num_seqs=4, max_num_tokens=16, num_blocks=64)
    return dict(model="GPU", block_size=32, num_spec=3, conversations=8, new_tokens=48,
                max_num_seqs=8, max_num_tokens=256, num_blocks=512)


def run(args: argparse.Namespace) -> Dict[str, Any]:
    from hybrid_jax import load_weights, new_pools as jax_pools, serving_step as jax_step
    from hybrid_torch import TorchModel, new_pools, serving_step, single_row

    from mamba_align.backends import jax as mj
    from mamba_align.backends.torch import StateRunner

    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    st = settings(args.small)
    cfg = TINY if args.small else GPU
    B, S, NB, slots = st["block_size"], st["num_spec"], st["num_blocks"], st["max_num_seqs"]
    cache = cfg.cache_config(B, S)
    weights = init_weights(cfg, seed=0)
    model = TorchModel(cfg, weights, dev)
    t0 = time.perf_counter()
    workload, outputs, alone = multi_turn_workload(cfg, 0, st["conversations"], B,
                                                   st["new_tokens"], single_row(model, S))
    print(f"workload: {len(workload.requests)} requests, each run alone in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    second = {r for r in workload.requests if r % 2}  # the turns that can hit the cache

    def make(method: str):
        if method == "jax":
            step = jax_step(cfg, load_weights(cfg, weights), cache, jax_pools(cache, NB), slots,
                            fused=True)
            return step, lambda: mj.errors(step.carry["state"])
        runner = StateRunner(cache, slots, dev)
        step = serving_step(model, runner, new_pools(cache, NB, dev), fused=True,
                            graphs=method == "torch_graphs")
        return step, runner.errors

    methods = ["torch_graphs", "torch_eager", "jax"] if cuda else ["torch_eager", "jax"]
    records: List[Dict[str, Any]] = []
    for method in methods:
        for caching in (True, False):
            step, errors = make(method)
            kw = dict(block_size=B, num_spec=S, num_blocks=NB, caching=caching,
                      max_num_seqs=slots, max_num_tokens=st["max_num_tokens"], pad=True)
            t0 = time.perf_counter()
            checked = serve(cfg, workload, outputs, step, **kw)  # compiles, captures
            first_s = time.perf_counter() - t0
            common, differ = compare(checked.logits, alone)
            if differ or common != len(checked.logits) or errors():
                raise SystemExit(f"{method} cache {caching}: {differ} of {common} positions "
                                 f"differ from each request alone; faults {errors()}")
            runs = [] if args.repeats else [(checked, first_s)]  # 0: the checked run
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                runs.append((serve(cfg, workload, outputs, step, record=False, **kw),
                             time.perf_counter() - t0))
            if errors():
                raise SystemExit(f"{method} cache {caching}: faults {errors()}")
            # the run of median wall time stands for the method (each serves the same steps)
            timed, wall = sorted(runs, key=lambda r: r[1])[len(runs) // 2]
            decode = [s for d, s in timed.step_seconds if d]
            hit = {r: s for r, s in timed.ttft.items() if timed.hit_tokens.get(r)}
            rec = {
                "method": method, "caching": caching, "steps": timed.steps,
                "decode_steps": len(decode),
                "decode_steps_per_s": len(decode) / sum(decode) if decode else None,
                "decode_step_ms_median": statistics.median(decode) * 1e3 if decode else None,
                "steps_per_s": timed.steps / sum(s for _, s in timed.step_seconds),
                "wall_s": wall, "first_run_s": first_s, "repeats": args.repeats,
                "wall_s_all": sorted(w for _, w in runs),
                "generated_tokens": len(workload.requests) * workload.new_tokens,
                "prompt_tokens": sum(len(p) for _, p in workload.requests.values()),
                "computed_tokens": timed.computed_tokens,
                "hit_tokens": sum(timed.hit_tokens.values()),
                "accepted": timed.accepted, "drafts": timed.drafts,
                "ttft_ms_second_turns": ms_stats([timed.ttft[r] for r in second]),
                "ttft_ms_first_turns": ms_stats([timed.ttft[r] for r in workload.requests
                                                 if r not in second]),
                "ttft_ms_hits": ms_stats(list(hit.values())),
                "ttft_ms_misses": ms_stats([s for r, s in timed.ttft.items() if r not in hit]),
                "checked_positions": common,
            }
            records.append(rec)
            print(f"{method:12s} cache {'on ' if caching else 'off'}: {timed.steps} steps, "
                  f"decode {fmt(rec['decode_steps_per_s'])} steps/s, TTFT second turns "
                  f"{fmt(rec['ttft_ms_second_turns']['mean'])} ms, wall {wall:.2f} s "
                  f"(first run {first_s:.1f} s, {common} positions checked)", flush=True)
            del step
    import jax
    header = {
        "device": torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)",
        "torch": torch.__version__, "jax": jax.__version__, "jax_backend": jax.default_backend(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": {k: getattr(cfg, k) for k in ("vocab", "d_model", "layers", "heads",
                                               "value_heads", "head_k", "head_v", "mlp",
                                               "dtype")},
        "settings": st, "requests": len(workload.requests),
    }
    return {"header": header, "records": records}


def ms_stats(seconds: Sequence[float]) -> Dict[str, Optional[float]]:
    if not seconds:
        return {"mean": None, "median": None, "n": 0}
    return {"mean": 1e3 * statistics.fmean(seconds), "median": 1e3 * statistics.median(seconds),
            "n": len(seconds)}


def fmt(x: Optional[float], digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def table(data: Dict[str, Any]) -> str:
    """The results as a Markdown table (also ``BENCHMARKS.md``'s)."""
    lines = ["| method | cache | steps | decode steps/s | decode step ms (median) | "
             "TTFT second turns ms | TTFT first turns ms | TTFT hits / misses ms | "
             "tokens from the prefix cache | tokens computed | drafts accepted | wall s |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in data["records"]:
        lines.append(
            f"| {r['method']} | {'on' if r['caching'] else 'off'} | {r['steps']} | "
            f"{fmt(r['decode_steps_per_s'])} | {fmt(r['decode_step_ms_median'], 2)} | "
            f"{fmt(r['ttft_ms_second_turns']['mean'])} | "
            f"{fmt(r['ttft_ms_first_turns']['mean'])} | "
            f"{fmt(r['ttft_ms_hits']['mean'])} / {fmt(r['ttft_ms_misses']['mean'])} | "
            f"{r['hit_tokens']} | {r['computed_tokens']} | "
            f"{r['accepted']}/{r['drafts']} | {r['wall_s']:.2f} |")
    return "\n".join(lines)


def serving_md(results: Path) -> str:
    """``BENCHMARKS.md``'s section from ``serving_h200.json`` (not measured: says so)."""
    head = "## The hybrid model served end to end\n\n"
    path = results / "serving_h200.json"
    if not path.exists():
        return head + "Not measured."
    data = json.loads(path.read_text())
    h, st, m = data["header"], data["header"]["settings"], data["header"]["model"]
    return head + "\n".join([
        f"- Card: {h['device']}; torch {h['torch']}, jax {h['jax']} ({h['jax_backend']}); "
        f"{h['date']}. Written by `benchmarks/bench_serving.py`.",
        f"- Model: `examples/hybrid_model.py` GPU: {m['layers']} GDN layers, d_model "
        f"{m['d_model']}, {m['value_heads']} value heads of {m['head_v']} x {m['head_k']}, "
        f"MLP {m['mlp']}, vocab {m['vocab']}, {m['dtype']}; every op a kernel of the "
        "library (batch-invariant dense kernels on CUDA cores, not tensor cores).",
        f"- Workload: {st['conversations']} chats of two turns ({h['requests']} requests, "
        f"{st['new_tokens']} new tokens each); block size {st['block_size']}, "
        f"{st['num_spec']} drafts per step (30 % of drafted tokens wrong), "
        f"{st['max_num_seqs']} rows and {st['max_num_tokens']} tokens per step at most.",
        "- Each method's logits were checked against each request run alone, every "
        "position bit for bit, before its timed runs (" + (
            f"the run of median wall time of {data['records'][0]['repeats']} is shown"
            if data["records"][0].get("repeats") else "the checked run is shown, compile "
            "time included") + "). Decode steps/s: steps whose rows all decode, "
        "over their summed step time; TTFT: host wall clock from admission to the step "
        "that sampled the first token (queueing included).", "", table(data)])


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="default: benchmarks/results (a temporary folder with --small)")
    ap.add_argument("--small", action="store_true", help="CPU smoke run: the tiny model")
    ap.add_argument("--repeats", type=int, default=None,
                    help="timed runs per method (the median one is reported; default 7; "
                         "0, the default with --small: report the checked run)")
    args = ap.parse_args(argv)
    if args.repeats is None:
        args.repeats = 0 if args.small else 7
    args.out = results_folder(args.out, args.small, "bench_serving_")
    data = run(args)
    (args.out / "serving_h200.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / "serving_h200.md").write_text(table(data) + "\n")
    print(table(data))


if __name__ == "__main__":
    main()

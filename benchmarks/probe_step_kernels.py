"""Where a step's device time goes: ``bench_dispatch.py``'s torch step (preprocess +
pre-copy + resolve, postprocess + copies; 64 or 512 rows, nothing to copy) captured in a
CUDA graph, replayed under ``torch.profiler``: each kernel's duration and the gaps between
them, per step (one-off probe for the bad-input issue's step cost). Runs on whatever
``mamba_align`` is first on ``PYTHONPATH`` (``.baseline`` for the version before the checks).

Usage::

    python benchmarks/probe_step_kernels.py --out DIR --label L [--rows 64 512]
        [--variant NAME:module.ATTR=INT,... ...]

A ``--variant`` re-plans the step with module constants of ``mamba_align`` set (e.g.
``warps1:kernels.bookkeeping.WARPS=1``), restored afterwards; the package as it is runs
first, as ``L``. Each (variant, rows) writes ``probe_step_kernels_<L>[_<NAME>]_rows<R>_h200.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from timing import captured, constants, parse_variant  # noqa: E402  (makes the package importable)

import torch  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402

from bench_dispatch import setup, torch_step  # noqa: E402


def measure(rows: int) -> dict:
    """One step of ``rows`` rows captured and replayed: per-step device time (event timer)
    and each kernel's duration and the gaps between them (profiler)."""
    s = setup(False, rows)
    _, step = torch_step(s, torch.device("cuda"))
    graph = captured(step)
    for _ in range(200):
        graph.replay()
    torch.cuda.synchronize()
    per_step = []
    for _ in range(5):  # device time per replay, back to back (as bench_dispatch's torch_graph)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(500):
            graph.replay()
        b.record()
        b.synchronize()
        per_step.append(a.elapsed_time(b) / 500 * 1e3)
    steps = 50
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            graph.replay()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    per = len(kernels) // steps
    names = [k.name for k in kernels[:per]]
    dur: Dict[int, List[float]] = {i: [] for i in range(per)}
    gaps: Dict[int, List[float]] = {i: [] for i in range(per - 1)}
    span = []
    for st in range(steps):
        ks = kernels[st * per:(st + 1) * per]
        for i, k in enumerate(ks):
            dur[i].append(k.time_range.end - k.time_range.start)
        for i in range(per - 1):
            gaps[i].append(ks[i + 1].time_range.start - ks[i].time_range.end)
        span.append(ks[-1].time_range.end - ks[0].time_range.start)
    return {"rows": rows, "device": torch.cuda.get_device_name(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "us_per_step_event_timer": statistics.median(per_step),
            "kernels": [{"name": names[i], "us": statistics.median(dur[i])} for i in range(per)],
            "gaps_us": [statistics.median(gaps[i]) for i in range(per - 1)],
            "first_start_to_last_end_us": statistics.median(span),
            "kernels_per_step": per, "kernel_events": len(kernels)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--rows", type=int, nargs="+", default=[64])
    ap.add_argument("--variant", action="append", default=[], type=parse_variant)
    args = ap.parse_args()
    for name, sets in [("", {})] + args.variant:
        label = args.label + (f"_{name}" if name else "")
        with constants(sets):
            for rows in args.rows:
                rec = {"label": label, "constants": sets, **measure(rows)}
                print(json.dumps({k: rec[k] for k in ("label", "rows", "us_per_step_event_timer")}
                                 | {"kernels_us": [round(k["us"], 2) for k in rec["kernels"]]}),
                      flush=True)
                out = Path(args.out) / f"probe_step_kernels_{label}_rows{rows}_h200.json"
                out.write_text(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()

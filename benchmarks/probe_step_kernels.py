"""Where a step's device time goes: ``bench_dispatch.py``'s torch step (preprocess +
pre-copy + resolve, postprocess + copies; 64 or 512 rows, nothing to copy) captured in a
CUDA graph, replayed under ``torch.profiler``: each kernel's duration and the gaps between
them, per step (one-off probe for the bad-input issue's step cost). Runs on whatever
``mamba_align`` is first on ``PYTHONPATH`` (``.baseline`` for the version before the checks).

Usage::

    python benchmarks/probe_step_kernels.py --out DIR --label L [--rows 64]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from timing import captured  # noqa: E402  (also makes the package importable)

import torch  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402

from bench_dispatch import setup, torch_step  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--rows", type=int, default=64)
    args = ap.parse_args()
    s = setup(False, args.rows)
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
    dur = {i: [] for i in range(per)}
    gaps = {i: [] for i in range(per - 1)}
    span = []
    for st in range(steps):
        ks = kernels[st * per:(st + 1) * per]
        for i, k in enumerate(ks):
            dur[i].append(k.time_range.end - k.time_range.start)
        for i in range(per - 1):
            gaps[i].append(ks[i + 1].time_range.start - ks[i].time_range.end)
        span.append(ks[-1].time_range.end - ks[0].time_range.start)
    rec = {"label": args.label, "rows": args.rows, "device": torch.cuda.get_device_name(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "us_per_step_event_timer": statistics.median(per_step),
           "kernels": [{"name": names[i], "us": statistics.median(dur[i])} for i in range(per)],
           "gaps_us": [statistics.median(gaps[i]) for i in range(per - 1)],
           "first_start_to_last_end_us": statistics.median(span),
           "kernels_per_step": per, "kernel_events": len(kernels)}
    print(json.dumps(rec, indent=1))
    out = Path(args.out) / f"probe_step_kernels_{args.label}_rows{args.rows}_h200.json"
    out.write_text(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()

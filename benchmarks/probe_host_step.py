"""Host cost of one eager torch step with every kernel launch made a no-op: what
``StateRunner.preprocess`` + ``postprocess`` spend in Python (checks, plans, tensor
descriptions, output allocation) before the GPU sees anything. ``bench_dispatch.py``'s
step (64 rows by default), small pools, on the CPU; runs on whatever ``mamba_align`` is first
on ``PYTHONPATH`` (``.baseline`` for the version before the checks). One-off probe.

Usage::

    python benchmarks/probe_host_step.py [--rows 64] [--label L] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import timing  # noqa: E402,F401  (makes the package importable, registers the torch ops)

import torch  # noqa: E402
import triton.runtime.interpreter as interpreter  # noqa: E402
import triton.runtime.jit as jit  # noqa: E402

from bench_dispatch import setup, torch_step  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--label", default="current")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    for kind in (jit.JITFunction, interpreter.InterpretedFunction):
        kind.__getitem__ = lambda self, grid: (lambda *a, **k: None)  # no launch
    s = setup(True, args.rows)
    _, step = torch_step(s, torch.device("cpu"))
    for _ in range(50):
        step()
    per_step = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(300):
            step()
        per_step.append((time.perf_counter() - t0) / 300 * 1e6)
    import mamba_align
    rec = {"label": args.label, "rows": args.rows, "package": mamba_align.__file__,
           "cpu": platform.processor() or platform.machine(),
           "host_us_per_step_median_of_7": statistics.median(per_step),
           "host_us_per_step_all": per_step}
    print(json.dumps(rec))
    if args.out:
        (args.out / f"probe_host_step_{args.label}.json").write_text(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()

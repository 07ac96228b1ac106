"""Probe (GPU, torch only): the whole bookkeeping step under CUDA-graph replay, per launch
shape of the two bookkeeping kernels and per package version.

The step is ``bench_dispatch.py``'s (preprocess + pre-copy + resolve, postprocess + its
copies, nothing to copy), replayed from one CUDA graph and timed as its ``torch_graph``
row (back-to-back replays, one synchronize). Variants: warps per program and rows per
program of ``preprocess_resolve`` and ``postprocess`` (patched into the plans'
``row_launch``), on the working tree's package and on earlier versions carried in
git-ignored folders (``--versions label=DIR``, ``DIR/mamba_align`` from ``git archive``).
Each version runs in its own process; every variant's first step must give the default
variant's blocks, and no fault may be flagged.

Usage (GPU machine, after ``make gpu-setup``)::

    python benchmarks/probe_step_shapes.py --out DIR [--rows 64 512] \\
        [--versions base=.baseline prev=.prev]

Writes ``probe_step_shapes_h200.json`` under ``--out`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent

#: (warps, rows per program); the first is each version's own launch shape
SHAPES = [(None, None), (1, 8), (2, 8), (1, 4), (2, 4), (1, 16), (4, 4)]


def worker(rows: int, shapes: List[tuple]) -> List[Dict[str, Any]]:
    sys.path.insert(0, str(HERE))
    from timing import host_ms  # noqa: E402  (makes mamba_align importable)
    import numpy as np
    import torch
    from bench_dispatch import pool_shapes, setup

    import mamba_align.kernels.bookkeeping as bk
    import mamba_align.kernels.resolve as rs
    from mamba_align.backends.torch import StateRunner

    own = getattr(bk, "row_launch", None)
    s = setup(False, rows)
    cfg, dev = s["config"], torch.device("cuda")
    T = lambda a: torch.as_tensor(a, device=dev)  # noqa: E731, N806
    out, ref = [], None
    for warps, per_program in shapes:
        if (warps, per_program) != (None, None):
            if own is None:
                continue  # a version without row_launch: its own shape only

            def patched(n, _w=warps, _p=per_program, **c):
                saved = bk.ROWS_PER_PROGRAM
                bk.ROWS_PER_PROGRAM = _p
                try:
                    launch = own(n, **c)
                finally:
                    bk.ROWS_PER_PROGRAM = saved
                return {**launch, "num_warps": _w}
            bk.row_launch = rs.row_launch = patched
        for name in ("plan_preprocess_resolve", "plan_postprocess"):
            for mod in (bk, rs):
                fn = getattr(mod, name, None)
                if fn is not None and hasattr(fn, "cache_clear"):
                    fn.cache_clear()
        runner = StateRunner(cfg, s["slots"], dev, "pre-copy", torch.int32)
        runner.add_requests(T(s["live"]), T(s["num_computed"]))
        pools = {n: torch.zeros(shape, dtype=getattr(torch, cfg.states[n].dtype), device=dev)
                 for n, shape in pool_shapes(s).items()}
        idx, q, spec, bt = (T(s[k]) for k in ("idx_mapping", "query_len", "is_spec",
                                              "block_table"))
        ns = T(s["num_sampled"])

        def step(_=None):
            blocks = runner.preprocess(pools, idx, q, spec, bt)
            runner.postprocess(pools, idx, q, spec, ns, bt)
            return blocks

        first = step()
        got = np.concatenate([getattr(first, f).cpu().numpy().astype(np.int64).ravel()
                              for f in ("temporal_read", "conv_read", "temporal_write")])
        if ref is None:
            ref = got
        elif not np.array_equal(ref, got):
            raise SystemExit(f"shape {warps, per_program}: blocks differ from the default")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        sync = lambda c: (torch.cuda.synchronize(), c)[1]  # noqa: E731
        ms = [host_ms(lambda c: graph.replay(), None, sync)[0] for _ in range(3)]
        if hasattr(runner, "errors") and runner.errors():
            raise SystemExit(f"shape {warps, per_program}: faults {runner.errors()}")
        out.append({"warps": warps, "rows_per_program": per_program, "rows": rows,
                    "us_per_step": [1e3 * m for m in ms]})
        print(f"  rows {rows} warps {warps} per_program {per_program}: "
              + " / ".join(f"{1e3 * m:.2f}" for m in ms) + " us", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--versions", nargs="*", default=[], help="label=DIR (DIR/mamba_align)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        recs = [r for n in args.rows for r in worker(n, SHAPES)]
        print("RESULT " + json.dumps(recs))
        return
    records = []
    for version in ["current=" + str(HERE.parent.parent)] + args.versions:
        label, path = version.split("=", 1)
        env = dict(os.environ)
        if label != "current":
            env["PYTHONPATH"] = os.pathsep.join([str(Path(path).resolve())]
                                                + env.get("PYTHONPATH", "").split(os.pathsep))
        print(f"{label}:", flush=True)
        r = subprocess.run([sys.executable, __file__, "--worker", "--rows",
                            *map(str, args.rows)], env=env, capture_output=True, text=True)
        sys.stdout.write("".join(l + "\n" for l in r.stdout.splitlines()
                                 if not l.startswith("RESULT ")))
        if r.returncode:
            print(r.stderr[-3000:])
            continue
        line = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")][-1]
        records += [{"version": label, **x} for x in json.loads(line[len("RESULT "):])]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_step_shapes_h200.json").write_text(json.dumps(records, indent=1) + "\n")
    print("\n| version | rows | warps | rows/program | µs per step (3 runs) |")
    print("|---|---:|---:|---:|---|")
    for x in records:
        print(f"| {x['version']} | {x['rows']} | {x['warps'] or 'own'} | "
              f"{x['rows_per_program'] or 'own'} | "
              + " / ".join(f"{u:.2f}" for u in x["us_per_step"]) + " |")


if __name__ == "__main__":
    main()

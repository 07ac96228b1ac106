"""The copy launches' grids at Qwen3-Next-like pools (``bench_copy.py``'s: 36 layers, 2 MiB
fp32 temporal blocks, ``[3, 8192]`` bf16 SD conv blocks): for each grid variant, the
temporal and conv copies of B rows (TB/s, graph timing, bytes checked first) and the same
launches when no row copies (µs), the cost every decode step without a crossing pays.
One-off probe for the copy grids' program targets and tile size.

Usage::

    python benchmarks/probe_copy_grid.py --out DIR [--batches 1 8 64 256]
        [--variant NAME:module.ATTR=INT,... ...]

The package's own constants run first (``current``); a variant sets ``mamba_align`` module
constants (e.g. ``t1k:kernels.copy.TEMPORAL_PROGRAMS=1024``). Writes
``probe_copy_grid_h200.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from timing import bench_ms, constants, free, parse_variant  # noqa: E402

import torch  # noqa: E402

from bench_copy import GIB, check_ours, pick_rows  # noqa: E402
from mamba_align.backends import torch as tops  # noqa: E402
from mamba_align.kernels import copy as kc  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--variant", action="append", default=[], type=parse_variant)
    args = ap.parse_args()
    dev = torch.device("cuda")
    L, nb = args.layers, 2 * max(args.batches) + 1
    t_block, (w, dim) = (32, 128, 128), (3, 8192)
    temporal = torch.empty((L, nb) + t_block, device=dev).normal_()
    conv = torch.empty((L, nb, w, dim), dtype=torch.bfloat16, device=dev).normal_()
    errors = torch.tensor([0, 2**31 - 1], dtype=torch.int32, device=dev)
    t_bytes, c_moved = temporal[0, 0].numel() * 4, (w - 1) * dim * 2
    gen = torch.Generator().manual_seed(0)
    rows = {b: pick_rows(b, nb, gen, dev) for b in args.batches}
    records: List[Dict[str, Any]] = []
    for name, sets in [("current", {})] + args.variant:
        with constants(sets):
            for b, (src, dst) in rows.items():
                bias, none = torch.ones_like(src), torch.full_like(src, -1)
                check_ours(temporal, conv, errors, src, dst, bias)
                cases = {
                    "temporal": (2 * b * L * t_bytes,
                                 lambda: tops.copy_temporal_(temporal, errors, src, dst)),
                    "conv": (2 * b * L * c_moved,
                             lambda: tops.copy_conv_(conv, errors, src, dst, bias, layout="SD")),
                    "temporal_none": (0, lambda: tops.copy_temporal_(temporal, errors, none, dst)),
                    "conv_none": (0, lambda: tops.copy_conv_(conv, errors, none, dst, bias,
                                                             layout="SD")),
                }
                for case, (nbytes, fn) in cases.items():
                    ms = bench_ms(fn, True, graph=True)
                    free(True)
                    rec = {"variant": name, "constants": sets, "case": case, "batch": b,
                           "us": ms * 1e3, "tbps": nbytes / (ms * 1e-3) / 1e12 if nbytes else None}
                    records.append(rec)
                    print(json.dumps(rec), flush=True)
                print(f"  {name} B={b}: temporal grid "
                      f"{kc.temporal_tiling(b, L, t_bytes // 4, 4)['grid']}, conv grid "
                      f"{kc.conv_tiling(b, L, w, dim, 2, 'SD')['grid']}", flush=True)
    if errors[0].item():
        raise SystemExit(f"the copies flagged faults: {errors.tolist()}")
    out = {"device": torch.cuda.get_device_name(), "layers": L, "num_blocks": nb,
           "pool_gib": (temporal.numel() * 4 + conv.numel() * 2) / GIB,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "timer": "timing.bench_ms graph (timing.graph_ms)", "records": records}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_copy_grid_h200.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

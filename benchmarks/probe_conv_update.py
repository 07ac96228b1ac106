"""The conv1d update's tiles against fla's ``causal_conv1d_update``, at the decode and spec
rows of ``bench_recurrent.py`` (one-off probe: which channels-per-program and warps the
one-token path wants, and how far it is from fla alone in the same process).

Every configuration is checked against the float64 reference first (rows 0 and B - 1),
then timed under CUDA-graph replay on cold conv groups (``recurrent_cases.Case``). The
tile is forced by patching ``kernels.conv1d.conv_tile`` / ``NUM_WARPS`` (the plan reads
them when it is built; its cache is cleared in between). Runs on whatever ``mamba_align``
is first on ``PYTHONPATH`` (an earlier version for a same-session A/B: ``--label``).

Usage::

    python benchmarks/probe_conv_update.py --out DIR [--label L] [--layout DS|SD]
        [--tiles 128x4 256x4 ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from timing import bench_ms, free  # noqa: E402

import torch  # noqa: E402

from mamba_align.kernels import conv1d as kconv  # noqa: E402
from recurrent_cases import Case, check, conv_bytes, load_fla, retune_fla_conv, shapes  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="current")
    ap.add_argument("--layout", default="DS", choices=("DS", "SD"))
    ap.add_argument("--tiles", nargs="*", default=["default", "128x4", "256x4", "512x4",
                                                   "256x8", "512x8", "64x2"])
    args = ap.parse_args()
    dev = torch.device("cuda")
    s = shapes(False)
    fla = load_fla()
    gen = torch.Generator().manual_seed(0)
    default_tile, default_warps = kconv.conv_tile, kconv.NUM_WARPS
    rows = []
    for T, spec in ((1, False), (1 + s["S"], True)):
        for B in s["batches"]:
            c = Case(s, B, T, spec, dev, gen, args.layout)
            for cfg in args.tiles:
                if cfg == "default":
                    kconv.conv_tile, kconv.NUM_WARPS = default_tile, default_warps
                else:
                    tile, warps = (int(v) for v in cfg.split("x"))
                    kconv.conv_tile = lambda *_, tile=tile: tile
                    kconv.NUM_WARPS = warps
                kconv.plan_conv1d_update.cache_clear()
                c.i = 0
                y = c.conv()
                for row in sorted({0, B - 1}):
                    check(f"conv {cfg} B={B} T={T} row {row}", y[row * T:(row + 1) * T],
                          c.conv_ref(row), 2e-2)
                c.assert_clean(f"conv {cfg}")
                ms = bench_ms(c.timed(c.conv), True, graph=True)
                c.assert_clean(f"conv {cfg}, timed")
                rows.append({"label": args.label, "layout": args.layout, "method": "ours",
                             "tile": cfg, "batch": B,
                             "tokens_per_row": T, "us": ms * 1e3})
                print(json.dumps(rows[-1]), flush=True)
            if fla is not None and not spec and args.layout == "DS":
                _, _, conv_update = fla
                K = s["KC"]
                retune_fla_conv()
                caches = []
                for crb, _ in c.csets:
                    cache = torch.zeros(B, s["D"], K, device=dev, dtype=c.x.dtype)
                    cache[:, :, 1:] = c.cpool[1, crb, :, :K - 1]
                    caches.append(cache)
                c.i = 0
                y, _ = conv_update(x=c.x, cache=caches[0].clone(), weight=c.w, bias=None,
                                   activation="silu")
                check(f"fla conv B={B}", y[:1], c.conv_ref(0), 2e-2)
                ms = bench_ms(c.timed(lambda: conv_update(
                    x=c.x, cache=caches[c.i % c.cnsets], weight=c.w, bias=None,
                    activation="silu")), True, graph=True)
                rows.append({"label": args.label, "method": "fla", "tile": "autotuned",
                             "batch": B, "tokens_per_row": T, "us": ms * 1e3,
                             "bytes": conv_bytes(s, B, K - 1)})
                print(json.dumps(rows[-1]), flush=True)
                del caches
            del c
            free(True)
    kconv.conv_tile, kconv.NUM_WARPS = default_tile, default_warps
    out = Path(args.out) / f"probe_conv_update_{args.label}_{args.layout}_h200.json"
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

"""The conv1d update's tiles against fla's ``causal_conv1d_update`` (alone and pooled), at
the decode and spec rows of ``bench_recurrent.py``, on a DS pool and on the same windows in
an SD pool (one-off probe: which channels-per-program and warps the one-token path wants,
and how far it is from fla in the same process).

Every configuration is checked against the float64 reference first (rows 0 and B - 1),
then timed under CUDA-graph replay on cold conv groups (``recurrent_cases.Case``). The
tile is forced by patching ``kernels.conv1d.conv_tile`` / ``NUM_WARPS`` (the plan reads
them when it is built; its cache is cleared in between). Runs on whatever ``mamba_align``
is first on ``PYTHONPATH`` (an earlier version for a same-session A/B: ``--label``).

Usage::

    python benchmarks/probe_conv_update.py --out DIR [--label L] [--layouts DS SD]
        [--tiles default 128x4 256x4 ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from timing import bench_ms, free  # noqa: E402

import torch  # noqa: E402

from mamba_align.kernels import conv1d as kconv  # noqa: E402
from recurrent_cases import Case, check, load_fla, retune_fla_conv, shapes  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="current")
    ap.add_argument("--layouts", nargs="*", default=["DS"], choices=("DS", "SD"))
    ap.add_argument("--tiles", nargs="*", default=["default", "128x4", "256x4", "512x4",
                                                   "256x8", "512x8", "64x2"])
    ap.add_argument("--small", action="store_true", help="CPU smoke run (interpreter)")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    s = shapes(args.small)
    fla = load_fla() if cuda else None
    gen = torch.Generator().manual_seed(0)
    default_tile, default_warps = kconv.conv_tile, kconv.NUM_WARPS
    rows = []

    def keep(**row):
        rows.append(dict(label=args.label, **row))
        print(json.dumps(rows[-1]), flush=True)

    for T, spec in ((1, False), (1 + s["S"], True)):
        for B in s["batches"]:
            c = Case(s, B, T, spec, dev, gen, "DS")
            if fla is not None and not spec:  # on the DS pool's windows
                fla_rows(s, c, fla, keep)
            for layout in args.layouts:
                if layout != c.conv_layout:  # the same windows in an SD pool
                    c.cpool, c.conv_layout = c.cpool.transpose(2, 3).contiguous(), layout
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
                        check(f"conv {layout} {cfg} B={B} T={T} row {row}",
                              y[row * T:(row + 1) * T], c.conv_ref(row), 2e-2)
                    c.assert_clean(f"conv {cfg}")
                    ms = bench_ms(c.timed(c.conv), cuda, graph=cuda)
                    c.assert_clean(f"conv {cfg}, timed")
                    keep(layout=layout, method="ours", tile=cfg, batch=B, tokens_per_row=T,
                         us=ms * 1e3)
            del c
            free(cuda)
    kconv.conv_tile, kconv.NUM_WARPS = default_tile, default_warps
    out = Path(args.out) / f"probe_conv_update_{args.label}_h200.json"
    out.write_text(json.dumps({"device": torch.cuda.get_device_name() if cuda else "cpu",
                               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                                   timespec="seconds"), "rows": rows}, indent=1))


def fla_rows(s, c: Case, fla, keep) -> None:
    """fla's conv update alone (contiguous ``[B, D, K]`` caches cycled like ours) and pooled
    (gather the window's history, kernel, scatter), as ``bench_recurrent.py`` calls it."""
    _, _, conv_update = fla
    B, K, dev = c.B, s["KC"], c.x.device
    retune_fla_conv()
    caches = []
    for crb, _ in c.csets:
        cache = torch.zeros(B, s["D"], K, device=dev, dtype=c.x.dtype)
        cache[:, :, 1:] = c.cpool[1, crb, :, :K - 1]
        caches.append(cache)
    c.i = 0
    y, _ = conv_update(x=c.x, cache=caches[0].clone(), weight=c.w, bias=None, activation="silu")
    check(f"fla conv B={B}", y[:1], c.conv_ref(0), 2e-2)
    ms = bench_ms(c.timed(lambda: conv_update(x=c.x, cache=caches[c.i % c.cnsets], weight=c.w,
                                              bias=None, activation="silu")), True, graph=True)
    keep(layout="DS", method="fla", tile="autotuned", batch=B, tokens_per_row=c.T, us=ms * 1e3)
    del caches

    def pooled():
        cc = torch.zeros(B, s["D"], K, device=dev, dtype=c.x.dtype)
        cc[:, :, 1:] = c.cpool[1, c.crb, :, :K - 1]
        conv_update(x=c.x, cache=cc, weight=c.w, bias=None, activation="silu")
        c.cpool[1, c.cwb, :, :K - 1] = cc[:, :, 1:]

    ms = bench_ms(c.timed(pooled), True, graph=True)
    keep(layout="DS", method="fla_pooled", tile="autotuned", batch=B, tokens_per_row=c.T,
         us=ms * 1e3)


if __name__ == "__main__":
    main()

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
        [--tiles default 128x4 256x4 ...] [--conv-drafts N] [--small]
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
from recurrent_cases import Case, check, fla_conv_calls, load_fla, shapes  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="current")
    ap.add_argument("--layouts", nargs="*", default=["DS"], choices=("DS", "SD"))
    ap.add_argument("--tiles", nargs="*", default=["default", "128x4", "256x4", "512x4",
                                                   "256x8", "512x8", "64x2"])
    ap.add_argument("--conv-drafts", type=int, default=None, metavar="N",
                    help="drafts the conv pool's windows hold room for (W = K - 1 + N; "
                         "default S); spec rows of 1 + N tokens, none with 0")
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

    drafts = s["S"] if args.conv_drafts is None else args.conv_drafts
    for T, spec in ((1, False), (1 + drafts, True))[:2 if drafts else 1]:
        for B in s["batches"]:
            c = Case(s, B, T, spec, dev, gen, "DS", conv_S=drafts, state=False)
            if fla is not None and not spec:  # on the DS pool's windows
                fla_rows(s, c, fla, keep)
            for layout in sorted(args.layouts):  # DS first: SD is the same windows, moved
                if layout == "SD":  # the same windows in an SD pool
                    c.use_sd_pool()
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
                         width=s["KC"] - 1 + drafts, us=ms * 1e3)
            del c
            free(cuda)
    kconv.conv_tile, kconv.NUM_WARPS = default_tile, default_warps
    Path(args.out).mkdir(parents=True, exist_ok=True)
    out = Path(args.out) / f"probe_conv_update_{args.label}_h200.json"
    out.write_text(json.dumps({"device": torch.cuda.get_device_name() if cuda else "cpu",
                               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                                   timespec="seconds"), "rows": rows}, indent=1))


def fla_rows(s, c: Case, fla, keep) -> None:
    """fla's conv update alone and pooled (``recurrent_cases.fla_conv_calls``)."""
    alone, pooled = fla_conv_calls(s, c, fla[2], "probe")
    for method, fn in (("fla", alone), ("fla_pooled", pooled)):
        keep(layout="DS", method=method, tile="autotuned", batch=c.B, tokens_per_row=c.T,
             width=s["KC"] - 1 + c.conv_S, us=bench_ms(c.timed(fn), True, graph=True) * 1e3)


if __name__ == "__main__":
    main()

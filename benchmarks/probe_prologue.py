"""One-off A/B probe: the recurrent kernels of whatever ``mamba_align`` is first on
``PYTHONPATH`` (an earlier version for a same-session comparison: ``--label``), timed on
``bench_recurrent.py``'s cases with fla alone in the same process.

Rows: the gated delta rule at decode (B = 1, 16, 64, 256) and spec (B = 64); the conv
update at decode on the DS and SD pools (B = 1, 16, 64, 256); fla's fused recurrent gated
delta rule and conv update alone. Every output is checked against the float64 reference
first. Each row is timed ``--repeat`` times under CUDA-graph replay (cold blocks, cycled);
the record keeps every figure and their median, in ``probe_prologue_{label}_h200.json``
under ``--out`` (``..._{label}_2_h200.json`` and so on when the label ran before).

Usage::

    python benchmarks/probe_prologue.py --out DIR [--label L] [--repeat 3]
        [--batches 1,16,64,256] [--gdn-only | --conv-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from timing import bench_ms, free  # noqa: E402

import torch  # noqa: E402

from bench_recurrent import fla_rows  # noqa: E402
from recurrent_cases import Case, check, fla_conv_calls, load_fla, shapes  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="current")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batches", default="1,16,64,256", help="decode batches, comma-separated")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--gdn-only", action="store_true",
                      help="the gated delta rule at decode only: no conv, spec or fla rows")
    only.add_argument("--conv-only", action="store_true",
                      help="the conv update at decode only (and fla's): no gated delta rule")
    args = ap.parse_args()
    dev = torch.device("cuda")
    s = shapes(False)
    fla = load_fla()
    gen = torch.Generator().manual_seed(0)
    rows = []

    def timed(op, method, B, T, fn):
        ms = [bench_ms(fn, True, graph=True) for _ in range(args.repeat)]
        rows.append(dict(label=args.label, op=op, method=method, batch=B, tokens_per_row=T,
                         us=[m * 1e3 for m in ms], median_us=statistics.median(ms) * 1e3))
        print(json.dumps(rows[-1]), flush=True)

    decode = tuple(int(b) for b in args.batches.split(","))
    spec_rows = () if args.gdn_only or args.conv_only else (64,)
    for T, spec, batches in ((1, False, decode), (4, True, spec_rows)):
        for B in batches:
            c = Case(s, B, T, spec, dev, gen)
            o = None if args.conv_only else c.gdn()
            y = None if args.gdn_only else c.conv()
            for row in sorted({0, B - 1}):
                if o is not None:
                    want_o, want_h = c.gdn_ref(row)
                    check(f"gdn B={B} row {row}", o[row * T:(row + 1) * T], want_o, 2e-2)
                    check(f"gdn state B={B} row {row}",
                          c.pool[1, c.wbs[row, :want_h.shape[0]]], want_h, 2e-2)
                if y is not None:
                    check(f"conv B={B} row {row}", y[row * T:(row + 1) * T], c.conv_ref(row),
                          2e-2)
            c.assert_clean(f"B={B}")
            if o is not None:
                timed("gdn", "ours", B, T, c.timed(c.gdn))
            if not spec and not args.gdn_only:
                timed("conv_ds", "ours", B, T, c.timed(c.conv))
                c.i = 0
                fused, _, conv_update = fla

                def rec(op, method, B_, T_, fn, nbytes, note=""):  # fla alone only
                    if method == "fla":
                        timed(f"{op}_fla", "fla", B_, T_, fn)
                if args.conv_only:  # fla's conv update alone, not its gated delta rule
                    timed("conv_fla", "fla", B, T, c.timed(fla_conv_calls(s, c, conv_update,
                                                                          "decode")[0]))
                else:
                    fla_rows(s, c, (fused, None, conv_update), rec, "decode")
                c.use_sd_pool()
                yy = c.conv()
                for row in sorted({0, B - 1}):
                    check(f"conv SD B={B} row {row}", yy[row * T:(row + 1) * T],
                          c.conv_ref(row), 2e-2)
                timed("conv_sd", "ours", B, T, c.timed(c.conv))
            c.assert_clean(f"B={B}, timed")
            del c
            free(True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"probe_prologue_{args.label}_h200.json"
    n = 1
    while path.exists():  # a label run twice in one call keeps both files
        n += 1
        path = out / f"probe_prologue_{args.label}_{n}_h200.json"
    path.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()

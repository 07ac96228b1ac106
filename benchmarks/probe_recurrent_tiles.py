"""Probe: the recurrent kernels' tile sizes and warp counts at Qwen3-Next shapes (H200).

The gated delta rule over value rows per program ``BV`` x warps, decode (T = 1) and spec
(T = 4, every candidate written); the conv1d update over channels per program x warps,
decode. CUDA-graph replay times of the torch launch, each configuration checked against
the float64 reference first. The tiles are batch-independent constants of the kernels:
this picks them once for the hardware (the results and the choice: benchmarks/README.md).

    python benchmarks/probe_recurrent_tiles.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_recurrent import Case, check, conv_bytes, shapes, state_bytes  # noqa: E402
from bench_copy import bench_ms, free  # noqa: E402

from mamba_align.kernels import conv1d as kconv  # noqa: E402
from mamba_align.kernels import gdn as kgdn  # noqa: E402


def set_gdn(bv: int, warps: int) -> None:
    kgdn.BV, kgdn.NUM_WARPS = bv, warps
    kgdn.plan_gated_delta_rule.cache_clear()
    kgdn.plan_gated_delta_rule_fused_gates.cache_clear()


def set_conv(tile: int, warps: int) -> None:
    kconv.MAX_TILE_D, kconv.NUM_WARPS = tile, warps
    kconv.plan_conv1d_update.cache_clear()


@triton.jit
def _own_pair_fault(cu_ptr, num_rows, num_tokens, CHUNK: tl.constexpr):
    """Stand-in for seqlens_fault that reads nothing (what the whole-array check costs)."""
    return tl.where(num_rows < 0, 1 << 13, 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--no-seqlens-check", action="store_true",
                    help="measure without the kernels' cu_seqlens pass (not a valid kernel)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--bv", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--conv", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()
    if args.no_seqlens_check:  # before the first compile: the kernels resolve it then
        kgdn.seqlens_fault = _own_pair_fault
        kconv.seqlens_fault = _own_pair_fault
    s = shapes(False)
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    rows = []
    for T, spec in ((1, False), (1 + s["S"], True)):
        for B in args.batches:
            c = Case(s, B, T, spec, dev, gen)
            for bv in args.bv:
                for warps in args.warps:
                    set_gdn(bv, warps)
                    c.cur = 0
                    o = c.gdn()
                    check(f"gdn BV={bv} w={warps}", o[:T], c.gdn_ref(0)[0], 2e-2)
                    ms = bench_ms(c.timed(c.gdn), True, graph=True)
                    tbps = state_bytes(s, B, T if spec else 1) / (ms * 1e-3) / 1e12
                    rows.append(dict(op="gdn", T=T, B=B, BV=bv, warps=warps, us=ms * 1e3,
                                     tbps=tbps, seqlens_check=not args.no_seqlens_check))
                    print(f"gdn T={T} B={B:3d} BV={bv:2d} warps={warps} {ms * 1e3:7.1f} us "
                          f"{tbps:5.2f} TB/s seqlens check {not args.no_seqlens_check}", flush=True)
            if not spec and args.conv:
                for tile in (32, 64, 128, 256):
                    for warps in (1, 2, 4):
                        set_conv(tile, warps)
                        c.cur = 0
                        y = c.conv()
                        check(f"conv tile={tile} w={warps}", y[:1], c.conv_ref(0), 2e-2)
                        ms = bench_ms(c.timed(c.conv), True, graph=True)
                        tbps = conv_bytes(s, B, s["KC"] - 1) / (ms * 1e-3) / 1e12
                        rows.append(dict(op="conv", T=T, B=B, TILE_D=tile, warps=warps,
                                         us=ms * 1e3, tbps=tbps))
                        print(f"conv B={B:3d} TILE_D={tile:3d} warps={warps} {ms * 1e3:7.1f} "
                              f"us {tbps:5.2f} TB/s", flush=True)
            c.assert_clean(f"T={T} B={B}")
            del c
            free(True)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "probe_recurrent_tiles_h200" + ("_no_seqlens" if args.no_seqlens_check else "")
    (args.out / f"{name}.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Compile proto.chain64_kernel offline for sm_90a (no GPU) for every variant and report
registers, spills, shared memory, the SASS of one loop trip and its opcode counts.

Run:  cd /tmp/chain64 && /work/main/.venv/bin/python compile_sass.py [-j 2] [--quick]
SASS files go to /tmp/chain64/sass/.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import multiprocessing as mp
import os
import re
import sys
import time
import warnings

os.environ["TRITON_INTERPRET"] = "0"
warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, "/work/main/benchmarks")
sys.path.insert(0, HERE)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ptxas_regs import assemble, loop_trip, _SASS_LINE  # noqa: E402  (read-only import)

import proto  # noqa: E402

OUT = os.path.join(HERE, "sass")
HV, K, V, BT = 32, 128, 128, 64
SIG = dict(w_ptr="*fp32", u_ptr="*fp32", kd_ptr="*fp32", glast_ptr="*fp32", h0_ptr="*fp32",
           h_ptr="*fp32", vnew_ptr="*fp32", ht_ptr="*fp32", T="i32", wlo_ptr="*fp32",
           kdlo_ptr="*fp32")
OPS = {"HMMA": r"^HMMA", "HGMMA": r"^HGMMA", "FFMA": r"^FFMA", "LDG": r"^LDG(?!STS)",
       "STG": r"^STG", "LDGSTS": r"^LDGSTS", "LDS": r"^LDS(?!M)", "LDSM": r"^LDSM",
       "STS": r"^STS", "BAR": r"^BAR", "LDL": r"^LDL", "STL": r"^STL", "MUFU": r"^MUFU"}


def opcodes(lines):
    c = collections.Counter()
    for text in lines:
        op = re.sub(r"^@!?U?P\w+\s+", "", text.strip()).split(" ")[0]
        for k, pat in OPS.items():
            if re.match(pat, op):
                c[k] += 1
    return c


def trip_lines(sass):
    """The instructions of the longest loop (the same choice as ptxas_regs.loop_trip)."""
    code = [(int(m.group(1), 16), m.group(2)) for m in map(_SASS_LINE.match, sass.splitlines())
            if m]
    where = {a: i for i, (a, _) in enumerate(code)}
    loops = []
    for i, (a, text) in enumerate(code):
        t = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if t and int(t.group(1), 16) < a and int(t.group(1), 16) in where:
            loops.append((where[int(t.group(1), 16)], i))
    lo, hi = max(loops, key=lambda x: x[1] - x[0])
    return [t for _, t in code[lo:hi + 1]], len(code)


def compile_one(v):
    bv, warps, split, prec, stages, vk, rna, presplit = v
    tag = name(v)
    fn = proto.chain64_kernel
    consts = dict(HV=HV, K=K, V=V, BT=BT, BV=bv, SPLIT=split, PREC=prec, VK=vk, RNA=rna,
                  PRESPLIT=presplit)
    names = fn.arg_names
    ptrs = [n for n in names if n in SIG and SIG[n].startswith("*")]
    src = ASTSource(fn=fn,
                    signature={n: "constexpr" if n in consts else SIG[n] for n in names},
                    constexprs=dict(consts),
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in ptrs})
    t0 = time.time()
    try:
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=warps, num_stages=stages))
        report, sass = assemble(k.asm["ptx"], disassemble=True)
    except Exception as e:  # noqa: BLE001
        return dict(tag=tag, v=v, error=f"{type(e).__name__}: {str(e)[:300]}")
    with open(os.path.join(OUT, tag + ".sass"), "w") as f:
        f.write(sass)
    body, nested = loop_trip(sass)
    lines, total = trip_lines(sass)
    return dict(tag=tag, v=v, report=report, smem=k.metadata.shared, body=body, nested=nested,
                total=total, ops=opcodes(lines), secs=time.time() - t0)


def name(v):
    bv, warps, split, prec, stages, vk, rna, presplit = v
    p = prec if prec != "3x" else "3x" + ("rna" if rna else "trunc") + ("_pre" if presplit
                                                                        else "")
    return f"bv{bv}_w{warps}_split{split}_{p}_s{stages}" + ("_VK" if vk else "")


def variants(quick):
    """(BV, warps, SPLIT, PREC, num_stages, VK, RNA, PRESPLIT)"""
    out = []
    P = itertools.product
    for bv, warps, split, stages in P((32, 64), (4, 8), (1, 2), (1, 2, 3)):
        out.append((bv, warps, split, "tf32x3", stages, False, True, False))
    for bv, warps, split, prec in P((32, 64), (4, 8), (1, 2), ("tf32", "ieee")):
        out.append((bv, warps, split, prec, 2, False, True, False))
    # the state held [BV, K] (transposed) for the tf32x3 configurations
    for bv, warps, split in P((32, 64), (4, 8), (1, 2)):
        out.append((bv, warps, split, "tf32x3", 2, True, True, False))
    # TF32x3 written out (bit-mask split), w / kd split in-kernel or beforehand
    for bv, warps, split, stages, vk, rna, pre in P((32, 64), (4, 8), (1, 2), (1, 2),
                                                     (False, True), (True, False),
                                                     (False, True)):
        out.append((bv, warps, split, "3x", stages, vk, rna, pre))
    if quick:
        out = out[:2]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    print(f"triton {triton.__version__}; sm_90a; HV {HV} K {K} V {V} BT {BT}; fp32 in/out")
    cols = ("HMMA", "HGMMA", "FFMA", "LDG", "STG", "LDGSTS", "LDS", "LDSM", "STS", "BAR",
            "LDL", "STL", "MUFU")
    with mp.Pool(args.j) as pool:
        for r in pool.imap(compile_one, variants(args.quick)):
            if "error" in r:
                print(f"{r['tag']:34s} FAILED {r['error']}", flush=True)
                continue
            bv, warps = r["v"][0], r["v"][1]
            trip = r["body"] - r["nested"]
            ops = " ".join(f"{c} {r['ops'][c]}" for c in cols if r["ops"][c])
            # per 16 tokens: a warp; all warps of a program; all warps per 32 value columns
            # (the work of one program of our BV = 32 grid: programs compare at equal work)
            print(f"{r['tag']:40s} {r['report']}; smem {r['smem']} B; programs "
                  f"{(V // bv) * HV}; trip {r['body']} instr/warp (nested {r['nested']}); "
                  f"per 16 tok: {trip / 4:.0f} a warp, {trip * warps / 4:.0f} a program, "
                  f"{trip * warps / 4 * 32 / bv:.0f} per 32 cols; total {r['total']}; "
                  f"[{ops}] ({r['secs']:.0f} s)", flush=True)


if __name__ == "__main__":
    main()

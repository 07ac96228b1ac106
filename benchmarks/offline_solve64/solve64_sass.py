"""Compile proto.step1_kernel (every SOLVE x PREC x warps x EXTRAS) and our step 1
(gdn_chunk_prepare_fused_gates_kernel as benchmarks/ptxas_regs.py's gdn_plan(8, 1,
"chunked").before[0] builds it) offline for sm_90a; report registers, spills, shared memory,
static SASS counts and the instructions a warp runs for one chunk (loops counted with
their trips).

Run:  cd /tmp/solve64 && /work/main/.venv/bin/python compile_sass.py [--only SUBSTR ...] \
          > compile_sass.txt        (one process; SASS in sass/<variant>.sass)
"""
from __future__ import annotations

import argparse
import collections
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

from ptxas_regs import assemble, _SASS_LINE, POINTERS, gdn_plan  # noqa: E402 (read-only)

import proto  # noqa: E402

OUT = os.path.join(HERE, "sass")
H, HV, K, V = 16, 32, 128, 128  # the benchmark's heads (q/k 16, v 32)
SIG = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", g_ptr="*fp32", beta_ptr="*fp32",
           w_ptr="*fp32", u_ptr="*fp32", cg_ptr="*fp32", cq_ptr="*fp32", ck_ptr="*fp32",
           ca_ptr="*fp32", T="i32", scale="fp32")
OPS = {"HMMA": r"^HMMA", "HGMMA": r"^HGMMA", "FFMA": r"^FFMA", "SHFL": r"^SHFL",
       "LDG": r"^LDG(?!STS)", "STG": r"^STG", "LDS": r"^LDS(?!M)", "LDSM": r"^LDSM",
       "STS": r"^STS", "BAR": r"^BAR", "LDL": r"^LDL", "STL": r"^STL", "MUFU": r"^MUFU"}


def opcodes(lines):
    c = collections.Counter()
    for text in lines:
        op = re.sub(r"^@!?U?P\w+\s+", "", text.strip()).split(" ")[0]
        for k, pat in OPS.items():
            if re.match(pat, op):
                c[k] += 1
    return c


def analyse(sass):
    """(code lines up to the last non-NOP, loops [(first, last)] by backward branches)."""
    code = [(int(m.group(1), 16), m.group(2).strip().rstrip(";").strip())
            for m in map(_SASS_LINE.match, sass.splitlines()) if m]
    while code:  # padding NOPs and the final self-loop (BRA to itself)
        a, text = code[-1]
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if text.startswith("NOP") or (m and int(m.group(1), 16) == a):
            code.pop()
        else:
            break
    where = {a: i for i, (a, _) in enumerate(code)}
    loops = []
    for i, (a, text) in enumerate(code):
        t = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if t and int(t.group(1), 16) < a and int(t.group(1), 16) in where:
            loops.append((where[int(t.group(1), 16)], i))
    return [t for _, t in code], loops


def fmt(c, keys=("HMMA", "HGMMA", "LDS", "LDSM", "STS", "BAR", "SHFL", "MUFU", "LDL", "STL")):
    return " ".join(f"{k} {c[k]}" for k in keys if c[k])


def compile_proto(solve, prec, warps, extras, l2norm=True, C=64, trans=False):
    if trans == "halves":
        fn = proto.step1_halves_kernel
        consts = dict(H=H, HV=HV, K=K, V=V, C=C, SOLVE=solve, PREC=prec, L2NORM=l2norm,
                      EXTRAS=extras)
    else:
        fn = proto.step1_kernel
        consts = dict(H=H, HV=HV, K=K, V=V, C=C, SOLVE=solve, PREC=prec, L2NORM=l2norm,
                      EXTRAS=extras, TRANS=trans)
    names = fn.arg_names
    ptrs = [n for n in names if n.endswith("_ptr")]
    src = ASTSource(fn=fn, signature={n: "constexpr" if n in consts else SIG[n] for n in names},
                    constexprs=dict(consts),
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in ptrs})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
    return k


def compile_ours(warps):
    """gdn_plan(8, 1, "chunked").before[0], as ptxas_regs.ptx builds its signature."""
    plan = gdn_plan(8, 1, "chunked").before[0]
    names = plan.kernel.arg_names
    sig = {n: POINTERS.get(n[:-4].replace("_in", ""), "*bf16") if n.endswith("_ptr")
           else "fp32" if n == "scale" else "i32" for n in names if n not in plan.constexprs}
    src = ASTSource(fn=plan.kernel,
                    signature={n: "constexpr" if n in plan.constexprs else sig[n]
                               for n in names},
                    constexprs=dict(plan.constexprs),
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in names
                           if n.endswith("_ptr")})
    opts = dict(plan.launch_options)
    opts["num_warps"] = warps
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts), plan


def report(tag, k, trips, tokens, warps, t0):
    """trips: the substitution loop's trip count. Our kernel (tokens 16): the chunk loop
    (the longest) with the substitution loop nested in it."""
    regs, sass = assemble(k.asm["ptx"], disassemble=True)
    with open(os.path.join(OUT, tag + ".sass"), "w") as f:
        f.write(sass)
    lines, loops = analyse(sass)
    total = len(lines)
    ops = opcodes(lines)
    if tag.startswith("ours"):
        lo, hi = max(loops, key=lambda x: x[1] - x[0])  # the chunk loop
        inner = [(a, b) for a, b in loops if lo < a and b <= hi]
        ia, ib = max(inner, key=lambda x: x[1] - x[0])
        body, sub = hi - lo + 1, ib - ia + 1
        chunk = body - sub + sub * trips
        sub_ops = opcodes(lines[ia:ib + 1])
        line = (f"chunk-loop trip {body} static (of which substitution loop {sub}); a chunk "
                f"{chunk} = {body - sub} + {sub} x {trips}; whole kernel static {total}")
        per16 = chunk
        loop_ops = opcodes(lines[lo:hi + 1])
        opline = f"chunk loop [{fmt(loop_ops)}]; substitution loop [{fmt(sub_ops)}]"
    else:
        if loops:
            ia, ib = max(loops, key=lambda x: x[1] - x[0])
            sub = ib - ia + 1
            nested = [(a, b) for a, b in loops if (a, b) != (ia, ib)]
        else:
            sub, nested = 0, []
        chunk = total - sub + sub * trips
        per16 = chunk * 16 / tokens
        sub_ops = opcodes(lines[ia:ib + 1]) if loops else collections.Counter()
        line = (f"kernel {total} static (substitution loop {sub}{', other loops ' + str(nested) if nested else ''}); "
                f"a chunk {chunk} = {total - sub} + {sub} x {trips}")
        opline = f"kernel [{fmt(ops)}]; substitution loop [{fmt(sub_ops)}]"
    print(f"{tag:34s} {regs}; smem {k.metadata.shared} B; {line}; per 16 tokens {per16:.0f} "
          f"a warp, {per16 * warps:.0f} a program; {opline} ({time.time() - t0:.0f} s)",
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    print(f"triton {triton.__version__}; sm_90a; H {H} HV {HV} K {K} V {V}; proto: C 64, "
          f"bf16 q/k/v, fp32 g/beta, L2NORM, fp32 outputs; instructions = SASS a warp")
    jobs = []
    for warps in (4, 8):
        jobs.append((f"ours_c16_w{warps}", None, None, warps, None))
    for extras in (False, True):  # step1_halves_kernel: [64, 128] operands as two halves
        for solve in ("bd_horner", "bd_fact"):
            for prec in ("tf32x3", "3x"):
                for warps in (4, 8):
                    jobs.append((f"halves_{solve}_{prec}_w{warps}" + ("_extras" if extras else ""),
                                 solve, prec, warps, (extras, "halves")))
    for extras in (False, True):  # bd_horner with W^T = B^T X^T (TRANS)
        for prec in ("tf32x3", "3x"):
            for warps in (4, 8):
                jobs.append((f"bdT_horner_{prec}_w{warps}" + ("_extras" if extras else ""),
                             "bd_horner", prec, warps, (extras, True)))
    for extras in (False, True):
        for solve in ("fwd", "bd_horner", "bd_fact", "bd_rhs", "blk", "blk_rhs"):
            for prec in ("tf32x3", "3x"):
                for warps in (4, 8):
                    tag = f"{solve}_{prec}_w{warps}" + ("_extras" if extras else "")
                    jobs.append((tag, solve, prec, warps, extras))
    for tag, solve, prec, warps, extras in jobs:
        if args.only and not any(s in tag for s in args.only):
            continue
        t0 = time.time()
        try:
            if solve is None:
                k, plan = compile_ours(warps)
                report(tag, k, 15, 16, warps, t0)
            else:
                extras, trans = extras if isinstance(extras, tuple) else (extras, False)
                k = compile_proto(solve, prec, warps, extras, trans=trans)
                report(tag, k, 63 if solve == "fwd" else 15, 64, warps, t0)
        except Exception as e:  # noqa: BLE001
            print(f"{tag:34s} FAILED {type(e).__name__}: {str(e)[:400]}", flush=True)


if __name__ == "__main__":
    main()

"""fla-core 0.6.0's chunked gated delta rule forward kernels compiled offline for sm_90a.

Shapes as benchmarks/probe_gdn_chunked.py calls fla: B = 1 row of T = 2048 tokens passed
varlen (cu_seqlens int64), H = 16 q/k heads, HV = 32 value heads (GVA in-kernel, q/k not
expanded), K = V = 128, bf16 q/k/v/beta, fp32 log gates (chunk_local_cumsum's output),
fp32 initial and final state, state_v_first=True, chunk 64.

Each kernel's inner JITFunction (heuristics and fla's autotuner bypassed) is compiled for
every Hopper config of its autotune list, then Triton's ptxas -v and cuobjdump -sass.

Run:  PYTHONPATH=/tmp/fla_sass/site:/tmp/fla_sass/stubs \
      /work/main/.venv/bin/python /tmp/fla_sass/fla_sass.py
SASS files are left in /tmp/fla_sass/sass/.
"""
from __future__ import annotations

import collections
import os
import re
import sys
import warnings

os.environ["TRITON_INTERPRET"] = "0"
warnings.filterwarnings("ignore")
sys.path.insert(0, "/work/main/benchmarks")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ptxas_regs import assemble, loop_trip, _SASS_LINE  # noqa: E402  (ours, read-only)

import fla.ops.common.chunk_delta_h as cdh  # noqa: E402
import fla.ops.common.chunk_o as co  # noqa: E402
import fla.ops.gated_delta_rule.chunk_fwd as cf  # noqa: E402
import fla.ops.gated_delta_rule.wy_fast as wy  # noqa: E402

# on an H100 IS_TF32_SUPPORTED is true, so the fused solve's block merge uses tf32
cf.SOLVE_TRIL_DOT_PRECISION = tl.constexpr("tf32")

OUT = "/tmp/fla_sass/sass"
os.makedirs(OUT, exist_ok=True)
T, H, HV, K, V, BT = 2048, 16, 32, 128, 128, 64
NT = T // BT


def inner(f):
    while type(f).__name__ != "JITFunction":
        f = f.fn
    return f


def compile_sass(fn, sig, consts, warps, stages, tag):
    """ptxas report and SASS of ``fn``; ``sig``: runtime args' types; ``consts``: the
    constexprs (None arguments included, as the launcher specialises them)."""
    names = fn.arg_names
    ptrs = [n for n in names if n in sig and sig[n].startswith("*")]
    src = ASTSource(fn=fn,
                    signature={n: "constexpr" if n in consts else sig[n] for n in names},
                    constexprs=dict(consts),
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in ptrs})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=warps, num_stages=stages))
    report, sass = assemble(k.asm["ptx"], disassemble=True)
    with open(os.path.join(OUT, tag + ".sass"), "w") as f:
        f.write(sass)
    return report, sass, k.metadata.shared


OPS = {"HMMA": r"^HMMA", "HGMMA": r"^HGMMA", "LDG": r"^LDG(?!STS)", "STG": r"^STG",
       "LDGSTS": r"^LDGSTS", "LDS": r"^LDS(?!M)", "LDSM": r"^LDSM", "STS": r"^STS",
       "BAR": r"^BAR", "LDL": r"^LDL", "STL": r"^STL", "MUFU": r"^MUFU"}


def opcodes(lines):
    c = collections.Counter()
    for text in lines:
        op = re.sub(r"^@!?U?P\w+\s+", "", text.strip()).split(" ")[0]
        for k, pat in OPS.items():
            if re.match(pat, op):
                c[k] += 1
    return c


def code_lines(sass):
    return [m.group(2) for m in map(_SASS_LINE.match, sass.splitlines()) if m]


def trip_lines(sass):
    """The instructions of the longest loop (as loop_trip finds it)."""
    code = [(int(m.group(1), 16), m.group(2)) for m in map(_SASS_LINE.match, sass.splitlines())
            if m]
    where = {a: i for i, (a, _) in enumerate(code)}
    loops = []
    for i, (a, text) in enumerate(code):
        t = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if t and int(t.group(1), 16) < a and int(t.group(1), 16) in where:
            loops.append((where[int(t.group(1), 16)], i))
    if not loops:
        return [], []
    lo, hi = max(loops, key=lambda x: x[1] - x[0])
    return [t for _, t in code[lo:hi + 1]], loops


def fmt(c):
    return " ".join(f"{k} {c[k]}" for k in OPS if c[k])


def h_kernel():
    fn = inner(cdh.chunk_gated_delta_rule_fwd_kernel_h_blockdim64)
    sig = dict(k="*bf16", v="*bf16", w="*bf16", v_new="*bf16", g="*fp32", h="*bf16",
               h0="*fp32", ht="*fp32", cu_seqlens="*i64", chunk_offsets="*i64", T="i32")
    print("== chunk_gated_delta_rule_fwd_kernel_h_blockdim64 (the chain); grid "
          "cdiv(V, BV) * N * HV programs, NT = 32 trips of 64 tokens each")
    for warps in (2, 4):                   # GATED_DELTA_RULE_FWD_H_NUM_WARPS (Hopper)
        for stages in (2, 3, 4):           # check_shared_mem('ampere') on an H100
            for bv in (32, 64):            # check_shared_mem('ada') on an H100
                consts = dict(gk=None, H=H, HV=HV, K=K, V=V, BT=BT, BV=bv, USE_G=True,
                              USE_GK=False, USE_INITIAL_STATE=True, STORE_FINAL_STATE=True,
                              SAVE_NEW_VALUE=True, STATE_V_FIRST=True, IS_VARLEN=True)
                tag = f"h_w{warps}_s{stages}_bv{bv}"
                try:
                    report, sass, smem = compile_sass(fn, sig, consts, warps, stages, tag)
                except Exception as e:  # noqa: BLE001
                    print(f"  {tag}: FAILED {type(e).__name__}: {str(e)[:300]}")
                    continue
                body, nested = loop_trip(sass)
                lines, _ = trip_lines(sass)
                c = opcodes(lines)
                print(f"  {tag}: {report}; smem {smem} B; programs {(V // bv) * HV}; "
                      f"trip {body} instr/warp (nested {nested}) = {body / 4:.0f} per 16 tok, "
                      f"{body * warps} a program; total {len(code_lines(sass))}; [{fmt(c)}]")


def parallel(name, fn, sig, consts, configs, programs, note=""):
    print(f"== {name}: {programs} programs {note}")
    for warps, stages, extra in configs:
        tag = f"{name}_w{warps}_s{stages}" + "".join(f"_{k}{v}" for k, v in extra.items())
        try:
            report, sass, smem = compile_sass(fn, sig, {**consts, **extra}, warps, stages, tag)
        except Exception as e:  # noqa: BLE001
            print(f"  {tag}: FAILED {type(e).__name__}: {str(e)[:300]}")
            continue
        lines = code_lines(sass)
        _, loops = trip_lines(sass)
        loop_sz = [(a, b - a + 1) for a, b in sorted(loops)]
        print(f"  {tag}: {report}; smem {smem} B; total {len(lines)} instr/warp static "
              f"(loops (first index, body) {loop_sz}); [{fmt(opcodes(lines))}]")


def main():
    print(f"triton {triton.__version__}")
    h_kernel()
    parallel("kkt_solve", inner(cf.chunk_gated_delta_rule_fwd_kkt_solve_kernel),
             dict(k="*bf16", g="*fp32", beta="*bf16", A="*bf16", cu_seqlens="*i64",
                  chunk_indices="*i64", T="i32"),
             dict(H=H, HV=HV, K=K, BT=BT, BC=16, USE_G=True, IS_VARLEN=True),
             [(w, 3, dict(BK=bk)) for bk in (32, 64) for w in (1, 2, 4)],
             NT * HV, "(grid (NT, B*HV)); default num_stages 3")
    parallel("recompute_w_u", inner(wy.recompute_w_u_fwd_kernel),
             dict(k="*bf16", v="*bf16", beta="*bf16", w="*bf16", u="*bf16", A="*bf16",
                  g="*fp32", cu_seqlens="*i64", chunk_indices="*i64", T="i32"),
             dict(H=H, HV=HV, K=K, V=V, BT=BT, BK=64, BV=64, USE_G=True, IS_VARLEN=True),
             [(w, s, {}) for w in (2, 4, 8) for s in (2, 3, 4)], NT * HV, "(grid (NT, B*HV))")
    parallel("chunk_fwd_o", inner(co.chunk_fwd_kernel_o),
             dict(q="*bf16", k="*bf16", v="*bf16", h="*bf16", g="*fp32", o="*bf16",
                  cu_seqlens="*i64", chunk_indices="*i64", scale="fp32", T="i32"),
             dict(g_gamma=None, H=H, HV=HV, K=K, V=V, BT=BT, USE_G=True, USE_G_GAMMA=False,
                  STATE_V_FIRST=True, IS_VARLEN=True),
             [(8, 3, dict(BK=128, BV=128)), (4, 3, dict(BK=64, BV=64)),
              (2, 3, dict(BK=32, BV=32))],
             "cdiv(V,BV)*NT*HV =", "1024 (BV 128) / 2048 (BV 64) / 4096 (BV 32)")


if __name__ == "__main__":
    main()

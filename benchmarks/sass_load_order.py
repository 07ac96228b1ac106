"""Where the recurrent kernels' loads sit in the machine code, with no GPU: how many memory
round trips each global load waits behind before it can issue.

A warp issues in order, so a load waits for every earlier instruction's operands: once an
instruction uses a value a load returns, every load after it in the SASS waits for that
round trip, whether or not it needs the value. The script compiles a launch for sm_90
(Triton's ptxas, as ``ptxas_regs.py`` does), disassembles it (Triton's ``cuobjdump``) and
walks the instructions up to the first store, giving each register the number of round
trips behind it (a load's result: one more than the load's issue). The model knows
nothing of latencies or of the scheduler; it tells which loads ptxas has put behind
another load's round trip.

Launches: the gated delta rule as ``bench_recurrent.py`` makes it (``ptxas_regs.gdn_plan``:
fused gates, l2norm, int64 ids, ``[V, K]`` fp32 state) at ``--rows`` rows with a window of
``--window`` write blocks, under the kernel's register cap or ``--cap``; the conv update
(``--conv SD`` or ``DS``: bf16, K = 4, a window of 6 rows, D = 8192, SiLU) at ``--rows``
rows of ``--tokens`` tokens each.

Usage::

    python benchmarks/sass_load_order.py [--rows 64] [--window 4] [--cap 80]
    python benchmarks/sass_load_order.py --conv SD [--rows 64] [--tokens 1] [--width 6]
"""

from __future__ import annotations

import argparse
import re
from typing import Dict, List, Optional, Tuple

from ptxas_regs import assemble, gdn_plan, ptx  # (sets TRITON_INTERPRET=0 first)

import mamba_align.kernels as K  # noqa: E402
from mamba_align.kernels.codegen import compile_ptx  # noqa: E402

NO_DEST = ("ST", "RED.", "REDG", "BRA", "EXIT", "BAR", "MEMBAR", "ERRBAR", "CGAERRBAR",
           "CCTL", "BSSY", "BSYNC", "WARPSYNC", "NOP", "YIELD", "CALL", "RET")
CONTROL = ("BRA", "BRX", "JMP", "JMX", "EXIT", "RET", "CALL")  # listed with the loads
TWO_DESTS = ("ISETP", "UISETP", "FSETP", "DSETP", "HSETP2", "PLOP3", "UPLOP3")


def _registers(operand: str, width: int = 1) -> List[str]:
    """The registers an operand names: ``R4.64`` two, a predicate one, ``RZ`` / ``PT``
    (constants), immediates and constant-bank operands none; a memory operand
    ``desc[UR4][R2.64+0x8]`` the registers inside it."""
    out = []
    for m in re.finditer(r"!?\b(U?R)(\d+)(?:\.(64|128))?|!?\b(U?P)(\d)\b", operand):
        if m.group(1):
            n = {"64": 2, "128": 4}.get(m.group(3), width)
            out += [f"{m.group(1)}{int(m.group(2)) + i}" for i in range(n)]
        else:
            out.append(f"{m.group(4)}{m.group(5)}")
    return out


def load_depths(code: str) -> List[Tuple[int, int, str]]:
    """``(instruction index, round trips waited behind, instruction)`` for every global
    load and every control-flow instruction (``CONTROL``: branches, jumps, a predicated
    exit) before the first global store, in the order of the code (branches are not
    followed: this is the fall-through path)."""
    ready: Dict[str, int] = {}
    issue, loads = 0, []
    for line in code.splitlines():
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if not m:
            continue
        index, text = int(m.group(1), 16) // 16, m.group(2)
        pred = re.match(r"@(!?U?P\w+)\s+", text)
        body = text[pred.end():] if pred else text
        op, _, rest = body.partition(" ")
        operands = [o.strip() for o in rest.split(",")] if rest.strip() else []
        n_dest = (0 if op.startswith(NO_DEST) else 2 if op.startswith(TWO_DESTS)
                  else 1 if operands else 0)
        wide = 4 if ".128" in op else 2 if (".64" in op or ".WIDE" in op) else 1
        dests = [r for o in operands[:n_dest] for r in _registers(o, wide)]
        sources = [r for i, o in enumerate(operands[n_dest:], n_dest)
                   for r in _registers(o, 2 if ".WIDE" in op and i == len(operands) - 1 else 1)]
        sources += _registers(pred.group(1)) if pred else []
        issue = max([issue] + [ready.get(r, 0) for r in sources])
        if op.startswith(("LDG",) + CONTROL):
            loads.append((index, issue, text))
        for r in dests:
            ready[r] = issue + 1 if op.startswith("LDG") else issue
        if op.startswith("STG"):
            break
    return loads


def conv_ptx(layout: str, rows: int, tokens: int, width: int = 6) -> str:
    spec = K.ArraySpec.row_major
    ids, bf = spec((rows,), "int64"), "bfloat16"
    block = (width, 8192) if layout == "SD" else (8192, width)
    plan = K.plan_conv1d_update(spec((2, 9) + block, bf), spec((2,), "int32"),
                                spec((rows * tokens, 8192), bf), spec((8192, 4), bf),
                                spec((8192,), bf), spec((rows + 1,), "int64"), ids, ids, ids,
                                ids, layer=1, layout=layout, activation="silu")
    names = [n for n in plan.kernel.arg_names if n not in plan.constexprs]
    int_ids = ("cu_seqlens", "read_block", "read_offset", "write_block", "is_spec")

    def ty(n: str) -> str:
        stem = n[:-4].replace("_in", "")
        return ("i32" if not n.endswith("_ptr") else "*i32" if stem == "errors"
                else "*i64" if stem in int_ids else "*bf16")
    return compile_ptx(plan, {n: ty(n) for n in names}, [n for n in names if n.endswith("_ptr")])


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--window", type=int, default=4, help="gated delta rule: 1 + S")
    ap.add_argument("--cap", type=int, default=None,
                    help="gated delta rule: register cap (default: the kernel's)")
    ap.add_argument("--conv", choices=("SD", "DS"), help="the conv update instead")
    ap.add_argument("--tokens", type=int, default=1, help="conv: tokens per row")
    ap.add_argument("--width", type=int, default=6, help="conv: the window's W")
    args = ap.parse_args(argv)
    if args.conv:
        code = conv_ptx(args.conv, args.rows, args.tokens, args.width)
    else:
        cap = K.gdn.REGISTER_CAP if args.cap is None else args.cap
        code = ptx(gdn_plan(args.rows, args.window), cap)
    report, sass = assemble(code, disassemble=True)
    print(report)
    for index, depth, text in load_depths(sass):
        print(f"{index:5d}  behind {depth} round trip(s)  {text}")


if __name__ == "__main__":
    main()

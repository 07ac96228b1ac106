"""Registers and spills of the gated delta rule kernel as ptxas reports them, with no GPU.

Compiles the benchmark's launch (``bench_recurrent.py``'s decode shapes, 64 rows; in-kernel
gates, q/k l2norm, ``[V, K]`` fp32 state, int64 ids as ``recurrent_cases.Case`` makes them)
for sm_90 on the CPU, pointers marked 16-byte aligned and integers unmarked (what both
launchers give these kernels, kernels/jit.py). Batch-size-1 launches differ: Triton makes
an integer argument equal to 1 a constant. Then it runs the ptxas that Triton
ships (``-arch=sm_90a -v``), with no cap and with each register cap (Triton's ``maxnreg``
option, which the PTX carries as ``.maxnreg``; ptxas's ``-maxrregcount`` alone changed
nothing). The windows: 1 + S = 4 write blocks (the spec-capable
step the benchmark launches) and 1.

``--chunked``: the chunked kernel's step 2 instead (window 1; the binary does not depend
on the row count), per warp count: registers, spills and the SASS instructions of one trip
of its chunk loop (the longest backward branch's body, less the loops nested in it: a spec
row's candidates). A static count: it takes in code that forward branches skip; with 8
warps Nsight Compute's count of instructions issued a warp per chunk matched it within
1.1 % (benchmarks/README.md, "The chunked gated delta rule in two launches"). ``--caps``
does not apply to it.

Usage::

    python benchmarks/ptxas_regs.py [--caps 96 80 72 64]
    python benchmarks/ptxas_regs.py --chunked [--warps 8 4]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from typing import Tuple

os.environ["TRITON_INTERPRET"] = "0"  # compile, do not interpret

import triton  # noqa: E402

import mamba_align.kernels as K  # noqa: E402
from mamba_align.kernels.codegen import compile_ptx  # noqa: E402

# as recurrent_cases.Case makes them: int64 ids (torch.arange, randperm, full), int32 flag
POINTERS = {"pool": "*fp32", "A_log": "*fp32", "dt_bias": "*fp32", "errors": "*i32",
            "cu_seqlens": "*i64", "read_block": "*i64", "write_blocks": "*i64",
            "is_spec": "*i64", "chunk_g": "*fp32", "chunk_w": "*fp32",
            "chunk_u": "*fp32", "chunk_q": "*fp32", "chunk_k": "*fp32",
            "chunk_a": "*fp32"}  # the rest: bf16 q, k, v, a, b, o


def gdn_plan(rows: int, win: int, algorithm: str = "recurrent") -> K.LaunchPlan:
    spec = K.ArraySpec.row_major
    ids, bf = spec((rows,), "int64"), "bfloat16"
    return K.plan_gated_delta_rule_fused_gates(
        spec((2, 9, 32, 128, 128), "float32"), spec((2,), "int32"), spec((rows, 16, 128), bf),
        spec((rows, 16, 128), bf), spec((rows, 32, 128), bf), spec((rows, 32), bf),
        spec((rows, 32), bf), spec((32,), "float32"), spec((32,), "float32"),
        spec((rows + 1,), "int64"), ids, spec((rows, win), "int64"), ids, layer=1, scale=0.0,
        use_qk_l2norm=True, layout="VK", algorithm=algorithm)


def ptx(plan: K.LaunchPlan, cap: int = 0) -> str:
    """The kernel's PTX; ``cap``: Triton's ``maxnreg`` (a ``.maxnreg`` directive in it)."""
    names = [n for n in plan.kernel.arg_names if n not in plan.constexprs]
    sig = {n: POINTERS.get(n[:-4].replace("_in", ""), "*bf16") if n.endswith("_ptr")
           else "fp32" if n == "scale" else "i32" for n in names}
    return compile_ptx(plan, sig, [n for n in names if n.endswith("_ptr")], maxnreg=cap or 0)


BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def assemble(code: str, disassemble: bool = False) -> Tuple[str, str]:
    """Triton's ptxas (``-arch=sm_90a -v``) on the PTX ``code``: its register and spill
    report, and with ``disassemble`` the binary's SASS (Triton's ``cuobjdump``)."""
    with tempfile.TemporaryDirectory() as d:
        path, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(path, "w") as f:
            f.write(code)
        r = subprocess.run([os.path.join(BIN, "ptxas"), "-arch=sm_90a", "-v", path, "-o", cubin],
                           capture_output=True, text=True, check=True)
        regs = re.search(r"Used (\d+) registers", r.stderr).group(1)
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
        report = f"{regs} registers, spill stores {spill.group(1)} B, loads {spill.group(2)} B"
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", cubin],
                              capture_output=True, text=True, check=True).stdout \
            if disassemble else ""
    return report, sass


def ptxas(code: str) -> str:
    return assemble(code)[0]


_SASS_LINE = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*)")


def loop_trip(sass: str) -> Tuple[int, int]:
    """The instructions of the longest loop's body in ``sass`` (from a backward branch's
    target to the branch) and how many of them lie in loops nested in it."""
    code = [(int(m.group(1), 16), m.group(2)) for m in map(_SASS_LINE.match, sass.splitlines())
            if m]
    where = {addr: i for i, (addr, _) in enumerate(code)}
    loops = []
    for i, (addr, text) in enumerate(code):
        target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr and int(target.group(1), 16) in where:
            loops.append((where[int(target.group(1), 16)], i))
    if not loops:
        raise ValueError("no loop (backward branch) in the SASS")
    first, last = max(loops, key=lambda lo: lo[1] - lo[0])
    # (a second back edge to the loop's own head is the same loop, not a nested one)
    inner = [(a, b) for a, b in loops if first < a and b <= last]
    nested = sum(b - a + 1 for a, b in inner
                 if not any(c <= a and b <= d and (c, d) != (a, b) for c, d in inner))
    return last - first + 1, nested


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--caps", type=int, nargs="*", default=[96, 80, 72, 64])
    ap.add_argument("--chunked", action="store_true", help="the chunked kernel's step 2")
    ap.add_argument("--warps", type=int, nargs="*", default=[8, 4])
    args = ap.parse_args()
    version = subprocess.run([os.path.join(BIN, "ptxas"), "--version"], capture_output=True,
                             text=True).stdout
    print(f"triton {triton.__version__}; {version.strip().splitlines()[-2]}")
    if args.chunked:
        from timing import constants  # (sets a module constant, plan caches cleared)
        for warps in args.warps:
            with constants({"kernels.gdn_chunked.NUM_WARPS": warps,
                            "kernels.gdn_chunked.FEW_PROGRAMS_WARPS": warps}):
                report, sass = assemble(ptx(gdn_plan(8, 1, "chunked")), disassemble=True)
            body, nested = loop_trip(sass)
            print(f"step 2, {warps} warps: {report}; a chunk: {body - nested} instructions a "
                  f"warp ({body} with the {nested} of a spec row's candidate loop)")
        return
    for win in (4, 1):
        for cap in [0] + args.caps:
            print(f"window {win}, cap {cap or 'none':>4}: {ptxas(ptx(gdn_plan(64, win), cap))}")


if __name__ == "__main__":
    main()

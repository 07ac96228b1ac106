"""Our step 2 (gated_delta_rule_chunked_kernel) as benchmarks/ptxas_regs.py --chunked
compiles it, with the opcode counts of one chunk-loop trip (same counter as fla_sass.py).
Run: cd /work/main && .venv/bin/python /tmp/fla_sass/ours_sass.py"""
import os
import sys
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, "/work/main/benchmarks")
sys.path.insert(0, "/tmp/fla_sass")
from ptxas_regs import assemble, ptx, gdn_plan, loop_trip  # noqa: E402
from timing import constants  # noqa: E402
from fla_sass_common import opcodes, trip_lines, fmt  # noqa: E402

for warps in (8, 4):
    with constants({"kernels.gdn_chunked.NUM_WARPS": warps,
                    "kernels.gdn_chunked.FEW_PROGRAMS_WARPS": warps}):
        report, sass = assemble(ptx(gdn_plan(8, 1, "chunked")), disassemble=True)
    open(f"/tmp/fla_sass/sass/ours_step2_w{warps}.sass", "w").write(sass)
    body, nested = loop_trip(sass)
    lines, _ = trip_lines(sass)
    print(f"ours step 2, {warps} warps: {report}; trip {body} (nested {nested}) instr/warp "
          f"per 16 tokens, {body * warps} a program; [{fmt(opcodes(lines))}]")

"""Probe (GPU, torch only): does a register cap speed up the gated delta rule?

ptxas gives the kernel about 96 registers per thread at the benchmark's 64-row launch,
which lets 21 of its one-warp programs onto an SM. Compiled on the CPU with a cap
(Triton's ``maxnreg``), it needs no spill down to 72 registers (28 programs) (benchmarks/README.md, "Registers are ptxas's choice"). This
probe times the benchmark's decode and spec cases (``recurrent_cases.Case``, CUDA-graph
replay) with no cap and with each cap in ``--caps``. Each variant runs in its own process,
and each checks its output against the float64 reference before it is timed. Each process
also times fla alone on contiguous states as a same-run yardstick.

jax-triton 0.3.1 cannot pass a cap, and torch and JAX must compile one binary
(kernels/jit.py). So this probe patches the torch launch only. It decides whether the JAX
launcher is worth that work.

Usage (GPU machine, after ``make gpu-setup``)::

    python benchmarks/probe_gdn_maxnreg.py [--caps 96 80 72 64] [--out DIR]

Prints one line per case and writes ``probe_gdn_maxnreg_h200.json`` under ``--out``. At
B = 1 Triton makes the integer arguments equal to 1 constants, so that binary is not the
64-row one (its registers are printed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent


def variant(cap: Optional[int]) -> List[Dict[str, Any]]:
    """Time decode and spec at B = 1, 64, 256 with the GDN kernels capped at ``cap``."""
    sys.path.insert(0, str(HERE))
    from timing import bench_ms  # noqa: E402  (makes mamba_align importable)
    from recurrent_cases import Case, check, load_fla, shapes, state_bytes  # noqa: E402
    import torch

    import mamba_align.kernels.gdn as gdn

    compiled: Dict[str, Any] = {}
    for kernel in (gdn.gated_delta_rule_kernel, gdn.gated_delta_rule_fused_gates_kernel):
        def run(*args, _run=kernel.run, **kwargs):
            if cap is not None:
                kwargs["maxnreg"] = cap
            out = _run(*args, **kwargs)
            # n_spills is the local memory per thread in 4-byte words (Triton's driver)
            compiled["regs"], compiled["local_bytes"] = out.n_regs, 4 * out.n_spills
            if cap is not None and out.n_regs > cap:
                raise SystemExit(f"the cap {cap} did not apply: {out.n_regs} registers")
            return out
        kernel.run = run

    s, dev = shapes(False), torch.device("cuda")
    fla = load_fla()
    if fla is None:
        raise SystemExit("fla-core is needed for the yardstick (the .whl/ wheels)")
    fused = fla[0]
    gen = torch.Generator().manual_seed(0)
    rows = []
    for T, spec, label in ((1, False, "decode"), (1 + s["S"], True, "spec")):
        for B in (1, 64, 256):
            c = Case(s, B, T, spec, dev, gen)
            o = c.gdn()
            want_o, want_h = c.gdn_ref(0)
            check(f"{label} B={B} cap={cap}", o[:T], want_o, 2e-2)
            check(f"{label} B={B} cap={cap} state", c.pool[1, c.wbs[0, :want_h.shape[0]]],
                  want_h, 2e-2)
            c.assert_clean(f"{label} B={B}")
            ms = bench_ms(c.timed(c.gdn), True, graph=True)
            h0s = [c.pool[1].index_select(0, rb).contiguous() for rb, _, _ in c.sets]
            fla_ms = bench_ms(c.timed(lambda: fused(
                q=c.q[None], k=c.k[None], v=c.v[None], g=c.a[None], beta=c.b[None],
                initial_state=h0s[c.i % c.nsets], output_final_state=True,
                use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=c.A_log,
                dt_bias=c.dt_bias, use_beta_sigmoid_in_kernel=True, state_v_first=True,
                cu_seqlens=c.cu)), True, graph=True)
            nbytes = state_bytes(s, B, T if spec else 1)
            row = {"cap": cap, "case": label, "batch": B, "ms": ms,
                   "tbps": nbytes / (ms * 1e-3) / 1e12, "fla_ms": fla_ms, **compiled}
            print(json.dumps(row), flush=True)
            rows.append(row)
            del c, h0s
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--caps", type=int, nargs="*", default=[96, 80, 72, 64])
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child: 0 = no cap
    args = ap.parse_args()
    if args.one is not None:
        variant(args.one or None)
        return
    rows = []
    for cap in [0] + args.caps:
        r = subprocess.run([sys.executable, __file__, "--one", str(cap)], capture_output=True,
                           text=True)
        sys.stderr.write(r.stderr[-2000:] if r.returncode else "")
        got = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
        for x in got:
            print(f"cap={x['cap']} {x['case']:6s} B={x['batch']:3d} {x['ms'] * 1e3:7.1f} us "
                  f"{x['tbps']:5.2f} TB/s  fla {x['fla_ms'] * 1e3:7.1f} us  regs {x['regs']} "
                  f"local {x['local_bytes']} B")
        rows += got
        if r.returncode:  # kept beside whatever rows the variant printed before it failed
            rows.append({"cap": cap or None, "error": r.stderr[-500:]})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_gdn_maxnreg_h200.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

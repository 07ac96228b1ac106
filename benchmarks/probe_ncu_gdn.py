"""Launches for Nsight Compute: our gated delta rule and conv1d update against fla's
kernels on the decode rows of ``bench_recurrent.py`` (one-off probe: where the gap to fla
alone comes from).

Warm-up launches (compiles, fla's autotuner) run first; only the launches between
``cudaProfilerStart`` and ``cudaProfilerStop`` are profiled, one per kernel and batch::

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section Occupancy --section WarpStateStats --section LaunchStats \\
        --section MemoryWorkloadAnalysis python3 benchmarks/probe_ncu_gdn.py 1 256
"""

from __future__ import annotations

import sys

import torch

from bench_recurrent import Case, load_fla, shapes


def main(batches) -> None:
    fused, _, conv_update = load_fla()
    s = shapes(False)
    gen = torch.Generator().manual_seed(0)
    launches = []
    for B in batches:
        c = Case(s, B, 1, False, torch.device("cuda"), gen)
        h0 = c.pool[1].index_select(0, c.rb).contiguous()
        cache = torch.zeros(B, s["D"], s["KC"], device="cuda", dtype=torch.bfloat16)
        launches += [
            (f"ours gdn B={B}", c.gdn),
            (f"fla gdn B={B}", lambda c=c, h0=h0: fused(
                q=c.q[None], k=c.k[None], v=c.v[None], g=c.a[None], beta=c.b[None],
                initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                use_gate_in_kernel=True, A_log=c.A_log, dt_bias=c.dt_bias,
                use_beta_sigmoid_in_kernel=True, state_v_first=True, cu_seqlens=c.cu)),
            (f"ours conv B={B}", c.conv),
            (f"fla conv B={B}", lambda c=c, cache=cache: conv_update(
                x=c.x, cache=cache, weight=c.w, bias=None, activation="silu")),
        ]
    for _ in range(3):  # compile, autotune, settle
        for _, fn in launches:
            fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, fn in launches:
        fn()
        torch.cuda.synchronize()
        print("profiled:", name, flush=True)
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main([int(b) for b in sys.argv[1:]] or [1, 256])

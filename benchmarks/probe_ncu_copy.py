"""Launches for Nsight Compute: the library's temporal copy and the one-program-per-row grid
of ``probe_copy_limit.py`` on the same 16 rows of 36 x 2 MiB (one-off probe).

Run under ncu, skipping the two warm-up launches::

    ncu --clock-control none -k regex:"copy_temporal_kernel|one_row_copy" --launch-skip 2 \\
        --launch-count 2 --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats python3 benchmarks/probe_ncu_copy.py
"""

from __future__ import annotations

import torch

import mamba_align.backends.torch  # noqa: F401  registers torch.ops.mamba_align
from probe_copy_limit import one_row_copy


def main() -> None:
    L, numel, B, tile = 36, 32 * 128 * 128, 16, 1024
    nb = 2 * B + 1
    pool = torch.zeros((L, nb, 32, 128, 128), dtype=torch.float32, device="cuda")
    bits = pool.view(torch.int32)
    perm = torch.randperm(nb - 1, device="cuda") + 1
    src, dst = perm[:B].clone(), perm[B:2 * B].clone()
    for _ in range(2):  # warm-up (compiles), then the profiled pair
        torch.ops.mamba_align.copy_temporal_(pool, src, dst)
        one_row_copy[(numel // tile, L, B)](src, dst, bits.stride(0), bits.stride(1), bits,
                                            TILE=tile, num_warps=8)
        torch.cuda.synchronize()
    print("launched: library, one-row (x2)")


if __name__ == "__main__":
    main()

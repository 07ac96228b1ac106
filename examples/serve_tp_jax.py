"""The hybrid model served tensor-parallel from JAX: the twin of ``serve_tp_torch.py`` on
a device mesh. Every weight and state pool holds the ranks' shards
(``hybrid_model.shard``) stacked on a leading axis, sharded over the mesh
(``NamedSharding``); the whole step is one ``shard_map`` around the library's kernels,
jitted once for the mesh (``hybrid_jax.serving_step(mesh=...)``): each device runs the
kernels on its shard, sums the partial outputs of ``w_o`` and ``w_down`` with
``lax.psum``, and repeats the replicated bookkeeping.

    python examples/serve_tp_jax.py [--tp 2] [--out summary.json]

On the CPU it asks XLA for ``--tp`` host devices (the tiny model, Triton's interpreter);
on GPUs it takes the first ``--tp`` of them (the GPU model). It first runs every request
alone on the whole model (tp = 1), then serves the workload tensor-parallel with the
prefix cache on and off, checks that the tensor-parallel run samples the tokens of tp = 1
at every position and that cached equals uncached bit for bit, and reports how far its
logits are from tp = 1 (the psum adds the partial sums in another order than one device's
kernel). Exit status non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--logits", type=Path, default=None,
                    help="write the tensor-parallel run's logits here (.npz)")
    ap.add_argument("--conversations", type=int, default=1)
    ap.add_argument("--new-tokens", type=int, default=6)
    args = ap.parse_args()
    # before JAX starts: host devices for the CPU mesh, no preallocation on a GPU
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={args.tp}")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hybrid_jax import load_weights, new_pools, serving_step, single_row
    from hybrid_model import GPU, TINY, init_weights, shard
    from hybrid_serving import multi_turn_workload, serve, tp_summary

    from mamba_align.backends import jax as mj
    warnings.filterwarnings("ignore", message=".*donat")
    gpu = jax.default_backend() == "gpu"
    devices = jax.devices()[:args.tp]
    if len(devices) < args.tp:
        raise SystemExit(f"{args.tp} devices needed, {len(devices)} present")
    B, S, NB = 4, 2, 48
    cfg = GPU if gpu else TINY
    weights = init_weights(cfg, seed=0)
    workload, outputs, alone = multi_turn_workload(
        cfg, 0, args.conversations, B, args.new_tokens,
        single_row(cfg, load_weights(cfg, weights), S))

    mesh = jax.sharding.Mesh(np.array(devices), ("tp",))
    over = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("tp"))
    parts = [shard(cfg, weights, args.tp, r) for r in range(args.tp)]
    part_cfg = parts[0][0]
    cache = part_cfg.cache_config(B, S)  # a device's share of every state
    w = {n: jax.device_put(np.stack([p[1][n] for p in parts]), over) for n in weights}
    runs = {}
    for caching in (True, False):
        pools = {n: jax.device_put(np.stack([np.asarray(p)] * args.tp), over)
                 for n, p in new_pools(cache, NB).items()}
        step = serving_step(part_cfg, w, cache, pools, 4, mesh=mesh)
        runs[caching] = serve(part_cfg, workload, outputs, step, block_size=B, num_spec=S,
                              num_blocks=NB, caching=caching, pad=True)
        # serve reads replicated outputs from one device only; wait for every shard, or the
        # other device may still run a host callback (the interpreter) when Python exits,
        # which aborts the process ("terminate called without an active exception")
        jax.block_until_ready(step.carry)
        if mj.errors(step.carry["state"]):
            raise SystemExit(f"faults: {mj.errors(step.carry['state'])}")
    result, keys, mine = tp_summary(runs[True], runs[False], alone)
    summary = {"tp": args.tp, "devices": [str(d) for d in devices],
               "model": "GPU" if gpu else "TINY", **result}
    print(json.dumps(summary, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    if args.logits is not None:
        np.savez(args.logits, keys=np.array(keys), logits=mine)
    if not (summary["cached_equals_uncached"] and summary["hit_tokens"] > 0):
        sys.exit(1)


if __name__ == "__main__":
    main()

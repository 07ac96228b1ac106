"""The hybrid model served tensor-parallel from torch: each rank holds its heads' share of
the weights and of the state pools (``hybrid_model.shard``), runs the library's kernels on
them unchanged, and sums the partial outputs of ``w_o`` and ``w_down`` with one
all-reduce each per layer; the scheduler and the runner's bookkeeping are replicated
(every rank computes the same batches and block ids, nothing of them is communicated).

Launch one process per rank::

    torchrun --nproc-per-node 2 examples/serve_tp_torch.py [--out summary.json]

gloo on the CPU (Triton's interpreter; the tiny model), NCCL on GPUs (one per rank; the
GPU model). Each rank first runs every request alone on the whole model (tp = 1), then
serves the workload tensor-parallel with the prefix cache on and off. It checks that the
tensor-parallel run samples the tokens of the tp = 1 run at every position (the argmax
check of ``hybrid_serving.serve``), that cached equals uncached bit for bit within it,
and that every rank computed the same logits; it reports how far the logits are from
tp = 1 (the all-reduce adds the ranks' partial sums in another order than one rank's
kernel does). Rank 0 prints the summary (and writes it to ``--out``); the exit status is
non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hybrid_model import GPU, TINY, init_weights, shard  # noqa: E402
from hybrid_serving import multi_turn_workload, serve, tp_summary  # noqa: E402

warnings.filterwarnings("ignore", message=".*called outside jax.jit")
B, S = 4, 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="rank 0 writes its summary here")
    ap.add_argument("--logits", type=Path, default=None,
                    help="write the tensor-parallel run's logits here (.npz)")
    ap.add_argument("--conversations", type=int, default=1)
    ap.add_argument("--new-tokens", type=int, default=6)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, tp = dist.get_rank(), dist.get_world_size()
    dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(dev)
    from hybrid_torch import TorchModel, new_pools, serving_step, single_row

    from mamba_align.backends.torch import StateRunner
    cfg = GPU if cuda else TINY
    weights = init_weights(cfg, seed=0)
    whole = TorchModel(cfg, weights, dev)
    workload, outputs, alone = multi_turn_workload(cfg, 0, args.conversations, B,
                                                   args.new_tokens, single_row(whole, S))

    def all_reduce(t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t)  # the sum of the ranks' partial outputs, in place
        return t
    part_cfg, part_w = shard(cfg, weights, tp, rank)
    part = TorchModel(part_cfg, part_w, dev, reduce=all_reduce)
    cache = part_cfg.cache_config(B, S)  # this rank's share of every state
    runs = {}
    for caching in (True, False):
        runner = StateRunner(cache, 4, dev)
        step = serving_step(part, runner, new_pools(cache, 48, dev))
        runs[caching] = serve(part_cfg, workload, outputs, step, block_size=B, num_spec=S,
                              num_blocks=48, caching=caching)
        runner.raise_errors()
    result, keys, mine = tp_summary(runs[True], runs[False], alone)
    gathered = [torch.zeros_like(torch.from_numpy(mine)) for _ in range(tp)]
    dist.all_gather(gathered, torch.from_numpy(mine))  # gloo: host tensors
    ranks_agree = all(torch.equal(g, gathered[0]) for g in gathered)
    # (a token other than tp = 1's: serve has raised)
    summary = {"tp": tp, "device": str(dev), "model": "GPU" if cuda else "TINY",
               "ranks_agree": ranks_agree, **result}
    if rank == 0:
        print(json.dumps(summary, indent=1))
        if args.out is not None:
            args.out.write_text(json.dumps(summary, indent=1) + "\n")
        if args.logits is not None:
            np.savez(args.logits, keys=np.array(keys), logits=mine)
    dist.destroy_process_group()
    if not (summary["cached_equals_uncached"] and ranks_agree and summary["hit_tokens"] > 0):
        sys.exit(1)


if __name__ == "__main__":
    main()

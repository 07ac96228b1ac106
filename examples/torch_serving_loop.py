"""A serving loop in miniature: the reference scheduler drives the torch backend, and a toy
recurrent layer (a causal conv followed by a decaying linear state) reads and writes the
state blocks the runner resolves. A request that resumes from the prefix cache produces
the same outputs, bit for bit, as the request that computed its prefix. The scenario and
the check are shared with the JAX twin (``prefix_scenario.py``).

Runs on the CPU (Triton's interpreter) or a GPU: ``python examples/torch_serving_loop.py``.
"""

from __future__ import annotations

import torch
from prefix_scenario import CFG, NUM_BLOCKS, NUM_SLOTS, D, K, report, serve

from mamba_align.backends.torch import StateRunner

dev = "cuda" if torch.cuda.is_available() else "cpu"
gen = torch.Generator().manual_seed(0)
EMB = torch.randn(64, D, generator=gen).to(dev)  # token id -> input vector
W = torch.randn(K, D, generator=gen).to(dev)  # depthwise conv weights


def toy_layer(pools, blocks, batch):
    """docs/semantics.md §4 for one row at a time: read the initial state from the read blocks, run the
    tokens, write a candidate after every token (spec rows) or the final state."""
    conv, ssm = pools["conv"][0], pools["ssm"][0]
    outs = []
    for b, tokens in enumerate(batch.tokens):
        if batch.idx_mapping[b] < 0:
            outs.append([])
            continue
        t_read, c_read = int(blocks.temporal_read[b]), int(blocks.conv_read[b])
        off = int(blocks.conv_read_bias[b])
        h = ssm[t_read].clone() if t_read >= 0 else torch.zeros(D, device=dev)
        hist = conv[c_read, off:off + K - 1].clone() if c_read >= 0 else torch.zeros(K - 1, D, device=dev)
        full = torch.cat([hist, EMB[list(tokens)]])
        states, y = [], []
        for t in range(len(tokens)):
            h = 0.9 * h + (W * full[t:t + K]).sum(0)
            states.append(h)
            y.append(float(h.sum()))
        spec, n = bool(batch.is_spec[b]), len(tokens)
        for j, st in enumerate(states if spec else states[-1:]):
            if int(blocks.temporal_write[b, j]) >= 0:
                ssm[int(blocks.temporal_write[b, j])] = st
        c = n if spec else 1  # candidates kept in the new conv window
        new = full[n - c + 1 : n - c + 1 + K - 2 + c]
        if int(blocks.conv_write[b]) >= 0:  # -1: no write (conv[-1] is a real block)
            conv[int(blocks.conv_write[b]), : len(new)] = new
        outs.append(y)
    return outs


def main() -> None:
    runner = StateRunner(CFG, NUM_SLOTS, dev)
    pools = {n: torch.zeros(CFG.pool_shape(n, NUM_BLOCKS), device=dev) for n in CFG.states}
    i32 = lambda a: torch.as_tensor(a, dtype=torch.int32, device=dev)  # noqa: E731

    def step(batch, sample):
        runner.add_requests(i32(batch.added_slots), i32(batch.added_num_computed))
        idx, q, bt = i32(batch.idx_mapping), i32(batch.query_len), i32(batch.block_table)
        spec = torch.as_tensor(batch.is_spec, device=dev)
        blocks = runner.preprocess(pools, idx, q, spec, bt)
        ys = toy_layer(pools, blocks, batch)  # the model's forward pass
        num_sampled = sample()
        runner.postprocess(pools, idx, q, spec, i32(num_sampled), bt)
        return ys, num_sampled
    step.errors = runner.errors

    report(*serve(step))


if __name__ == "__main__":
    main()

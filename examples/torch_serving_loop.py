"""A serving loop in miniature: the reference scheduler drives the torch backend, and a toy
recurrent layer (a causal conv followed by a decaying linear state) reads and writes the
state blocks the runner resolves. A request that resumes from the prefix cache produces
the same outputs, bit for bit, as the request that computed its prefix.

Runs on the CPU (Triton's interpreter) or a GPU: ``python examples/torch_serving_loop.py``.
"""

from __future__ import annotations

import torch

from mamba_align.backends.torch import StateRunner
from mamba_align.core import CacheConfig, ConvSpec, Scheduler, TemporalSpec

B, S, K, D = 4, 2, 3, 8  # block size, drafts per step, conv kernel, channels
CFG = CacheConfig(B, S, 1, {"conv": ConvSpec(K, D, "SD", "float32"),
                            "ssm": TemporalSpec((D,), "float32")})
dev = "cuda" if torch.cuda.is_available() else "cpu"
gen = torch.Generator().manual_seed(0)
EMB = torch.randn(64, D, generator=gen).to(dev)  # token id -> input vector
W = torch.randn(K, D, generator=gen).to(dev)  # depthwise conv weights


def toy_layer(pools, slots, batch):
    """SPEC.md §4 for one row at a time: read the initial state from the read slots, run the
    tokens, write a candidate after every token (spec rows) or the final state."""
    conv, ssm = pools["conv"][0], pools["ssm"][0]
    outs = []
    for b, tokens in enumerate(batch.tokens):
        if batch.idx_mapping[b] < 0:
            outs.append([])
            continue
        t_read, c_read = int(slots.temporal_read[b]), int(slots.conv_read[b])
        off = int(slots.conv_read_off[b])
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
            if int(slots.temporal_write[b, j]) >= 0:
                ssm[int(slots.temporal_write[b, j])] = st
        c = n if spec else 1  # candidates kept in the new conv window
        new = full[n - c + 1 : n - c + 1 + K - 2 + c]
        conv[int(slots.conv_write[b]), : len(new)] = new
        outs.append(y)
    return outs


def serve(requests, num_blocks=48):
    """Run ``requests`` ({id: (arrival step, prompt, output)}); returns the per-position
    outputs of every request."""
    sched = Scheduler(CFG, num_blocks, max_num_seqs=4, max_num_tokens=16, max_model_len=64)
    runner = StateRunner(CFG, 4, dev)
    pools = {n: torch.zeros(CFG.pool_shape(n, num_blocks), device=dev) for n in CFG.states}
    outputs = {rid: {} for rid in requests}
    pending, step = dict(requests), 0
    i32 = lambda a: torch.as_tensor(a, dtype=torch.int32, device=dev)  # noqa: E731
    while pending or sched.has_unfinished():
        for rid in [r for r, (t, *_) in pending.items() if t <= step]:
            _, prompt, output = pending.pop(rid)
            sched.add_request(rid, prompt, output)
        step += 1
        if not sched.has_unfinished():
            continue
        batch = sched.schedule()
        runner.add_requests(i32(batch.added_slots), i32(batch.added_num_computed))
        idx, q, bt = i32(batch.idx_mapping), i32(batch.query_len), i32(batch.block_table)
        spec = torch.as_tensor(batch.is_spec, device=dev)
        starts = {int(r): sched.requests[int(r)].num_computed for r in batch.req_ids}
        slots = runner.preprocess(pools, idx, q, spec, bt)
        ys = toy_layer(pools, slots, batch)
        num_sampled = sched.sample(batch)
        runner.postprocess(pools, idx, q, spec, i32(num_sampled), bt)
        for b, rid in enumerate(batch.req_ids):
            keep = len(ys[b]) if not batch.is_spec[b] else int(num_sampled[b])
            for j in range(keep):  # outputs of accepted positions only
                outputs[int(rid)][starts[int(rid)] + j] = ys[b][j]
        sched.update(batch, num_sampled)
    return outputs, sched


def main() -> None:
    prompt, out0 = list(range(1, 12)), list(range(20, 30))
    # request 1 arrives once request 0 is done; its prompt continues request 0's text past
    # the boundary at 16 tokens, which request 0 reached while decoding with drafts (the
    # snapshot was saved by a post-process copy)
    reqs = {0: (0, prompt, out0), 1: (20, (prompt + out0)[:18] + [40], [41, 42])}
    outputs, sched = serve(reqs)
    hit = sched.requests[1].hit_tokens
    shared = sorted(p for p in outputs[1] if p < 18 and p in outputs[0])
    same = all(outputs[0][p] == outputs[1][p] for p in shared)
    print(f"request 1 resumed from a cached block after {hit} tokens")
    print(f"positions it computed itself that request 0 also computed: {shared}")
    print(f"outputs identical bit for bit: {same}")
    if hit != 16 or not shared or not same:
        raise SystemExit("prefix caching was not exact")


if __name__ == "__main__":
    main()

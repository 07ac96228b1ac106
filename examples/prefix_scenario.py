"""The framework-free half of the serving-loop examples: the cache configuration, the two
requests, the scheduler, and the check that a request resumed from the prefix cache
reproduces the outputs of the request that computed its prefix.

``torch_serving_loop.py`` and ``jax_serving_loop.py`` run the same scenario through their
backend; only the step (bookkeeping calls and the toy layer) differs between them.
"""

from __future__ import annotations

from mamba_align.core import CacheConfig, ConvSpec, Scheduler, TemporalSpec

B, S, K, D = 4, 2, 3, 8  # block size, drafts per step, conv kernel, channels
CFG = CacheConfig(B, S, 1, {"conv": ConvSpec(K, D, "SD", "float32"),
                            "ssm": TemporalSpec((D,), "float32")})
NUM_BLOCKS, NUM_SLOTS = 48, 4

prompt, out0 = list(range(1, 12)), list(range(20, 30))
# request 1 arrives once request 0 is done; its prompt continues request 0's text past the
# boundary at 16 tokens, which request 0 reached while decoding with drafts (the snapshot
# was saved by a post-process copy)
REQUESTS = {0: (0, prompt, out0), 1: (20, (prompt + out0)[:18] + [40], [41, 42])}


def serve(step, requests=REQUESTS):
    """Run ``requests`` ({id: (arrival step, prompt, output)}) through ``step(batch,
    sample)``, which does one step on the backend and returns the toy layer's per-row
    outputs and ``sample()``'s accepted counts, and whose ``errors()`` gives the device's
    faults (read, as ``hybrid_serving.serve`` reads them, before the scheduler records a
    step's blocks). Returns the per-position outputs of every request and the scheduler."""
    sched = Scheduler(CFG, NUM_BLOCKS, max_num_seqs=NUM_SLOTS, max_num_tokens=16,
                      max_model_len=64)
    outputs = {rid: {} for rid in requests}
    pending, t = dict(requests), 0
    while pending or sched.has_unfinished():
        for rid in [r for r, (at, *_) in pending.items() if at <= t]:
            _, p, o = pending.pop(rid)
            sched.add_request(rid, p, o)
        t += 1
        if not sched.has_unfinished():
            continue
        batch = sched.schedule()
        starts = {int(r): sched.requests[int(r)].num_computed for r in batch.req_ids}
        ys, num_sampled = step(batch, lambda: sched.sample(batch))
        faults = step.errors()  # the device's flag, before the scheduler records the step
        if faults:
            raise RuntimeError(f"the device flagged faults: {'; '.join(faults)}")
        for b, rid in enumerate(batch.req_ids):
            keep = len(ys[b]) if not batch.is_spec[b] else int(num_sampled[b])
            for j in range(keep):  # outputs of accepted positions only
                outputs[int(rid)][starts[int(rid)] + j] = ys[b][j]
        sched.update(batch, num_sampled)
    return outputs, sched


def report(outputs, sched) -> None:
    """Print whether request 1 resumed from the cache and matched request 0 bit for bit;
    exit with an error if not."""
    hit = sched.requests[1].hit_tokens
    shared = sorted(p for p in outputs[1] if p < 18 and p in outputs[0])
    same = all(outputs[0][p] == outputs[1][p] for p in shared)
    print(f"request 1 resumed from a cached block after {hit} tokens")
    print(f"positions it computed itself that request 0 also computed: {shared}")
    print(f"outputs identical bit for bit: {same}")
    if hit != 16 or not shared or not same:
        raise SystemExit("prefix caching was not exact")

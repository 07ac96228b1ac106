"""A cache study in JAX: prefix-cache hit rate, prompt tokens computed and the state
memory align mode holds (running requests' blocks, and the prefix cache's), against the block size ``B`` and the drafts per step ``S``, on a
synthetic multi-turn chat workload.

Each configuration serves the same workload (its content keyed by user and turn) through
the reference scheduler and the jitted JAX bookkeeping: one ``jax.jit`` call per step
(``add_requests``, ``preprocess`` with its pre-copy, ``postprocess`` with its snapshot
copies), batches padded to a fixed number of rows so that it compiles once. No model runs
(the figures do not depend on the state's values), so the pools are tiny; the memory
column prices the most blocks running requests held at once (the window of ``1 + S`` and
the kept block each; the prefix cache's evictable blocks come on top) at Qwen3-Next's
state sizes.

    python examples/jax_cache_study.py [--png cache_study.png]
"""

from __future__ import annotations

import argparse
import random
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from mamba_align.backends import jax as mj
from mamba_align.core import CacheConfig, ConvSpec, Scheduler, TemporalSpec, pad_batch

warnings.filterwarnings("ignore", message=".*called outside jax.jit")
USERS, TURNS, SYSTEM = 4, 3, 40  # chats, turns per chat, shared system-prompt tokens
SLOTS, NUM_BLOCKS = 4, 160
# Qwen3-Next's recurrent state per layer and block: a [32, 128, 128] fp32 delta-rule state
# and a conv window of K - 1 + S rows of 8192 bf16 channels, over 36 recurrent layers
LAYERS, SSM_BYTES, CONV_K, CONV_D = 36, 32 * 128 * 128 * 4, 4, 8192


def workload(users: int = USERS, turns: int = TURNS):
    """Per user, the turns' ``(user message, answer)`` token lists: fixed by (user, turn)."""
    out = {}
    for u in range(users):
        for t in range(turns):
            rng = random.Random(f"{u}/{t}")
            out[u, t] = ([rng.randrange(1, 1000) for _ in range(rng.randrange(8, 40))],
                         [rng.randrange(1, 1000) for _ in range(rng.randrange(8, 24))])
    return out


def drafter(req, max_drafts):
    """Right 70 % of the time per position (a fixed function of request and position)."""
    out = []
    for j, t in enumerate(req.tokens[req.known:req.known + max_drafts]):
        right = random.Random(f"{req.req_id}/{req.known + j}").random() < 0.7
        out.append(t if right else -1)
    return out


def study(B: int, S: int, chats) -> dict:
    """Serve ``chats`` with block size ``B`` and ``S`` drafts; the study's figures."""
    cfg = CacheConfig(B, S, 1, {"conv": ConvSpec(CONV_K, 1, "DS", "float32"),
                                "ssm": TemporalSpec((1,), "float32")})
    sched = Scheduler(cfg, NUM_BLOCKS, max_num_seqs=SLOTS, max_num_tokens=64,
                      max_model_len=1024, drafter=drafter)
    system = [random.Random("system").randrange(1, 1000) for _ in range(SYSTEM)]
    history = {u: list(system) for u, _ in chats}
    turn, owner = {u: 0 for u, _ in chats}, {}

    def submit(u):
        msg, answer = chats[u, turn[u]]
        history[u] += msg
        rid = u * TURNS + turn[u]
        sched.add_request(rid, history[u], answer)
        owner[rid] = (u, answer)

    @jax.jit
    def step(state, pools, added, added_nc, idx, q, spec, bt, ns):
        state = mj.add_requests(state, added, added_nc, config=cfg)
        state, pools, _ = mj.preprocess(state, pools, idx, q, spec, bt, config=cfg)
        state, pools, col = mj.postprocess(state, pools, idx, q, spec, ns, bt, config=cfg)
        return state, pools, col

    i32 = lambda a: jnp.asarray(np.asarray(a), jnp.int32)  # noqa: E731
    state = mj.init_state(SLOTS)
    pools = {n: jnp.zeros(cfg.pool_shape(n, NUM_BLOCKS), s.dtype) for n, s in cfg.states.items()}
    for u in history:
        submit(u)
    steps = prefill = drafts = accepted = peak = cached_peak = 0
    while sched.has_unfinished():
        batch = sched.schedule()
        batch = pad_batch(batch, list(range(batch.num_rows, SLOTS)))  # a fixed shape
        ns = sched.sample(batch)
        added = np.full(SLOTS, -1)
        added_nc = np.zeros(SLOTS)
        added[:len(batch.added_slots)] = batch.added_slots
        added_nc[:len(batch.added_slots)] = batch.added_num_computed
        state, pools, col = step(state, pools, i32(added), i32(added_nc),
                                 i32(batch.idx_mapping), i32(batch.query_len),
                                 jnp.asarray(batch.is_spec), i32(batch.block_table), i32(ns))
        live = batch.idx_mapping >= 0
        prefill += sum(int(q) for rid, q in zip(batch.req_ids, batch.query_len)
                       if rid >= 0 and not sched.requests[int(rid)].prefill_done)
        drafts += int((batch.query_len[live & batch.is_spec] - 1).sum())
        accepted += int((ns[live & batch.is_spec] - 1).clip(0).sum())
        peak = max(peak, NUM_BLOCKS - 1 - sched.pool.num_available())
        result = sched.update(batch, ns)
        col = np.asarray(col)
        for c in result.cached:  # the JAX kernels named every column the scheduler caches
            row = int(np.flatnonzero(batch.req_ids == c.req_id)[0])
            if col[row] != c.column:
                raise SystemExit(f"B={B} S={S}: JAX gave column {col[row]}, the scheduler "
                                 f"cached {c.column}")
        cached_peak = max(cached_peak, len(sched.pool.cached_blocks()))
        steps += 1
        for rid in result.finished:
            u, answer = owner.pop(rid)
            history[u] += answer
            turn[u] += 1
            if turn[u] < TURNS:
                submit(u)
    if mj.errors(state):
        raise SystemExit(f"B={B} S={S}: the kernels flagged {mj.errors(state)}")
    reqs = sched.requests.values()
    prompt = sum(r.prompt_len for r in reqs)
    block_bytes = SSM_BYTES + (CONV_K - 1 + S) * CONV_D * 2
    return dict(B=B, S=S, steps=steps, prompt=prompt, hit=sum(r.prompt_hit_tokens for r in reqs),
                prefill=prefill, acceptance=accepted / drafts if drafts else None,
                peak_blocks=peak, cached_blocks=cached_peak,
                state_gib=peak * block_bytes * LAYERS / 2**30,
                cache_gib=cached_peak * block_bytes * LAYERS / 2**30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--png", type=Path, default=Path("cache_study.png"))
    ap.add_argument("--blocks", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--drafts", type=int, nargs="+", default=[0, 1, 3])
    args = ap.parse_args()
    chats = workload()
    rows = [study(B, S, chats) for S in args.drafts for B in args.blocks if S <= B - 1]
    print(f"{USERS} chats x {TURNS} turns, a {SYSTEM}-token system prompt; jitted JAX "
          f"bookkeeping on {jax.default_backend()}; memory at Qwen3-Next state sizes "
          f"({LAYERS} layers)\n")
    print("|  B |  S | steps | prompt tokens | from the cache | hit rate | prompt computed "
          "| draft acceptance | peak blocks held | GiB | peak blocks cached | GiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        acc = "n/a" if r["acceptance"] is None else f"{100 * r['acceptance']:.0f} %"
        print(f"| {r['B']:2d} | {r['S']:2d} | {r['steps']:5d} | {r['prompt']:13d} | "
              f"{r['hit']:14d} | {100 * r['hit'] / r['prompt']:7.1f} % | {r['prefill']:15d} "
              f"| {acc:>16} | {r['peak_blocks']:16d} | {r['state_gib']:5.2f} | "
              f"{r['cached_blocks']:18d} | {r['cache_gib']:5.2f} |")
    print("\nheld: the running requests' windows (1 + S blocks) and kept blocks; cached: "
          "the blocks in the prefix cache (some of them held as well). Hits also depend on where prefill chunks "
          "end (max_num_tokens = 64): align mode keeps a state only at chunk ends and at "
          "block boundaries crossed while decoding.")
    plot(rows, args.png)


def plot(rows, path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print(f"(matplotlib is not installed: no {path})")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for S in sorted({r["S"] for r in rows}):
        rs = [r for r in rows if r["S"] == S]
        a1.plot([r["B"] for r in rs], [100 * r["hit"] / r["prompt"] for r in rs], marker="o",
                label=f"S = {S}")
        a2.plot([r["B"] for r in rs], [r["state_gib"] for r in rs], marker="o",
                label=f"held, S = {S}")
        a2.plot([r["B"] for r in rs], [r["cache_gib"] for r in rs], marker="s", linestyle="--",
                label=f"cached, S = {S}")
    for ax, label in ((a1, "prompt tokens from the prefix cache (%)"),
                      (a2, "peak state memory (GiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("block size B (tokens)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Align-mode prefix caching against the block size B and drafts S",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

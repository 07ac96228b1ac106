"""The serving loop of ``torch_serving_loop.py`` in JAX: the reference scheduler drives the
pure JAX step functions, a toy recurrent layer reads and writes the resolved blocks, and a
request resumed from the prefix cache reproduces the original outputs bit for bit.

Runs on the CPU (Triton's interpreter via ``jax.pure_callback``) or a GPU (jax-triton):
``python examples/jax_serving_loop.py``.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from prefix_scenario import CFG, NUM_BLOCKS, NUM_SLOTS, D, K, report, serve

from mamba_align.backends import jax as mj

warnings.filterwarnings("ignore", message=".*called outside jax.jit")  # eager on purpose
k1, k2 = jax.random.split(jax.random.key(0))
EMB = jax.random.normal(k1, (64, D), jnp.float32)  # token id -> input vector
W = jax.random.normal(k2, (K, D), jnp.float32)  # depthwise conv weights


def toy_layer(pools, blocks, batch):
    """Per row: read the initial state, run the tokens, write the candidates (docs/semantics.md §4)."""
    conv, ssm = pools["conv"], pools["ssm"]
    outs = []
    for b, tokens in enumerate(batch.tokens):
        if batch.idx_mapping[b] < 0:
            outs.append([])
            continue
        t_read, c_read = int(blocks.temporal_read[b]), int(blocks.conv_read[b])
        off = int(blocks.conv_read_bias[b])
        h = ssm[0, t_read] if t_read >= 0 else jnp.zeros(D, ssm.dtype)
        hist = (conv[0, c_read, off:off + K - 1] if c_read >= 0
                else jnp.zeros((K - 1, D), conv.dtype))
        full = jnp.concatenate([hist, EMB[np.array(tokens)]])
        states, y = [], []
        for t in range(len(tokens)):
            h = 0.9 * h + (W * full[t:t + K]).sum(0)
            states.append(h)
            y.append(float(h.sum()))
        spec, n = bool(batch.is_spec[b]), len(tokens)
        for j, st in enumerate(states if spec else states[-1:]):
            if int(blocks.temporal_write[b, j]) >= 0:
                ssm = ssm.at[0, int(blocks.temporal_write[b, j])].set(st)
        c = n if spec else 1
        new = full[n - c + 1 : n - c + 1 + K - 2 + c]
        if int(blocks.conv_write[b]) >= 0:  # -1: no write (index -1 is a real block)
            conv = conv.at[0, int(blocks.conv_write[b]), : len(new)].set(new)
        outs.append(y)
    return {"conv": conv, "ssm": ssm}, outs


def main() -> None:
    carry = {"state": mj.init_state(NUM_SLOTS),
             "pools": {n: jnp.zeros(CFG.pool_shape(n, NUM_BLOCKS), s.dtype)
                       for n, s in CFG.states.items()}}
    i32 = lambda a: jnp.asarray(np.asarray(a), jnp.int32)  # noqa: E731

    def step(batch, sample):  # pure step functions: the new state and pools are carried
        state = mj.add_requests(carry["state"], i32(batch.added_slots),
                                i32(batch.added_num_computed), config=CFG)
        idx, q, bt = i32(batch.idx_mapping), i32(batch.query_len), i32(batch.block_table)
        spec = jnp.asarray(batch.is_spec)
        state, pools, blocks = mj.preprocess(state, carry["pools"], idx, q, spec, bt,
                                             config=CFG, mode="pre-copy")
        pools, ys = toy_layer(pools, blocks, batch)  # the model's forward pass
        num_sampled = sample()
        state, pools, _ = mj.postprocess(state, pools, idx, q, spec, i32(num_sampled), bt,
                                         config=CFG)
        carry.update(state=state, pools=pools)
        return ys, num_sampled
    step.errors = lambda: mj.errors(carry["state"])

    report(*serve(step))


if __name__ == "__main__":
    main()

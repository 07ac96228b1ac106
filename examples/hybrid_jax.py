"""The hybrid model of ``hybrid_model.py`` on the library's kernels, from JAX: the twin of
``hybrid_torch.py``, as a pure function (jit it with the pools and the error flag
donated). The same launches on arrays of the same shapes and dtypes, so a row's logits are
the same bits as from torch.
"""

from __future__ import annotations

from typing import Callable, Dict, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from hybrid_model import Blocks, ModelConfig, check_weights

from mamba_align.backends import jax as mj
from mamba_align.backends.jax import ops
from mamba_align.core import new_errors, raise_errors


def load_weights(cfg: ModelConfig, weights: Mapping[str, np.ndarray]) -> Dict[str, jax.Array]:
    """The model's NumPy weights as JAX arrays (bf16 stays bf16), checked against ``cfg``
    (``hybrid_model.check_weights``)."""
    check_weights(cfg, weights)
    return {n: jnp.asarray(a) for n, a in weights.items()}


def forward(cfg: ModelConfig, w: Mapping[str, jax.Array], pools: Mapping[str, jax.Array],
            errors: jax.Array, tokens: jax.Array, cu_seqlens: jax.Array, blocks,
            is_spec: jax.Array, reduce: Optional[Callable] = None,
            ) -> Tuple[jax.Array, Dict[str, jax.Array], jax.Array]:
    """``(logits fp32 [T, vocab], pools, errors)`` of one step: the arguments as for
    ``TorchModel.forward`` (``reduce`` too: a shard's all-reduce, e.g. ``lax.psum``);
    ``cfg`` is static under ``jax.jit``."""
    reduce = reduce or (lambda t: t)
    H, HV, K, V = cfg.heads, cfg.value_heads, cfg.head_k, cfg.head_v
    T = tokens.shape[0]
    conv, ssm = pools["conv"], pools["ssm"]
    x = w["embed"][tokens].astype(jnp.float32)
    dt = w["embed"].dtype
    for i in range(cfg.layers):
        p = f"l{i}."
        h = ops.rms_norm(x.astype(dt), w[p + "norm1"], eps=cfg.eps)["y"]
        proj = ops.linear(h, w[p + "w_qkvz"])["y"]
        mixed, z = proj[:, :cfg.d_conv], proj[:, cfg.d_conv:]
        out = ops.conv1d_update(conv, errors, mixed, w[p + "conv_w"], w[p + "conv_b"],
                                cu_seqlens, blocks.conv_read, blocks.conv_read_bias,
                                blocks.conv_write, is_spec, layer=i, layout="DS",
                                activation="silu")
        conv, errors, y = out["pool"], out["errors"], out["y"]
        q = y[:, :H * K].reshape(T, H, K)
        k = y[:, H * K:2 * H * K].reshape(T, H, K)
        v = y[:, 2 * H * K:].reshape(T, HV, V)
        if cfg.mixer == "mamba2":  # q, k, v are C, B, x
            out = ops.selective_state_update(
                ssm, errors, v, ops.linear(h, w[p + "w_dt"])["y"], w[p + "A"], k, q, w[p + "D"],
                w[p + "dt_bias"], cu_seqlens, blocks.temporal_read, blocks.temporal_write,
                is_spec, layer=i)
            o = out["y"]
        else:
            ba = ops.linear(h, w[p + "w_ba"])["y"]
            out = ops.gated_delta_rule_fused_gates(
                ssm, errors, q, k, v, ba[:, HV:], ba[:, :HV], w[p + "A_log"], w[p + "dt_bias"],
                cu_seqlens, blocks.temporal_read, blocks.temporal_write, is_spec, layer=i,
                use_qk_l2norm=True)
            o = out["o"]
        ssm, errors = out["pool"], out["errors"]
        o = ops.rms_norm_gated(o.reshape(T * HV, V), z.reshape(T * HV, V),
                               w[p + "onorm"], eps=cfg.eps)["y"]
        x = x + reduce(ops.linear(o.reshape(T, HV * V), w[p + "w_o"])["y"].astype(jnp.float32))
        h2 = ops.rms_norm(x.astype(dt), w[p + "norm2"], eps=cfg.eps)["y"]
        m = ops.silu_mul(ops.linear(h2, w[p + "w_gate"])["y"],
                         ops.linear(h2, w[p + "w_up"])["y"])["y"]
        x = x + reduce(ops.linear(m, w[p + "w_down"])["y"].astype(jnp.float32))
    h = ops.rms_norm(x.astype(dt), w["norm_f"], eps=cfg.eps)["y"]
    logits = ops.linear(h, w["lm_head"])["y"].astype(jnp.float32)
    return logits, {**pools, "conv": conv, "ssm": ssm}, errors


def new_pools(cache, num_blocks: int) -> Dict[str, jax.Array]:
    """Zeroed pools of every state of ``cache`` (a ``CacheConfig``) in their dtypes."""
    return {n: jnp.zeros(cache.pool_shape(n, num_blocks), s.dtype)
            for n, s in cache.states.items()}


#: the forward pass jitted once per shape, with the pools and the error flag donated
jitted_forward = jax.jit(forward, static_argnums=0, donate_argnums=(2, 3))


def single_row(cfg: ModelConfig, w, num_spec: int):
    """``forward_one(tokens, read, write)`` for ``hybrid_serving.generate`` (see the torch
    twin)."""
    carry = {"pools": new_pools(cfg.cache_config(num_spec + 1, num_spec), 3),
             "errors": jnp.asarray(new_errors())}
    ids = lambda *v: jnp.asarray(np.array(v), jnp.int32)  # noqa: E731

    def forward_one(tokens, read: int, write: int) -> np.ndarray:
        blocks = Blocks(ids(read), ids(read), ids(0), ids([write] + [-1] * num_spec),
                         ids(write))
        lg, carry["pools"], carry["errors"] = jitted_forward(
            cfg, w, carry["pools"], carry["errors"], ids(*tokens), ids(0, len(tokens)),
            blocks, jnp.asarray([False]))
        raise_errors(np.asarray(carry["errors"]))
        return np.asarray(lg)
    return forward_one


def greedy_accept(logits: jax.Array, tokens: jax.Array, cu_seqlens: jax.Array,
                  is_spec: jax.Array, limit: jax.Array, num_spec: int) -> jax.Array:
    """Greedy sampling's token counts, int32 ``[rows]``: the twin of
    ``hybrid_torch.greedy_accept``."""
    top = jnp.argmax(logits, -1).astype(jnp.int32)
    j = jnp.arange(num_spec)
    start = cu_seqlens[:-1, None] + j  # position j of a row predicts its draft j + 1
    drafted = j[None, :] < (cu_seqlens[1:] - cu_seqlens[:-1] - 1)[:, None]
    agree = drafted & (top[jnp.where(drafted, start, 0)]
                       == tokens[jnp.where(drafted, start + 1, 0)])
    accepted = jnp.cumprod(agree.astype(jnp.int32), 1).sum(1)
    ns = jnp.where(is_spec, accepted + 1, 1)
    return jnp.minimum(ns, limit).astype(jnp.int32)


def serving_step(cfg: ModelConfig, w, cache, pools: Dict[str, jax.Array], num_slots: int,
                 mode: str = "pre-copy", *, fused: bool = False, mesh=None, axis: str = "tp"):
    """``step(inputs, sample)`` for ``hybrid_serving.serve``: one jitted call per step
    (compiled once per shape of the inputs), the pure JAX bookkeeping (``add_requests``,
    ``preprocess``, ``postprocess``) around the model, the slot state and pools donated
    and carried between steps (``step.carry``). Returns the logits (on the device) and
    the sampled counts (NumPy): ``sample()``'s by default, :func:`greedy_accept`'s on the
    device with ``fused``.

    With ``mesh`` (a ``jax.sharding.Mesh`` with axis ``axis`` of ``tp`` devices), tensor
    parallel: ``cfg`` and ``cache`` are a shard's (``hybrid_model.shard``), every weight
    and pool carries the ranks' shards stacked on a leading axis of ``tp``, sharded over
    the mesh, and the step is one ``shard_map`` jitted once for the mesh: each device
    runs the kernels on its shard, sums the partial outputs with ``lax.psum``, and
    repeats the replicated bookkeeping (implies ``fused``)."""
    carry = {"state": mj.init_state(num_slots), "pools": pools}
    reduce = None if mesh is None else (lambda t: jax.lax.psum(t, axis))

    def body(w, state, pools, x, ns):
        state = mj.add_requests(state, x.added_slots, x.added_num_computed, config=cache)
        state, pools, blocks = mj.preprocess(state, pools, x.idx_mapping, x.query_len,
                                             x.is_spec, x.block_table, config=cache, mode=mode)
        logits, pools, errors = forward(cfg, w, pools, state.errors, x.tokens, x.cu_seqlens,
                                        blocks, x.is_spec, reduce)
        if ns is None:
            ns = greedy_accept(logits, x.tokens, x.cu_seqlens, x.is_spec, x.limit,
                               cache.num_spec)
        state, pools, _ = mj.postprocess(state._replace(errors=errors), pools, x.idx_mapping,
                                         x.query_len, x.is_spec, ns, x.block_table,
                                         config=cache)
        return logits, ns, state, pools

    if mesh is None:
        jitted = jax.jit(body, donate_argnums=(1, 2))
    else:
        fused = True
        P = jax.sharding.PartitionSpec
        one = lambda tree: jax.tree.map(lambda a: a[0], tree)  # noqa: E731  (this shard)
        stacked = lambda tree: jax.tree.map(lambda a: a[None], tree)  # noqa: E731

        def shard_body(w, state, pools, x):
            logits, ns, state, pools = body(one(w), state, one(pools), x, None)
            return logits, ns, state, stacked(pools)
        # the bookkeeping's outputs are replicated by construction (every device computes
        # them from the same inputs), which shard_map is told rather than shown
        jitted = jax.jit(jax.shard_map(shard_body, mesh=mesh,
                                       in_specs=(P(axis), P(), P(axis), P()),
                                       out_specs=(P(), P(), P(), P(axis)), check_vma=False),
                         donate_argnums=(1, 2))

    def step(inputs, sample):
        ns = None if fused else jnp.asarray(np.asarray(sample(), np.int32))
        x = type(inputs)(*map(jnp.asarray, inputs))
        args = (w, carry["state"], carry["pools"], x) + ((ns,) if mesh is None else ())
        logits, ns, carry["state"], carry["pools"] = jitted(*args)
        return logits, np.asarray(ns)

    step.carry = carry
    step.errors = lambda: mj.errors(carry["state"])  # read before its blocks are recorded
    return step

"""The per-step integration for JAX: the per-slot bookkeeping as a pytree and pure
``add_requests`` / ``preprocess`` / ``postprocess`` that return new state and pools.

All of it is ``jax.jit``-able (``config`` and ``mode`` static) and works inside
``lax.scan`` / ``lax.fori_loop``; jit a step with the pools and state donated so that the
GPU updates them in place::

    step = jax.jit(my_step, static_argnames=("config", "mode"), donate_argnums=(0, 1))
"""

from __future__ import annotations

from typing import Dict, NamedTuple, Tuple

import jax
import jax.numpy as jnp

from ...core.config import CacheConfig
from ...core.slots import check_mode
from . import ops


class SlotArrays(NamedTuple):
    """Per-slot bookkeeping, each ``[num_slots]`` int32/int64 (a pytree)."""

    state_idx: jax.Array
    acc: jax.Array
    num_computed: jax.Array


class JaxSlots(NamedTuple):
    """Resolved kernel slots of one step (see :class:`mamba_align.core.KernelSlots`)."""

    temporal_read: jax.Array  # [rows]
    conv_read: jax.Array  # [rows]
    conv_read_off: jax.Array  # [rows]
    temporal_write: jax.Array  # [rows, 1 + S]
    conv_write: jax.Array  # [rows]
    src_col: jax.Array
    src_off: jax.Array
    state_idx: jax.Array


Pools = Dict[str, jax.Array]


def init_state(num_slots: int, dtype=jnp.int32) -> SlotArrays:
    """Empty bookkeeping: ``state_idx = -1``, ``acc = 1``, ``num_computed = 0``."""
    if not isinstance(num_slots, int) or num_slots < 1:
        raise ValueError(f"num_slots must be an int >= 1, got {num_slots!r}")
    return SlotArrays(jnp.full((num_slots,), -1, dtype), jnp.ones((num_slots,), dtype),
                      jnp.zeros((num_slots,), dtype))


def _check(config: CacheConfig, pools: Pools, mode: str = "pre-copy") -> None:
    if not isinstance(config, CacheConfig):
        raise TypeError(f"config must be a CacheConfig, got {type(config).__name__}")
    check_mode(mode)
    for name, spec in config.states.items():
        if name not in pools:
            raise KeyError(f"pools has no entry {name!r}")
        want = spec.block_shape(config.num_spec)
        got = tuple(pools[name].shape)
        if got[2:] != want or got[0] != config.num_layers:
            raise ValueError(f"pools[{name!r}] must be [L={config.num_layers}, NB, "
                             f"{', '.join(map(str, want))}], got {list(got)}")


def _copy(config: CacheConfig, pools: Pools, tsrc, csrc, dst, shift) -> Pools:
    out = dict(pools)
    for name, kind in config.copy_kinds().items():
        if kind == "temporal":
            out[name] = ops.copy_temporal(pools[name], tsrc, dst)
        else:
            out[name] = ops.copy_conv(pools[name], csrc, dst, shift, kind)
    return out


def add_requests(state: SlotArrays, slots: jax.Array, num_computed: jax.Array,
                 config: CacheConfig) -> SlotArrays:
    """Seed ``slots`` ([n] int32/int64) with their computed tokens ``num_computed`` ([n]:
    0 fresh, k·B on a prefix hit)."""
    return SlotArrays(*ops.add_requests(*state, slots, num_computed, config.block_size))


def preprocess(state: SlotArrays, pools: Pools, idx_mapping: jax.Array, query_len: jax.Array,
               is_spec: jax.Array, block_table: jax.Array, config: CacheConfig,
               mode: str = "pre-copy") -> Tuple[SlotArrays, Pools, JaxSlots]:
    """Bookkeeping, the pre-copy (pre-copy mode) and slot resolution for one step.

    ``idx_mapping`` ([rows] int: the slot of each batch row), ``query_len`` ([rows] int),
    ``is_spec`` ([rows] bool/int8/int32), ``block_table`` ([num_slots, cols] int); ``pools``
    maps each state name of ``config`` to its ``[L, NB, *block]`` pool. Returns the new
    state and pools and the rows' resolved slots (per-row arrays int32, int64 with x64)."""
    _check(config, pools, mode)
    out = ops.preprocess_resolve(*state, idx_mapping, query_len, is_spec, block_table,
                                 config.block_size, config.num_spec, mode)
    state = SlotArrays(out["state_idx"], out["acc"], state.num_computed)
    if mode == "pre-copy":
        pools = _copy(config, pools, out["copy_tsrc"], out["copy_csrc"], out["copy_dst"],
                      out["copy_shift"])
    return state, pools, JaxSlots(*(out[f] for f in JaxSlots._fields[:5]), out["src_col"],
                                  out["src_off"], out["new_col"])


def postprocess(state: SlotArrays, pools: Pools, idx_mapping: jax.Array, query_len: jax.Array,
                is_spec: jax.Array, num_sampled: jax.Array, block_table: jax.Array,
                config: CacheConfig) -> Tuple[SlotArrays, Pools, jax.Array]:
    """Accept ``num_sampled`` ([rows] int) and save boundary snapshots (other arguments as
    in :func:`preprocess`); returns the new state, pools and per-row ``cache_col`` ([rows]:
    the column whose block may enter the prefix cache, -1 if none)."""
    _check(config, pools)
    post = ops.postprocess(*state, idx_mapping, query_len, is_spec, num_sampled, block_table,
                           config.block_size)
    state = SlotArrays(state.state_idx, post["acc"], post["num_computed"])
    pools = _copy(config, pools, post["copy_tsrc"], post["copy_csrc"], post["copy_dst"],
                  post["copy_shift"])
    return state, pools, post["cache_col"]

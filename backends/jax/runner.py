"""The per-step integration for JAX: the per-slot bookkeeping as a pytree and pure
``add_requests`` / ``preprocess`` / ``postprocess`` that return new state and pools.

All of it is ``jax.jit``-able (``config`` and ``mode`` static) and works inside
``lax.scan`` / ``lax.fori_loop``; jit a step with the pools and state donated so that the
GPU updates them in place::

    step = jax.jit(my_step, static_argnames=("config", "mode"), donate_argnums=(0, 1))

(``validate``, where a step passes it, is static too.)

Bad values in the step's arrays do not raise: the kernels serve a row they cannot trust as
a skipped row, leave its slot faulty until :func:`add_requests` seeds it again, and record
the fault in ``state.errors``, which :func:`errors` reads (docs/semantics.md §1).

The checked mode, ``validate=True`` on every step function, raises instead: eagerly a
``ValueError`` with the messages of :data:`mamba_align.core.faults.MESSAGES` (as the torch
runner), and under ``jax.jit`` through
``jax.experimental.checkify`` (``err, out = checkify.checkify(jitted_step)(...)``;
``err.throw()``). A faulty checked call returns the state unchanged and copies nothing.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Tuple, Union

import jax
import jax.numpy as jnp
from jax.experimental import checkify

from ...core.checks import index_dtype, instance, positive_int
from ...core.config import CacheConfig
from ...core.faults import CHECKED, MESSAGES, Fault, decode_errors, new_errors, raise_errors
from ...core.faults import faulty_slots as core_faulty_slots
from ...core.resolve import Mode, check_mode
from ... import kernels as K
from . import ops


class SlotArrays(NamedTuple):
    """Per-slot bookkeeping, each ``[num_slots]`` int32/int64, and the sticky error flag
    ``errors`` (int32 ``[2]``, :func:`errors` decodes it); a pytree."""

    state_idx: jax.Array
    acc: jax.Array
    num_computed: jax.Array
    errors: jax.Array


class JaxBlocks(NamedTuple):
    """The blocks the recurrent kernels read and write in one step (see
    :class:`mamba_align.core.KernelBlocks`), and the rows' preprocess results."""

    temporal_read: jax.Array  # [rows]
    conv_read: jax.Array  # [rows]
    conv_read_bias: jax.Array  # [rows]
    temporal_write: jax.Array  # [rows, 1 + S]
    conv_write: jax.Array  # [rows]
    src_col: jax.Array  # [rows]
    src_bias: jax.Array  # [rows]
    run_col: jax.Array  # [rows]


Pools = Dict[str, jax.Array]


def init_state(num_slots: int, dtype=jnp.int32) -> SlotArrays:
    """Empty bookkeeping: ``state_idx = -1``, ``acc = 1``, ``num_computed = 0``, each
    ``[num_slots]`` of ``dtype`` (int32, or int64 with x64), and a clear error flag."""
    positive_int("num_slots", num_slots)
    if dtype is int:  # Python's int: JAX's default integer (int64 with x64, int32 without)
        dtype = jax.dtypes.canonicalize_dtype(int)
    index_dtype("dtype", jnp.dtype(dtype).name)
    if jax.dtypes.canonicalize_dtype(dtype) != jnp.dtype(dtype):
        raise TypeError(f"dtype {jnp.dtype(dtype).name} needs jax_enable_x64 (without it JAX "
                        f"keeps {jax.dtypes.canonicalize_dtype(dtype).name}): use int32")
    return SlotArrays(jnp.full((num_slots,), -1, dtype), jnp.ones((num_slots,), dtype),
                      jnp.zeros((num_slots,), dtype), jnp.asarray(new_errors()))


def errors(state: SlotArrays) -> List[str]:
    """The faults the device path recorded in ``state.errors`` (docs/semantics.md §1):
    the messages of :func:`mamba_align.core.decode_errors`, ``[]`` when none. Reads the
    flag back to the host, so call it outside ``jax.jit``, whenever you choose to wait."""
    return decode_errors(jax.device_get(state.errors))


def faulty_slots(state: SlotArrays) -> List[int]:
    """:func:`mamba_align.core.faulty_slots` of ``state``'s slots (reads back to the host:
    outside ``jax.jit``, between steps)."""
    return core_faulty_slots(jax.device_get(state.acc))


def clear_errors(state: SlotArrays) -> SlotArrays:
    """``state`` with a clear error flag."""
    return state._replace(errors=jnp.asarray(new_errors()))


def _describe(label: str, pool) -> tuple:
    spec = ops.spec(label, pool, exact=True)  # (updated in place: JAX must not narrow it)
    return spec.shape, spec.dtype


def _check(config: CacheConfig, pools: Pools) -> int:
    instance("config", config, CacheConfig)
    return config.check_pools(pools, _describe)


def _bookkeeping(op: K.Op, state: SlotArrays, args: tuple, statics: dict,
                 validate: bool) -> dict:
    """``op`` on the state's arrays; checked (``validate``): on a clear flag, then one
    ``checkify.check`` per fault kind with its message, and a faulty call changes nothing
    (the state as it was; every row's results those of a skipped row: no copy, no block,
    no cache column), also under ``checkify.checkify`` where the step runs on."""
    instance("validate", validate, bool)
    if not validate:
        return ops.launch(op, dict(zip(op.arrays, (*state, *args))), statics)
    out = ops.launch(op, dict(zip(op.arrays, (state.state_idx, state.acc, state.num_computed,
                                              jnp.asarray(new_errors()), *args))), statics)
    if not isinstance(out["errors"], jax.core.Tracer):  # eager: torch's ValueError, as there
        raise_errors(jax.device_get(out["errors"]), CHECKED)
    bits, row = out["errors"][0], out["errors"][1]
    for f in Fault:
        checkify.check((bits & int(f)) == 0, f"{CHECKED}: {MESSAGES[f]} (lowest offending "
                       "row: {row})", row=row)
    ok = bits == 0
    for name in out:  # every per-row result as for a skipped row
        if name in SlotArrays._fields:
            out[name] = jnp.where(ok, out[name], getattr(state, name))
        else:
            out[name] = jnp.where(ok, out[name], op.skipped[name])
    out["errors"] = state.errors
    return out


def add_requests(state: SlotArrays, slots: jax.Array, num_computed: jax.Array, *,
                 config: CacheConfig, validate: bool = False) -> SlotArrays:
    """Seed ``slots`` ([n] int32/int64, -1 = skip) with their computed tokens
    ``num_computed`` ([n]: 0 fresh, k·B on a prefix hit; after a fault, 0 or a cached
    boundary: docs/semantics.md §1). ``validate``: the checked mode (see the module)."""
    instance("config", config, CacheConfig)
    out = _bookkeeping(K.ADD_REQUESTS, state, (slots, num_computed),
                       {"block_size": config.block_size}, validate)
    return SlotArrays(out["state_idx"], out["acc"], out["num_computed"], out["errors"])


def preprocess(state: SlotArrays, pools: Pools, idx_mapping: jax.Array, query_len: jax.Array,
               is_spec: jax.Array, block_table: jax.Array, *, config: CacheConfig,
               mode: Union[Mode, str] = Mode.PRE_COPY,
               validate: bool = False) -> Tuple[SlotArrays, Pools, JaxBlocks]:
    """Bookkeeping, the pre-copy (pre-copy mode) and the resolution of the kernels' blocks
    for one step.

    ``idx_mapping`` ([rows] int: the slot of each batch row), ``query_len`` ([rows] int),
    ``is_spec`` ([rows] bool/int8/int32), ``block_table`` ([>= num_slots, cols] int);
    ``pools`` maps each state name of ``config`` to its ``[L, NB, *block]`` pool of the
    spec's dtype (other entries are ignored and returned as they are). Returns the new state
    and pools and the rows' blocks (per-row arrays int32, int64 with x64). ``validate``:
    the checked mode (see the module)."""
    mode = check_mode(mode)
    num_blocks = _check(config, pools)
    out = _bookkeeping(K.PREPROCESS_RESOLVE, state, (idx_mapping, query_len, is_spec,
                                                       block_table),
                       {"block_size": config.block_size, "num_spec": config.num_spec,
                        "num_blocks": num_blocks, "mode": mode.value}, validate)
    errors = out["errors"]
    if mode is Mode.PRE_COPY:
        pools, errors = ops.copy_pools(pools, config.copy_kinds(), out, errors)
    state = SlotArrays(out["state_idx"], out["acc"], state.num_computed, errors)
    return state, pools, JaxBlocks(*(out[f] for f in JaxBlocks._fields))


def postprocess(state: SlotArrays, pools: Pools, idx_mapping: jax.Array, query_len: jax.Array,
                is_spec: jax.Array, num_sampled: jax.Array, block_table: jax.Array, *,
                config: CacheConfig, validate: bool = False
                ) -> Tuple[SlotArrays, Pools, jax.Array]:
    """Accept ``num_sampled`` ([rows] int) and save boundary snapshots (other arguments as
    in :func:`preprocess`: the same ``query_len`` and ``is_spec`` it was given, which are
    not checked, docs/semantics.md §1); returns the new state, pools and per-row
    ``cache_col`` ([rows]: the column whose block may enter the prefix cache, -1 if
    none)."""
    num_blocks = _check(config, pools)
    post = _bookkeeping(K.POSTPROCESS, state, (idx_mapping, query_len, is_spec, num_sampled,
                                                 block_table),
                        {"block_size": config.block_size, "num_spec": config.num_spec,
                         "num_blocks": num_blocks}, validate)
    pools, errors = ops.copy_pools(pools, config.copy_kinds(), post, post["errors"])
    state = SlotArrays(state.state_idx, post["acc"], post["num_computed"], errors)
    return state, pools, post["cache_col"]

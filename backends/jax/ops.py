"""The JAX launcher: every operation of :data:`mamba_align.kernels.OPS` as a functional
JAX function, on the same plans as the torch backend.

Nothing here is specific to an operation: :func:`launch` describes the arrays to the op's
plan builder (which validates dtypes and shapes; static under ``jax.jit``) and launches
the plan through :func:`.bridge.launch`. Every function returns all the plan's outputs by
name, in-place arrays (pools, per-slot bookkeeping) among them, updated: jit the caller
with those donated to update them in place on the GPU. Per-row outputs are int64 with
``jax_enable_x64``, int32 otherwise.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from ... import kernels as K
from .bridge import launch as launch_plan

Array = jax.Array


def spec(name: str, x: Any, exact: bool = False) -> K.ArraySpec:
    """What a plan needs to know of array ``x`` (argument ``name``): JAX arrays are
    row-major; the dtype is the one the kernel will see (``int64`` is ``int32`` without
    x64), except a float dtype JAX would narrow (``float64`` without x64, refused as torch
    refuses it) and, with ``exact`` (an array updated in place), any dtype."""
    try:
        want = jax.dtypes.canonicalize_dtype(x.dtype)
        shape = tuple(x.shape)
    except (AttributeError, TypeError):  # (a torch tensor's dtype is not one JAX reads)
        raise TypeError(f"{name} must be a jax or numpy array, got {type(x).__name__}") from None
    if want != x.dtype and (exact or jnp.issubdtype(x.dtype, jnp.floating)):
        want = np.dtype(x.dtype)
    return K.ArraySpec.row_major(shape, want.name)


def _one_device(arrays: Mapping[str, Any]) -> None:
    """Arrays given eagerly must each sit whole on one device, the same for those placed
    there explicitly (committed; JAX moves the others). Under a trace (``jax.jit``) the
    check does nothing: it runs in the launch's traced body, where every value, also an
    array the function closed over, is a tracer, and XLA places them."""
    first = None
    for name, x in arrays.items():
        if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
            continue
        devices = x.devices()
        if len(devices) != 1:
            raise ValueError(f"{name} is placed on {len(devices)} devices (sharded or "
                             "replicated): the ops take each array on one device (under a "
                             "mesh, call them inside shard_map, as examples/serve_tp_jax.py "
                             "does)")
        if not x.committed:
            continue
        if first is None:
            first = name, next(iter(devices))
        elif next(iter(devices)) != first[1]:
            raise ValueError(f"{name} is on {next(iter(devices))}, expected {first[1]} (as "
                             f"{first[0]})")


def _as_jax(name: str, x: Any, in_place: bool) -> Array:
    """``x`` as a JAX array of the dtype the kernel sees. Without ``jax_enable_x64`` JAX
    stores 64-bit values in 32 bits. An array updated in place would come back narrower
    than it went in, so that is refused. An integer read once (ids, counts, ``cu_seqlens``,
    flags) outside the 32-bit range becomes the most negative 32-bit value, not its low
    bits: every integer argument refuses a value below -1 (a flag reads it as nonzero),
    while a wrapped value could name a valid block and a clipped count could pass."""
    want = jax.dtypes.canonicalize_dtype(x.dtype)
    if want != x.dtype and in_place:
        raise TypeError(f"{name} is {x.dtype}, which JAX without jax_enable_x64 keeps as "
                        f"{want}: pass {want} arrays or enable x64")
    if isinstance(x, jax.Array) and want == x.dtype:
        return x
    if want != x.dtype and np.issubdtype(want, np.integer):
        x, info = np.asarray(x), np.iinfo(want)
        x = np.where((x < info.min) | (x > info.max), info.min, x)
    return jnp.asarray(x, want)


def launch(op: K.Op, arrays: Mapping[str, Array], statics: Mapping[str, Any]) -> Dict[str, Array]:
    """Run ``op`` on ``arrays`` (its array parameters by name) with its static options;
    returns every output by name (in-place ones updated). Not differentiable: ``jax.grad``
    through it raises (the kernels define no derivative)."""
    plan = op.plan(**{n: spec(n, a, n in op.mutates) for n, a in arrays.items()}, **statics)
    arrays = {n: _as_jax(n, a, n in op.mutates) for n, a in arrays.items()}
    if plan.skip:  # (no traced body below: checked here unless a trace is visible)
        if not any(isinstance(a, jax.core.Tracer) for a in arrays.values()):
            _one_device(arrays)
        return {n: arrays[plan.aliases[n]] if n in plan.aliases
                else jnp.zeros(plan.out_specs[n].shape,
                               jax.dtypes.canonicalize_dtype(plan.out_specs[n].dtype))
                for n in plan.outputs}
    names = tuple(arrays)

    @jax.custom_jvp
    def run(*values):
        args = dict(zip(names, values))
        _one_device(args)  # (eager only: under a trace the values are tracers)
        for n, d in plan.views.items():  # copies see pools as same-width integers
            if args[n].dtype != jnp.dtype(d):
                args[n] = jax.lax.bitcast_convert_type(args[n], jnp.dtype(d))
        outs = launch_plan(plan, args)
        for out, src in plan.aliases.items():
            if outs[out].dtype != values[names.index(src)].dtype:
                outs[out] = jax.lax.bitcast_convert_type(outs[out],
                                                         values[names.index(src)].dtype)
        return outs

    @run.defjvp
    def _(primals, tangents):
        raise TypeError(f"{op.name} is not differentiable: its kernels define no derivative; "
                        "stop gradients before it (jax.lax.stop_gradient) if it sits inside a "
                        "differentiated function")

    return run(*arrays.values())


def public(op: K.Op):
    """The user-facing JAX function of ``op``: array parameters positional (or by keyword),
    static options keyword-only; returns every output by name."""
    doc = f"Returns a dict of every output by name: ``{'``, ``'.join(op.returns + op.mutates)}``"
    if op.mutates:
        doc += (f"; ``{'``, ``'.join(op.mutates)}`` as updated arrays (updated in place "
                "where the caller donates them under ``jax.jit``)")
    return op.function(lambda arrays, statics: launch(op, arrays, statics), op.name, Array,
                       Dict[str, Array], "\n\n    " + doc + ".")


add_requests = public(K.ADD_REQUESTS)
preprocess_resolve = public(K.PREPROCESS_RESOLVE)
postprocess = public(K.POSTPROCESS)
copy_temporal = public(K.COPY_TEMPORAL)
copy_conv = public(K.COPY_CONV)
conv1d_update = public(K.CONV1D_UPDATE)
gated_delta_rule = public(K.GATED_DELTA_RULE)
gated_delta_rule_fused_gates = public(K.GATED_DELTA_RULE_FUSED_GATES)
selective_state_update = public(K.SELECTIVE_STATE_UPDATE)
linear = public(K.LINEAR)
rms_norm = public(K.RMS_NORM)
rms_norm_gated = public(K.RMS_NORM_GATED)
silu_mul = public(K.SILU_MUL)


def copy_pools(pools: Mapping[str, Array], kinds: Mapping[str, str],
               copy_plan: Mapping[str, Array], errors: Array
               ) -> Tuple[Dict[str, Array], Array]:
    """Apply a step's physical copy plan (``copy_tsrc`` / ``copy_csrc`` / ``copy_dst`` /
    ``copy_bias``, int ``[rows]``) to every pool named in ``kinds``
    (``CacheConfig.copy_kinds()``); rows with ids it cannot trust copy nothing and flag
    ``BAD_COPY``. Returns ``pools`` with those updated and the error flag ``errors``
    (int32 ``[2]``) with the copies' faults ORed in."""
    out = dict(pools)
    for name, op, arrays, statics in K.pool_copies(kinds, pools, copy_plan):
        res = launch(op, dict(arrays, errors=errors), statics)
        out[name], errors = res["pool"], res["errors"]
    return out, errors

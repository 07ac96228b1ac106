"""Functional JAX launchers for the kernels, on the same plans as the torch backend.

Each function validates shapes and dtypes (static under ``jax.jit``), maps its arrays onto
the plan and launches it through :func:`.bridge.launch`. In-place arrays (pools and
per-slot bookkeeping) are returned updated; jit the caller with them donated to update them
in place on the GPU. Per-row outputs are int64 with ``jax_enable_x64``, int32 otherwise.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp

from ... import kernels as K
from .bridge import launch

Array = jax.Array
INDEX_DTYPES = (jnp.dtype(jnp.int32), jnp.dtype(jnp.int64))
_BITS = {1: jnp.int8, 2: jnp.int16, 4: jnp.int32, 8: jnp.int64}


def row_dtype() -> type:
    """The dtype of per-row outputs: int64 with ``jax_enable_x64``, int32 otherwise."""
    return jnp.int64 if jax.config.jax_enable_x64 else jnp.int32


def index_array(name: str, x: Array, shape: Sequence[Optional[int]], flags: bool = False) -> Array:
    """Check a JAX integer array (``flags``: bool/int8/int32 also) of the given shape."""
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(f"{name} must be a jax array, got {type(x).__name__}")
    ok = INDEX_DTYPES + ((jnp.dtype(jnp.bool_), jnp.dtype(jnp.int8)) if flags else ())
    if jnp.dtype(x.dtype) not in ok:
        raise TypeError(f"{name} must have dtype {'/'.join(d.name for d in ok)}, got {x.dtype}")
    if len(x.shape) != len(shape) or any(w is not None and g != w for g, w in zip(x.shape, shape)):
        want = "[" + ", ".join("*" if w is None else str(w) for w in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(x.shape)}")
    return x


def _pool_bits(name: str, pool, block_shape: Sequence[int]):
    if not hasattr(pool, "dtype") or len(pool.shape) != 2 + len(block_shape) \
            or tuple(pool.shape[2:]) != tuple(block_shape):
        raise ValueError(f"{name} must have shape [L, NB, {', '.join(map(str, block_shape))}], "
                         f"got {list(getattr(pool, 'shape', []))}")
    size = jnp.dtype(pool.dtype).itemsize
    if jnp.dtype(pool.dtype).kind in "bc":  # lax.bitcast_convert_type refuses them
        raise TypeError(f"{name} dtype {pool.dtype} is not supported by the JAX backend "
                        "(bit copies need a numeric dtype: float or int)")
    if size not in _BITS:
        raise TypeError(f"{name} has unsupported element size {size}")
    return jax.lax.bitcast_convert_type(pool, _BITS[size]) if jnp.dtype(pool.dtype) != _BITS[size] \
        else pool


def _from_bits(bits, like):
    return bits if bits.dtype == like.dtype else jax.lax.bitcast_convert_type(bits, like.dtype)


def _rows(n: int, *shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((n,) + shape, row_dtype())


def _slots(state_idx, acc, num_computed):
    index_array("state_idx", state_idx, (None,))
    n = state_idx.shape[0]
    index_array("acc", acc, (n,))
    index_array("num_computed", num_computed, (n,))
    return n


def _table(block_table, num_slots: int) -> Dict[str, int]:
    index_array("block_table", block_table, (None, None))
    shape = tuple(int(x) for x in block_table.shape)
    return K.table_scalars(shape, shape[1], num_slots)  # JAX arrays are row-major


def _row_major(shape) -> Tuple[int, ...]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= int(size)
    return tuple(reversed(strides))


def _flags(name: str, x, rows: int):
    """Check ``is_spec`` (bool or int: the kernels treat any nonzero value as true, as in
    the torch backend). Passed as is: a conversion would cost one more XLA kernel."""
    return index_array(name, x, (rows,), flags=True)


def add_requests(state_idx: Array, acc: Array, num_computed: Array, slots: Array,
                 num_computed_new: Array, block_size: int) -> Tuple[Array, Array, Array]:
    """Seed ``slots`` ([n]) with ``num_computed_new`` ([n]); returns the three per-slot
    arrays updated."""
    K.check_step_scalars(block_size)
    n_slots = _slots(state_idx, acc, num_computed)
    index_array("slots", slots, (None,))
    n = slots.shape[0]
    index_array("num_computed_new", num_computed_new, (n,))
    if n == 0:
        return state_idx, acc, num_computed
    out = launch(K.plan_add_requests(n),
                 {"slots": slots, "num_computed_new": num_computed_new, "state_idx": state_idx,
                  "acc": acc, "num_computed": num_computed},
                 {"num_new": n, "num_slots": n_slots, "block_size": block_size}, {})
    return out["state_idx"], out["acc"], out["num_computed"]


def preprocess(state_idx: Array, acc: Array, num_computed: Array, idx_mapping: Array,
               query_len: Array, block_table: Array, block_size: int) -> Dict[str, Array]:
    """SPEC.md §2 steps 1-2: returns ``state_idx``/``acc`` updated and per-row ``src_col``,
    ``src_off``, ``new_col`` and the pre-copy plan ``copy_tsrc/csrc/dst/shift``."""
    K.check_step_scalars(block_size)
    n_slots = _slots(state_idx, acc, num_computed)
    index_array("idx_mapping", idx_mapping, (None,))
    rows = idx_mapping.shape[0]
    index_array("query_len", query_len, (rows,))
    scal = _table(block_table, n_slots)
    names = ("src_col", "src_off", "new_col", "copy_tsrc", "copy_csrc", "copy_dst", "copy_shift")
    if rows == 0:
        empty = jnp.zeros((0,), row_dtype())
        return dict({n: empty for n in names}, state_idx=state_idx, acc=acc)
    return launch(K.plan_preprocess(rows),
                  {"idx_mapping": idx_mapping, "query_len": query_len, "block_table": block_table,
                   "state_idx": state_idx, "acc": acc, "num_computed": num_computed},
                  dict(scal, num_rows=rows, block_size=block_size),
                  {n: _rows(rows) for n in names})


def resolve(idx_mapping: Array, query_len: Array, is_spec: Array, block_table: Array,
            src_col: Array, src_off: Array, new_col: Array, acc: Array, num_spec: int,
            mode: str) -> Tuple[Array, ...]:
    """SPEC.md §4 slots: ``(temporal_read, conv_read, conv_read_off, temporal_write
    [rows, 1 + S], conv_write)``."""
    K.check_step_scalars(1, num_spec)
    index_array("idx_mapping", idx_mapping, (None,))
    rows = idx_mapping.shape[0]
    index_array("query_len", query_len, (rows,))
    is_spec = _flags("is_spec", is_spec, rows)
    for name, t in (("src_col", src_col), ("src_off", src_off), ("new_col", new_col)):
        index_array(name, t, (rows,))
    index_array("acc", acc, (None,))
    scal = _table(block_table, acc.shape[0])
    plan = K.plan_resolve(max(rows, 1), num_spec, mode)
    if rows == 0:
        e = jnp.zeros((0,), row_dtype())
        return e, e, e, jnp.zeros((0, 1 + num_spec), row_dtype()), e
    specs = {"temporal_read": _rows(rows), "conv_read": _rows(rows), "conv_read_off": _rows(rows),
             "temporal_write": _rows(rows, 1 + num_spec), "conv_write": _rows(rows)}
    out = launch(plan, {"idx_mapping": idx_mapping, "query_len": query_len,
                        "is_spec": is_spec, "block_table": block_table,
                        "src_col": src_col, "src_off": src_off, "new_col": new_col, "acc": acc},
                 dict(scal, num_rows=rows), specs)
    return tuple(out[n] for n in plan.outputs)


def preprocess_resolve(state_idx: Array, acc: Array, num_computed: Array, idx_mapping: Array,
                       query_len: Array, is_spec: Array, block_table: Array, block_size: int,
                       num_spec: int, mode: str) -> Dict[str, Array]:
    """:func:`preprocess` then :func:`resolve` in one kernel launch: the outputs of both,
    by name (``state_idx``/``acc`` updated)."""
    K.check_step_scalars(block_size, num_spec)
    n_slots = _slots(state_idx, acc, num_computed)
    index_array("idx_mapping", idx_mapping, (None,))
    rows = idx_mapping.shape[0]
    index_array("query_len", query_len, (rows,))
    is_spec = _flags("is_spec", is_spec, rows)
    scal = _table(block_table, n_slots)
    plan = K.plan_preprocess_resolve(max(rows, 1), num_spec, mode)
    specs = {n: _rows(rows) for n in plan.outputs if n not in plan.aliases}
    specs["temporal_write"] = _rows(rows, 1 + num_spec)
    if rows == 0:
        return dict({n: jnp.zeros(v.shape, v.dtype) for n, v in specs.items()},
                    state_idx=state_idx, acc=acc)
    return launch(plan, {"idx_mapping": idx_mapping, "query_len": query_len,
                         "is_spec": is_spec, "block_table": block_table,
                         "state_idx": state_idx, "acc": acc, "num_computed": num_computed},
                  dict(scal, num_rows=rows, block_size=block_size), specs)


def postprocess(state_idx: Array, acc: Array, num_computed: Array, idx_mapping: Array,
                query_len: Array, is_spec: Array, num_sampled: Array, block_table: Array,
                block_size: int) -> Dict[str, Array]:
    """SPEC.md §2 steps 5-7: returns ``acc``/``num_computed`` updated, ``cache_col`` and the
    post-process copy plan ``copy_tsrc/csrc/dst/shift``."""
    K.check_step_scalars(block_size)
    n_slots = _slots(state_idx, acc, num_computed)
    index_array("idx_mapping", idx_mapping, (None,))
    rows = idx_mapping.shape[0]
    index_array("query_len", query_len, (rows,))
    is_spec = _flags("is_spec", is_spec, rows)
    index_array("num_sampled", num_sampled, (rows,))
    scal = _table(block_table, n_slots)
    names = ("cache_col", "copy_tsrc", "copy_csrc", "copy_dst", "copy_shift")
    if rows == 0:
        empty = jnp.zeros((0,), row_dtype())
        return dict({n: empty for n in names}, acc=acc, num_computed=num_computed)
    return launch(K.plan_postprocess(rows),
                  {"idx_mapping": idx_mapping, "query_len": query_len,
                   "is_spec": is_spec, "num_sampled": num_sampled,
                   "block_table": block_table, "state_idx": state_idx, "acc": acc,
                   "num_computed": num_computed},
                  dict(scal, num_rows=rows, block_size=block_size),
                  {n: _rows(rows) for n in names})


def copy_temporal(pool: Array, src: Array, dst: Array) -> Array:
    """Returns ``pool`` with ``pool[:, dst] = pool[:, src]`` (bit copy) on rows with valid
    ids (``0 <= id < NB``, not the same block); other rows copy nothing. ``pool``
    ``[L, NB, ...]`` of any numeric dtype; ``src``/``dst`` int32/int64 ``[rows]``."""
    bits = _pool_bits("pool", pool, tuple(pool.shape[2:]))
    index_array("src", src, (None,))
    index_array("dst", dst, (src.shape[0],))
    if src.shape[0] == 0 or pool.size == 0:
        return pool
    scal = K.pool_scalars(tuple(pool.shape), _row_major(pool.shape))
    out = launch(K.plan_copy_temporal(src.shape[0], scal["num_layers"], scal["block_numel"],
                                      jnp.dtype(pool.dtype).itemsize, K.pool_align(scal)),
                 {"pool": bits, "src": src, "dst": dst}, dict(scal, num_rows=src.shape[0]), {})
    return _from_bits(out["pool"], pool)


def copy_conv(pool: Array, src: Array, dst: Array, shift: Array, layout: str) -> Array:
    """Returns ``pool`` with the conv window of ``src`` shifted left by ``shift`` rows into
    ``dst`` (memmove-safe in place). ``pool`` ``[L, NB, W, D]`` ("SD") or ``[L, NB, D, W]``."""
    if layout not in ("SD", "DS"):
        raise ValueError(f"layout must be 'SD' or 'DS', got {layout!r}")
    if len(pool.shape) != 4:
        raise ValueError(f"pool must be [L, NB, W, D] or [L, NB, D, W], got {list(pool.shape)}")
    bits = _pool_bits("pool", pool, tuple(pool.shape[2:]))
    index_array("src", src, (None,))
    index_array("dst", dst, (src.shape[0],))
    index_array("shift", shift, (src.shape[0],))
    if src.shape[0] == 0 or pool.size == 0:
        return pool
    scal = K.pool_scalars(tuple(pool.shape), _row_major(pool.shape), layout)
    out = launch(K.plan_copy_conv(src.shape[0], scal["num_layers"], scal["width"], scal["dim"],
                                  jnp.dtype(pool.dtype).itemsize, layout,
                                  K.pool_align(scal, layout)),
                 {"pool": bits, "src": src, "dst": dst, "shift": shift}, scal, {})
    return _from_bits(out["pool"], pool)

"""Thin torch launchers for the kernels, registered as ``torch.library`` custom ops
(``torch.ops.mamba_align.*``) with fake implementations, so they work eagerly, under
CUDA-graph capture and under ``torch.compile``.

Each launcher validates dtypes, shapes, devices and layouts (never values: that would
synchronise), builds the plan from ``mamba_align.kernels`` and launches it. :func:`call`
runs the plain Python launcher when not compiling: the custom-op dispatcher costs about
25 us of host time per call (measured on the H200 host), which an eager step need not pay.
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from ... import kernels as K
from .checks import flag_tensor, index_tensor, pool_tensor, same_device


EAGER = {}  # op name -> the plain launcher behind the custom op


def _op(name: str, mutates=()):
    """Register ``fn`` as ``torch.ops.mamba_align.<name>`` and remember the plain function."""

    def wrap(fn):
        EAGER[name] = fn
        return torch.library.custom_op(f"mamba_align::{name}", fn, mutates_args=mutates)

    return wrap


def call(name: str, *args):
    """Run op ``name``: through the dispatcher under ``torch.compile``, directly otherwise."""
    if torch.compiler.is_compiling():
        return getattr(torch.ops.mamba_align, name)(*args)
    return EAGER[name](*args)


def _launch(plan: K.LaunchPlan, arrays, scalars) -> None:
    plan.kernel[plan.grid](*plan.args(arrays, scalars), **plan.constexprs,
                           num_warps=plan.num_warps)


def _rows_like(ref: torch.Tensor, n: int, *shape: int) -> torch.Tensor:
    return torch.empty((n,) + shape, dtype=torch.int64, device=ref.device)


def _slot_arrays(state_idx, acc, num_computed):
    dev = state_idx.device
    n = state_idx.shape[0] if isinstance(state_idx, torch.Tensor) else None
    index_tensor("state_idx", state_idx, dev, (None,))
    index_tensor("acc", acc, dev, (n,))
    index_tensor("num_computed", num_computed, dev, (n,))
    return dev


def _block_table(bt, dev, num_slots: int):
    index_tensor("block_table", bt, dev, (None, None))
    return K.table_scalars(tuple(bt.shape), bt.stride(0), num_slots)


# -- add_requests ------------------------------------------------------------------------
@_op("add_requests_", ("state_idx", "acc", "num_computed"))
def add_requests_(state_idx: torch.Tensor, acc: torch.Tensor, num_computed: torch.Tensor,
                  slots: torch.Tensor, num_computed_new: torch.Tensor, block_size: int) -> None:
    """Seed slots ``slots`` ([n]) with ``num_computed_new`` ([n]) computed tokens in place:
    ``state_idx = (num_computed - 1) // B``, ``acc = 1``. Per-slot arrays are [num_slots]."""
    K.check_step_scalars(block_size)
    dev = _slot_arrays(state_idx, acc, num_computed)
    index_tensor("slots", slots, dev, (None,))
    index_tensor("num_computed_new", num_computed_new, dev, (slots.shape[0],))
    n = slots.shape[0]
    if n == 0:
        return
    plan = K.plan_add_requests(n)
    _launch(plan, {"slots": slots, "num_computed_new": num_computed_new, "state_idx": state_idx,
                   "acc": acc, "num_computed": num_computed},
            {"num_new": n, "num_slots": state_idx.shape[0], "block_size": block_size})


@add_requests_.register_fake
def _(state_idx, acc, num_computed, slots, num_computed_new, block_size):
    return None


# -- preprocess ---------------------------------------------------------------------------
@_op("preprocess_", ("state_idx", "acc"))
def preprocess_(state_idx: torch.Tensor, acc: torch.Tensor, num_computed: torch.Tensor,
                idx_mapping: torch.Tensor, query_len: torch.Tensor, block_table: torch.Tensor,
                block_size: int) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """SPEC.md §2 steps 1-2 on the device. Updates ``state_idx`` / ``acc`` in place and
    returns int64 ``[rows]`` tensors ``[src_col, src_off, new_col, copy_tsrc, copy_csrc,
    copy_dst, copy_shift]`` (the last four: the pre-copy's physical plan)."""
    K.check_step_scalars(block_size)
    dev = _slot_arrays(state_idx, acc, num_computed)
    rows = idx_mapping.shape[0] if isinstance(idx_mapping, torch.Tensor) else None
    index_tensor("idx_mapping", idx_mapping, dev, (None,))
    index_tensor("query_len", query_len, dev, (rows,))
    scal = _block_table(block_table, dev, state_idx.shape[0])
    outs = [_rows_like(idx_mapping, rows) for _ in range(7)]
    if rows:
        names = ("src_col", "src_off", "new_col", "copy_tsrc", "copy_csrc", "copy_dst", "copy_shift")
        arrays = dict(zip(names, outs), idx_mapping=idx_mapping, query_len=query_len,
                      block_table=block_table, state_idx=state_idx, acc=acc,
                      num_computed=num_computed)
        _launch(K.plan_preprocess(rows), arrays,
                dict(scal, num_rows=rows, block_size=block_size))
    return tuple(outs)


@preprocess_.register_fake
def _(state_idx, acc, num_computed, idx_mapping, query_len, block_table, block_size):
    return tuple(idx_mapping.new_empty(idx_mapping.shape, dtype=torch.int64) for _ in range(7))


# -- resolve ------------------------------------------------------------------------------
@_op("resolve", ())
def resolve(idx_mapping: torch.Tensor, query_len: torch.Tensor, is_spec: torch.Tensor,
            block_table: torch.Tensor, src_col: torch.Tensor, src_off: torch.Tensor,
            new_col: torch.Tensor, acc: torch.Tensor, num_spec: int,
            copy_free: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """SPEC.md §4 slots: int64 ``[temporal_read [rows], conv_read [rows], conv_read_off
    [rows], temporal_write [rows, 1 + S], conv_write [rows]]``."""
    K.check_step_scalars(1, num_spec)
    dev = idx_mapping.device
    rows = idx_mapping.shape[0]
    index_tensor("idx_mapping", idx_mapping, dev, (None,))
    index_tensor("query_len", query_len, dev, (rows,))
    flag_tensor("is_spec", is_spec, rows, dev)
    for name, t in (("src_col", src_col), ("src_off", src_off), ("new_col", new_col)):
        index_tensor(name, t, dev, (rows,))
    index_tensor("acc", acc, dev, (None,))
    scal = _block_table(block_table, dev, acc.shape[0])
    outs = [_rows_like(idx_mapping, rows) for _ in range(3)]
    outs += [_rows_like(idx_mapping, rows, 1 + num_spec), _rows_like(idx_mapping, rows)]
    if rows:
        mode = "copy-free" if copy_free else "pre-copy"
        names = ("temporal_read", "conv_read", "conv_read_off", "temporal_write", "conv_write")
        arrays = dict(zip(names, outs), idx_mapping=idx_mapping, query_len=query_len,
                      is_spec=is_spec, block_table=block_table, src_col=src_col,
                      src_off=src_off, new_col=new_col, acc=acc)
        _launch(K.plan_resolve(rows, num_spec, mode), arrays, dict(scal, num_rows=rows))
    return tuple(outs)


@resolve.register_fake
def _(idx_mapping, query_len, is_spec, block_table, src_col, src_off, new_col, acc, num_spec,
      copy_free):
    rows = idx_mapping.shape[0]
    e = lambda *s: idx_mapping.new_empty((rows,) + s, dtype=torch.int64)  # noqa: E731
    return e(), e(), e(), e(1 + num_spec), e()


# -- preprocess + resolve (one launch) ----------------------------------------------------
@_op("preprocess_resolve_", ("state_idx", "acc"))
def preprocess_resolve_(state_idx: torch.Tensor, acc: torch.Tensor, num_computed: torch.Tensor,
                        idx_mapping: torch.Tensor, query_len: torch.Tensor,
                        is_spec: torch.Tensor, block_table: torch.Tensor, block_size: int,
                        num_spec: int, copy_free: bool) -> Tuple[(Tensor,) * 12]:
    """``preprocess_`` then ``resolve`` in one kernel launch (the runner's step). Updates
    ``state_idx`` / ``acc`` in place and returns the 7 tensors of ``preprocess_`` followed
    by the 5 of ``resolve``."""
    K.check_step_scalars(block_size, num_spec)
    dev = _slot_arrays(state_idx, acc, num_computed)
    rows = idx_mapping.shape[0] if isinstance(idx_mapping, torch.Tensor) else None
    index_tensor("idx_mapping", idx_mapping, dev, (None,))
    index_tensor("query_len", query_len, dev, (rows,))
    flag_tensor("is_spec", is_spec, rows, dev)
    scal = _block_table(block_table, dev, state_idx.shape[0])
    plan = K.plan_preprocess_resolve(max(rows, 1), num_spec,
                                     "copy-free" if copy_free else "pre-copy")
    outs = {n: _rows_like(idx_mapping, rows, *((1 + num_spec,) if n == "temporal_write" else ()))
            for n in plan.outputs if n not in plan.aliases}
    if rows:
        arrays = dict(outs, idx_mapping=idx_mapping, query_len=query_len, is_spec=is_spec,
                      block_table=block_table, state_idx=state_idx, acc=acc,
                      num_computed=num_computed)
        _launch(plan, arrays, dict(scal, num_rows=rows, block_size=block_size))
    return tuple(outs.values())


@preprocess_resolve_.register_fake
def _(state_idx, acc, num_computed, idx_mapping, query_len, is_spec, block_table, block_size,
      num_spec, copy_free):
    rows = idx_mapping.shape[0]
    e = lambda *s: idx_mapping.new_empty((rows,) + s, dtype=torch.int64)  # noqa: E731
    return tuple(e() for _ in range(10)) + (e(1 + num_spec), e())


# -- postprocess --------------------------------------------------------------------------
@_op("postprocess_", ("acc", "num_computed"))
def postprocess_(state_idx: torch.Tensor, acc: torch.Tensor, num_computed: torch.Tensor,
                 idx_mapping: torch.Tensor, query_len: torch.Tensor, is_spec: torch.Tensor,
                 num_sampled: torch.Tensor, block_table: torch.Tensor,
                 block_size: int) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """SPEC.md §2 steps 5-7 on the device: accept, then the boundary decision. Updates
    ``acc`` / ``num_computed`` in place; returns int64 ``[rows]`` tensors ``[cache_col,
    copy_tsrc, copy_csrc, copy_dst, copy_shift]``."""
    K.check_step_scalars(block_size)
    dev = _slot_arrays(state_idx, acc, num_computed)
    rows = idx_mapping.shape[0]
    index_tensor("idx_mapping", idx_mapping, dev, (None,))
    index_tensor("query_len", query_len, dev, (rows,))
    flag_tensor("is_spec", is_spec, rows, dev)
    index_tensor("num_sampled", num_sampled, dev, (rows,))
    scal = _block_table(block_table, dev, state_idx.shape[0])
    outs = [_rows_like(idx_mapping, rows) for _ in range(5)]
    if rows:
        names = ("cache_col", "copy_tsrc", "copy_csrc", "copy_dst", "copy_shift")
        arrays = dict(zip(names, outs), idx_mapping=idx_mapping, query_len=query_len,
                      is_spec=is_spec, num_sampled=num_sampled, block_table=block_table,
                      state_idx=state_idx, acc=acc, num_computed=num_computed)
        _launch(K.plan_postprocess(rows), arrays,
                dict(scal, num_rows=rows, block_size=block_size))
    return tuple(outs)


@postprocess_.register_fake
def _(state_idx, acc, num_computed, idx_mapping, query_len, is_spec, num_sampled, block_table,
      block_size):
    return tuple(idx_mapping.new_empty(idx_mapping.shape, dtype=torch.int64) for _ in range(5))


# -- copies --------------------------------------------------------------------------------
@_op("copy_temporal_", ("pool",))
def copy_temporal_(pool: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """In place, for every row with valid ``src`` and ``dst`` (``0 <= id < NB``, not the
    same block): ``pool[:, dst] = pool[:, src]`` (bit copy); other rows copy nothing.
    ``pool`` is ``[L, NB, ...]`` (any dtype, contiguous inner block); ``src``/``dst`` int
    ``[rows]`` physical block ids."""
    bits = pool_tensor("pool", pool, tuple(pool.shape[2:]))
    dev = same_device(pool, src, dst)
    index_tensor("src", src, dev, (None,))
    index_tensor("dst", dst, dev, (src.shape[0],))
    if src.shape[0] == 0 or pool.numel() == 0:
        return
    scal = K.pool_scalars(tuple(bits.shape), bits.stride())
    plan = K.plan_copy_temporal(src.shape[0], scal["num_layers"], scal["block_numel"],
                                pool.element_size(), K.pool_align(scal))
    _launch(plan, {"pool": bits, "src": src, "dst": dst}, dict(scal, num_rows=src.shape[0]))


@copy_temporal_.register_fake
def _(pool, src, dst):
    return None


@_op("copy_conv_", ("pool",))
def copy_conv_(pool: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, shift: torch.Tensor,
               layout: str) -> None:
    """In place, for every row with valid ids and ``0 <= shift < W`` (and not a same-block
    copy with no shift): the conv window of ``src`` shifted left by ``shift`` rows into
    ``dst`` (memmove-safe when ``src == dst``); other rows copy nothing. ``pool`` is
    ``[L, NB, W, D]`` ("SD") or ``[L, NB, D, W]`` ("DS")."""
    if layout not in ("SD", "DS"):
        raise ValueError(f"layout must be 'SD' or 'DS', got {layout!r}")
    if pool.dim() != 4:
        raise ValueError(f"pool must be [L, NB, W, D] or [L, NB, D, W], got {list(pool.shape)}")
    bits = pool_tensor("pool", pool, tuple(pool.shape[2:]))
    dev = same_device(pool, src, dst, shift)
    index_tensor("src", src, dev, (None,))
    index_tensor("dst", dst, dev, (src.shape[0],))
    index_tensor("shift", shift, dev, (src.shape[0],))
    if src.shape[0] == 0 or pool.numel() == 0:
        return
    scal = K.pool_scalars(tuple(bits.shape), bits.stride(), layout)
    plan = K.plan_copy_conv(src.shape[0], scal["num_layers"], scal["width"], scal["dim"],
                            pool.element_size(), layout, K.pool_align(scal, layout))
    _launch(plan, {"pool": bits, "src": src, "dst": dst, "shift": shift}, scal)


@copy_conv_.register_fake
def _(pool, src, dst, shift, layout):
    return None


def copy_block_plan_(pools, kinds, tsrc: torch.Tensor, csrc: torch.Tensor, dst: torch.Tensor,
                     shift: torch.Tensor) -> None:
    """Apply one physical copy plan to every pool: ``kinds[name]`` is ``"temporal"``,
    ``"SD"`` or ``"DS"``."""
    for name, pool in pools.items():
        kind = kinds[name]
        if kind == "temporal":
            call("copy_temporal_", pool, tsrc, dst)
        else:
            call("copy_conv_", pool, csrc, dst, shift, kind)

"""Reference of the state-block copies on NumPy pools (docs/semantics.md §2 ``copy_block``).

A copy is resolved per batch row into physical blocks by :func:`copy_plan`, then applied
to each pool by :func:`apply_copy`:

* temporal: ``pool[:, dst] = pool[:, tsrc]`` (the accepted candidate);
* conv SD: ``pool[:, dst, 0 : W - bias] = pool[:, csrc, bias : W]``, rows
  ``W - bias ...`` untouched; DS: the same along the last axis. ``csrc == dst`` is a
  left shift in place with ``memmove`` semantics.

A row whose source (or destination) is -1 does nothing. Ids below -1, ids ``>= NB`` on
rows that copy and biases outside ``[0, W)`` raise here; the kernels skip such rows and
flag them (:func:`copy_faults`). This is the oracle the copy kernels equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np

from .bookkeeping import PostprocessPlan, PreprocessPlan
from .checks import bool_array, index_array, instance
from .config import CacheConfig, ConvSpec
from .faults import Fault
from .resolve import gather_columns


@dataclass(frozen=True)
class CopyPlan:
    """Physical blocks per batch row, int64 ``[rows]``; -1 source = no copy."""

    tsrc: np.ndarray
    csrc: np.ndarray
    dst: np.ndarray
    bias: np.ndarray  # the accepted-token bias: conv rows dropped from the front

    @property
    def active(self) -> np.ndarray:
        """bool ``[rows]``: rows that copy."""
        return (self.csrc >= 0) & (self.dst >= 0)


def copy_plan(block_table, idx_mapping, src_col, dst_col, bias) -> CopyPlan:
    """Resolve ``copy_block(src_col, dst_col, bias)`` per row into physical blocks.

    All arguments but ``block_table`` are int ``[rows]``; a row with ``src_col < 0`` (or a
    skipped row) does not copy. Temporal source is ``bt[r, src_col + bias]``, conv source
    ``bt[r, src_col]``, destination ``bt[r, dst_col]``.
    """
    idx = index_array("idx_mapping", idx_mapping, low=-1)
    rows = idx.shape[0]
    src = index_array("src_col", src_col, shape=(rows,), low=-1)
    dst = index_array("dst_col", dst_col, shape=(rows,), low=-1)
    b = index_array("bias", bias, shape=(rows,), low=0)
    on = (idx >= 0) & (src >= 0)
    if np.any(on & (dst < 0)):
        raise ValueError("dst_col must be >= 0 on rows that copy")
    off = np.full(rows, -1, np.int64)
    return CopyPlan(
        tsrc=gather_columns(block_table, idx, np.where(on, src + b, off)),
        csrc=gather_columns(block_table, idx, np.where(on, src, off)),
        dst=gather_columns(block_table, idx, np.where(on, dst, off)),
        bias=np.where(on, b, 0),
    )


def precopy_plan(block_table, idx_mapping, plan: PreprocessPlan) -> CopyPlan:
    """The pre-copy of docs/semantics.md §2 step 2: crossing rows copy ``src_col -> run_col`` with
    bias ``src_bias``."""
    if not isinstance(plan, PreprocessPlan):
        raise TypeError(f"plan must be a PreprocessPlan, got {type(plan).__name__}")
    rows = index_array("idx_mapping", idx_mapping, low=-1).shape[0]
    crossing = bool_array("plan.crossing", plan.crossing, rows)
    src = np.where(crossing, index_array("plan.src_col", plan.src_col, shape=(rows,)), -1)
    return copy_plan(block_table, idx_mapping, src, plan.run_col, plan.src_bias)


def postprocess_copy_plan(block_table, idx_mapping, plan: PostprocessPlan) -> CopyPlan:
    """The post-process copy of docs/semantics.md §2 step 6: ``run_col -> dest`` with ``bias``."""
    if not isinstance(plan, PostprocessPlan):
        raise TypeError(f"plan must be a PostprocessPlan, got {type(plan).__name__}")
    rows = index_array("idx_mapping", idx_mapping, low=-1).shape[0]
    copy = bool_array("plan.copy", plan.copy, rows)
    src = np.where(copy, index_array("plan.run_col", plan.run_col, shape=(rows,)), -1)
    return copy_plan(block_table, idx_mapping, src, plan.dest, plan.bias)


def copy_faults(src, dst, num_blocks: int, bias=None, width: Optional[int] = None) -> np.ndarray:
    """The rows a copy kernel does not trust (int64 ``[rows]``: ``Fault.BAD_COPY`` or 0),
    the non-raising reference of the copy ops on physical ids: a source or destination
    block below -1 or ``>= num_blocks``, or (conv copies: ``bias`` and the window
    ``width`` given) valid ids with a bias outside ``[0, width)``. Such a row copies
    nothing."""
    src, dst = (np.asarray(x, np.int64).reshape(-1) for x in (src, dst))
    if src.shape != dst.shape:
        raise ValueError(f"src and dst must have one length, got {src.shape} and {dst.shape}")
    bad = (src < -1) | (src >= num_blocks) | (dst < -1) | (dst >= num_blocks)
    if bias is not None:
        if width is None:
            raise ValueError("a conv copy's faults need the window width")
        b = np.asarray(bias, np.int64).reshape(-1)
        bad |= (src >= 0) & (dst >= 0) & ~bad & ((b < 0) | (b >= width))
    return np.where(bad, int(Fault.BAD_COPY), 0).astype(np.int64)


def _check_disjoint(plan: CopyPlan, src: np.ndarray) -> None:
    """Rows copy in parallel on the GPU: no row may write a block another row touches."""
    on = plan.active
    dst = plan.dst[on]
    if dst.size != np.unique(dst).size:
        raise ValueError("two rows of the copy plan write the same destination block")
    rows = np.flatnonzero(on)
    for i, r in enumerate(rows):
        others = np.delete(src[on], i)
        if np.any(others == plan.dst[r]):
            raise ValueError(f"row {int(r)} writes block {int(plan.dst[r])} that another row reads")


def _check_pool(name: str, pool: np.ndarray, ndim_min: int) -> None:
    if not isinstance(pool, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array, got {type(pool).__name__}")
    if pool.ndim < ndim_min:
        raise ValueError(f"{name} must be [L, NB, ...] with >= {ndim_min} dims, got {pool.shape}")


def _check_blocks(plan: CopyPlan, num_blocks: int, src: np.ndarray) -> None:
    for name, ids in (("source", src), ("destination", plan.dst)):
        if ids.size and ids.min() < -1:
            raise ValueError(f"copy {name} block {int(ids.min())} < -1 (-1 = no copy)")
    on = plan.active
    for name, ids in (("source", src[on]), ("destination", plan.dst[on])):
        if ids.size and ids.max() >= num_blocks:
            raise ValueError(f"copy {name} block {int(ids.max())} >= pool blocks {num_blocks}")


def apply_temporal_copy(pool: np.ndarray, plan: CopyPlan) -> None:
    """In place: ``pool[:, dst] = pool[:, tsrc]`` on active rows. ``pool`` is
    ``[L, NB, ...]`` of any dtype."""
    _check_pool("pool", pool, 2)
    instance("plan", plan, CopyPlan)
    _check_blocks(plan, pool.shape[1], plan.tsrc)
    _check_disjoint(plan, plan.tsrc)
    on = plan.active & (plan.tsrc >= 0)
    src = pool[:, plan.tsrc[on]].copy()  # all rows read before any writes
    pool[:, plan.dst[on]] = src


def apply_conv_copy(pool: np.ndarray, plan: CopyPlan, layout: str) -> None:
    """In place, shift-copy the conv window on active rows. ``pool`` is ``[L, NB, W, D]``
    (``"SD"``) or ``[L, NB, D, W]`` (``"DS"``); ``0 <= bias < W``."""
    _check_pool("pool", pool, 4)
    instance("plan", plan, CopyPlan)
    if layout not in ("SD", "DS"):
        raise ValueError(f"layout must be 'SD' or 'DS', got {layout!r}")
    _check_blocks(plan, pool.shape[1], plan.csrc)
    _check_disjoint(plan, plan.csrc)
    axis = 2 if layout == "SD" else 3
    w = pool.shape[axis]
    on = np.flatnonzero(plan.active)
    bad = [int(b) for b in plan.bias[on] if not 0 <= b < w]
    if bad:
        raise ValueError(f"bias must be in [0, W = {w}), got {bad[0]}")
    view = pool if layout == "SD" else np.swapaxes(pool, 2, 3)
    reads = [view[:, plan.csrc[r], plan.bias[r]:].copy() for r in on]  # memmove-safe
    for r, rows in zip(on, reads):
        view[:, plan.dst[r], : w - plan.bias[r]] = rows


def apply_copy(pools: Mapping[str, np.ndarray], config: CacheConfig, plan: CopyPlan) -> None:
    """Apply ``plan`` in place to every pool named in ``config.states``."""
    if not isinstance(config, CacheConfig):
        raise TypeError(f"config must be a CacheConfig, got {type(config).__name__}")
    instance("pools", pools, Mapping)
    instance("plan", plan, CopyPlan)
    for name, spec in config.states.items():
        if name not in pools:
            raise KeyError(f"pools has no entry {name!r}")
        pool = pools[name]
        _check_pool(f"pools[{name!r}]", pool, 2)
        want = spec.block_shape(config.num_spec)
        if tuple(pool.shape[2:]) != want or pool.shape[0] != config.num_layers:
            raise ValueError(
                f"pools[{name!r}] must be [L={config.num_layers}, NB, *{want}], got {pool.shape}"
            )
        if isinstance(spec, ConvSpec):
            apply_conv_copy(pool, plan, spec.layout)
        else:
            apply_temporal_copy(pool, plan)

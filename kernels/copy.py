"""State-block copy kernels (docs/semantics.md §2 ``copy_block``), shared by the pre-copy
and the post-process: both produce a physical copy plan per batch row (``copy_tsrc``,
``copy_csrc``, ``copy_dst``, ``copy_bias``; -1 source = no copy) and launch these kernels
on it, one launch per pool (:func:`pool_copies`). A row whose ids cannot be trusted copies
nothing and ORs ``BAD_COPY`` into the error flag (kernels/rows.py); the reference of which
rows those are is :func:`mamba_align.core.copy_ref.copy_faults`.

Pools are ``[L, NB, *block]`` with explicit layer and block strides (in elements) and a
contiguous inner block. The plans have the backends view pools as same-width integers, so
a copy is a bit copy whatever the dtype. All offsets are int64.
"""

from __future__ import annotations

import functools
from typing import Any, Iterator, Mapping, Tuple

import triton
import triton.language as tl

from .bookkeeping import ROW, check_errors
from .plan import (MAX_GRID_YZ, ArraySpec, LaunchPlan, Op, Static, bits_dtype, cdiv, check_array,
                   check_pool, dtype_bits, largest_align, next_pow2, pool_scalars)
from .rows import BAD_COPY, flag, flag_row


@triton.jit
def copy_temporal_kernel(
    pool_in_ptr,  # aliased with pool_ptr; read and written through pool_ptr
    errors_in_ptr,  # aliased with errors_ptr
    src_ptr,  # [rows] physical source block (the accepted candidate), -1 = no copy
    dst_ptr,  # [rows] physical destination block
    num_rows,
    layer_stride,
    block_stride,
    block_numel,
    num_blocks,
    pool_ptr,
    errors_ptr,
    TILE: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,
    ALIGN: tl.constexpr,
    EVEN: tl.constexpr,
):
    # axis 0: a tile of the block, axis 1: a layer, axis 2: a group of ROWS_PER_PROGRAM rows.
    # The program copies its tile of its layer for each row of its group that copies, and
    # visits only those rows: a few copying rows among many still spread over all tiles
    # and layers, and a launch in which no row copies is one vector load per program (the
    # sources; a row's destination is read when the row is visited), two in the one
    # program per row group that also reads the destinations, to flag the group's bad ids.
    tile = tl.program_id(0).to(tl.int64)
    layer = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(2).to(tl.int64) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    in_batch = rows < num_rows
    src = tl.load(src_ptr + rows, mask=in_batch, other=-1).to(tl.int64)
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        dst = tl.load(dst_ptr + rows, mask=in_batch, other=-1).to(tl.int64)
        bad = in_batch & ((src < -1) | (src >= num_blocks) | (dst < -1) | (dst >= num_blocks))
        flag(errors_ptr, rows, tl.where(bad, BAD_COPY, 0))
    visit = in_batch & (src >= 0) & (src < num_blocks)
    NONE: tl.constexpr = 1 << 62
    todo = tl.where(visit, rows, NONE)
    offs = tile * TILE + tl.arange(0, TILE)
    for _ in range(tl.sum(visit.to(tl.int32))):
        row = tl.min(todo)  # the next row with a source
        todo = tl.where(todo == row, NONE, todo)
        s = tl.load(src_ptr + row).to(tl.int64)
        d = tl.load(dst_ptr + row).to(tl.int64)
        if (d >= 0) & (d < num_blocks) & (d != s):  # -1, a bad id or itself: no copy
            src_at = layer * layer_stride + s * block_stride
            dst_at = layer * layer_stride + d * block_stride
            if ALIGN > 1:  # see plan_copy_temporal: the launcher may not have told the compiler
                src_at = tl.multiple_of(src_at, ALIGN)
                dst_at = tl.multiple_of(dst_at, ALIGN)
            if EVEN:  # whole tiles: no mask, so nothing stops 16-byte accesses
                x = tl.load(pool_ptr + src_at + offs, eviction_policy="evict_first")
                tl.store(pool_ptr + dst_at + offs, x, cache_modifier=".cs")
            else:
                mask = offs < block_numel
                x = tl.load(pool_ptr + src_at + offs, mask=mask, eviction_policy="evict_first")
                tl.store(pool_ptr + dst_at + offs, x, mask=mask, cache_modifier=".cs")


@triton.jit
def copy_conv_kernel(
    pool_in_ptr,  # aliased with pool_ptr
    errors_in_ptr,  # aliased with errors_ptr
    src_ptr,  # [rows] physical source block, -1 = no copy
    dst_ptr,  # [rows] physical destination block
    bias_ptr,  # [rows] the accepted-token bias: rows dropped from the front
    num_layers,
    layer_stride,
    block_stride,
    width,  # W = K - 1 + S
    dim,  # D
    num_blocks,
    pool_ptr,
    errors_ptr,
    W_PAD: tl.constexpr,
    TILE_D: tl.constexpr,
    TILES_PER_PROGRAM: tl.constexpr,
    LAYOUT_DS: tl.constexpr,
    ALIGN: tl.constexpr,
    EVEN_D: tl.constexpr,
):
    # Destination row i takes source row i + bias, for i < W - bias; other rows keep their
    # content. One program owns every row of its channel tile and loads them all before a
    # barrier and any store, so an in-place left shift (src == dst) behaves like memmove.
    pid = tl.program_id(0).to(tl.int64)
    row = pid // num_layers
    layer = pid % num_layers
    src = tl.load(src_ptr + row).to(tl.int64)
    dst = tl.load(dst_ptr + row).to(tl.int64)
    bias = tl.load(bias_ptr + row).to(tl.int64)
    bad = (src < -1) | (src >= num_blocks) | (dst < -1) | (dst >= num_blocks)
    copies = (src >= 0) & (dst >= 0) & ~bad
    bad = bad | (copies & ((bias < 0) | (bias >= width)))
    if (layer == 0) & (tl.program_id(1) == 0):  # one program per row flags
        flag_row(errors_ptr, row, tl.where(bad, BAD_COPY, 0))
    if copies & ~bad & ((src != dst) | (bias != 0)):
        src_base = layer * layer_stride + src * block_stride
        dst_base = layer * layer_stride + dst * block_stride
        if ALIGN > 1:  # see plan_copy_conv
            src_base = tl.multiple_of(src_base, ALIGN)
            dst_base = tl.multiple_of(dst_base, ALIGN)
        w = tl.arange(0, W_PAD).to(tl.int64)
        keep = w + bias < width  # [W_PAD] destination rows that receive a source row
        first = tl.program_id(1).to(tl.int64) * TILES_PER_PROGRAM
        for t in range(first, first + TILES_PER_PROGRAM):
            d = t * TILE_D + tl.arange(0, TILE_D)
            if LAYOUT_DS:  # block [D, W]: shift along the last axis
                dst_offs = d[:, None] * width + w[None, :]
                src_offs = dst_offs + bias
                mask = (d[:, None] < dim) & keep[None, :]
            else:  # block [W, D]: shift whole rows
                rows = w * dim
                moved = bias * dim
                if ALIGN > 1:
                    rows = tl.multiple_of(rows, ALIGN)
                    moved = tl.multiple_of(moved, ALIGN)
                dst_offs = rows[:, None] + d[None, :]
                src_offs = dst_offs + moved
                if EVEN_D:  # whole channel tiles: the mask is constant along D
                    mask = tl.broadcast_to(keep[:, None], (W_PAD, TILE_D))
                else:
                    mask = keep[:, None] & (d[None, :] < dim)
            x = tl.load(pool_ptr + src_base + src_offs, mask=mask)
            tl.debug_barrier()
            tl.store(pool_ptr + dst_base + dst_offs, x, mask=mask)


#: Programs a copy launch aims for. Every program starts and exits even when its rows copy
#: nothing, so the temporal grid groups rows instead of one program per row: an empty
#: launch then costs about as much at 256 rows as at 1. It never goes below one program per
#: 4 KiB tile and layer, so the target only matters for pools of fewer tiles x layers than
#: it (a 36-layer pool of 2 MiB blocks has 18 432). The conv grid runs several channel
#: tiles per program down to one program per row and layer, so its empty launch grows
#: with rows x layers past the target. The measurements and the grids tried instead are in
#: benchmarks/README.md.
TEMPORAL_PROGRAMS = 1024
CONV_PROGRAMS = 4096
#: Rows one temporal-copy program scans (held in registers); beyond, more row groups.
MAX_ROWS_PER_PROGRAM = 1024


def _split(units: int, work: int, target: int) -> int:
    """The smallest power of two ``s <= work`` with ``units * s >= target``."""
    s = 1
    while s < work and units * s < target:
        s *= 2
    return min(s, work)


def temporal_tiling(num_rows: int, num_layers: int, block_numel: int, itemsize: int,
                    align: int = 1) -> dict:
    """Grid and tiling for the temporal copy: 4 KiB tiles (one 16-byte vector per thread
    with 8 warps) on axis 0, layers on axis 1 (so at most 65 535 layers), groups of rows on
    axis 2: as few rows per group as keep the launch within ``max(TEMPORAL_PROGRAMS, tiles
    x layers)`` programs, at most :data:`MAX_ROWS_PER_PROGRAM`. Returns ``grid``,
    ``constexprs`` and ``num_warps``.

    ``ROWS_PER_PROGRAM`` is a power of two that follows the batch size, so each batch-size
    bucket compiles once: warm them up before serving, as for CUDA graphs.

    ``align`` (:func:`pool_align`) is a power of two dividing both pool strides. The kernel
    states it to the compiler itself, so that the code does not depend on what the launcher
    specialized: torch's launcher marks integer arguments divisible by 16, jax-triton 0.3
    does not, and without it the JAX-launched copy used 4-byte instead of 16-byte accesses.
    """
    tile = max(16, min(next_pow2(block_numel), 4096 // itemsize))
    tiles, layers, rows = cdiv(block_numel, tile), max(1, num_layers), max(1, num_rows)
    per_program = 1  # a power of two (a tl.arange), at most MAX_ROWS_PER_PROGRAM
    while (per_program < min(rows, MAX_ROWS_PER_PROGRAM)
           and tiles * layers * cdiv(rows, per_program) > TEMPORAL_PROGRAMS):
        per_program *= 2
    return {"grid": (tiles, layers, cdiv(rows, per_program)),
            "constexprs": {"TILE": tile, "ROWS_PER_PROGRAM": per_program,
                           "ALIGN": _pow2(align), "EVEN": block_numel % tile == 0},
            "num_warps": max(1, min(8, tile * itemsize // 512))}


def conv_tiling(num_rows: int, num_layers: int, width: int, dim: int, itemsize: int,
                layout: str, align: int = 1) -> dict:
    """Grid and tiling for the conv shift-copy: rows x layers on axis 0, runs of channel
    tiles on axis 1 (as few as keep about :data:`CONV_PROGRAMS` programs); every program
    covers all ``W`` rows of its channels. ``align`` (:func:`pool_align`) divides both
    strides and, in the "SD" layout, ``D``: see :func:`temporal_tiling`."""
    layout = check_layout(layout)
    w_pad = next_pow2(width)
    tile_d = max(16, min(next_pow2(dim), max(16, 8192 // (w_pad * itemsize))))
    tiles = max(1, cdiv(dim, tile_d))  # an empty pool (D = 0) plans a skipped launch
    split = min(_split(max(1, num_rows * num_layers), tiles, CONV_PROGRAMS), MAX_GRID_YZ)
    per_program = cdiv(tiles, split)
    grid = (max(1, num_rows * num_layers), cdiv(tiles, per_program))
    return {"grid": grid,
            "constexprs": {"W_PAD": w_pad, "TILE_D": tile_d, "TILES_PER_PROGRAM": per_program,
                           "LAYOUT_DS": layout == "DS", "ALIGN": _pow2(align),
                           "EVEN_D": dim == tile_d * per_program * grid[1]},
            "num_warps": 4}


def check_layout(layout: str) -> str:
    if layout not in ("SD", "DS"):
        raise ValueError(f"layout must be 'SD' or 'DS', got {layout!r}")
    return layout


def _copy_rows(pool: ArraySpec, src: ArraySpec, dst: ArraySpec, *more: Tuple[str, ArraySpec]) -> int:
    check_array("src", src, (None,))
    rows = src.shape[0]
    check_array("dst", dst, (rows,))
    for name, spec in more:
        check_array(name, spec, (rows,))
    return rows


@functools.lru_cache(maxsize=256, typed=True)
def plan_copy_temporal(pool: ArraySpec, errors: ArraySpec, src: ArraySpec,
                       dst: ArraySpec) -> LaunchPlan:
    check_pool("pool", pool, pool.shape[2:])
    check_errors(errors)
    rows = _copy_rows(pool, src, dst)
    scal = pool_scalars(pool)
    t = temporal_tiling(rows, scal["num_layers"], scal["block_numel"],
                        dtype_bits(pool.dtype) // 8, pool_align(scal))
    return LaunchPlan(
        kernel=copy_temporal_kernel,
        inputs=("pool", "errors", "src", "dst"),
        scalars=(("num_rows", rows),) + tuple(
            (n, scal[n]) for n in ("layer_stride", "block_stride", "block_numel", "num_blocks")),
        outputs=("pool", "errors"),
        aliases={"pool": "pool", "errors": "errors"},
        views={"pool": bits_dtype(pool.dtype)},
        skip=rows == 0 or pool.numel == 0,
        **t,
    )


@functools.lru_cache(maxsize=256, typed=True)
def plan_copy_conv(pool: ArraySpec, errors: ArraySpec, src: ArraySpec, dst: ArraySpec,
                   bias: ArraySpec, *, layout: str) -> LaunchPlan:
    check_layout(layout)
    check_errors(errors)
    if pool.ndim != 4:
        raise ValueError(f"pool must be [L, NB, W, D] (SD) or [L, NB, D, W] (DS), got "
                         f"{list(pool.shape)}")
    check_pool("pool", pool, pool.shape[2:])
    rows = _copy_rows(pool, src, dst, ("bias", bias))
    scal = pool_scalars(pool, layout)
    t = conv_tiling(rows, scal["num_layers"], scal["width"], scal["dim"],
                    dtype_bits(pool.dtype) // 8, layout, pool_align(scal, layout))
    return LaunchPlan(
        kernel=copy_conv_kernel,
        inputs=("pool", "errors", "src", "dst", "bias"),
        scalars=tuple((n, scal[n]) for n in ("num_layers", "layer_stride", "block_stride",
                                             "width", "dim", "num_blocks")),
        outputs=("pool", "errors"),
        aliases={"pool": "pool", "errors": "errors"},
        views={"pool": bits_dtype(pool.dtype)},
        skip=rows == 0 or pool.numel == 0,
        **t,
    )


COPY_TEMPORAL = Op(
    name="copy_temporal",
    arrays=("pool", "errors", "src", "dst"),
    statics=(),
    plan=plan_copy_temporal,
    mutates=("pool", "errors"),
    returns=(),
    doc="""For every row with valid ``src`` and ``dst`` (``0 <= id < NB``, not the same
    block): ``pool[:, dst] = pool[:, src]``, a bit copy; other rows copy nothing. ``pool``
    is ``[L, NB, ...]`` (a float or int dtype, contiguous inner block), updated in place;
    ``src`` / ``dst`` int ``[rows]`` physical block ids, -1 = no copy. A row with an id
    below -1 or ``>= NB`` copies nothing and ORs ``BAD_COPY`` into ``errors`` (int32 ``[2]``,
    in place). Rows must not write a block another row reads or writes (not checked: they
    run in parallel). An empty pool launches nothing and flags nothing.""",
)

COPY_CONV = Op(
    name="copy_conv",
    arrays=("pool", "errors", "src", "dst", "bias"),
    statics=(Static("layout", str),),
    plan=plan_copy_conv,
    mutates=("pool", "errors"),
    returns=(),
    doc="""For every row with valid ids and ``0 <= bias < W`` (and not a same-block copy
    with no bias): the conv window of block ``src`` shifted left by ``bias`` rows into block
    ``dst`` (memmove-safe when ``src == dst``); other rows copy nothing. ``pool`` is
    ``[L, NB, W, D]`` (``layout="SD"``) or ``[L, NB, D, W]`` (``"DS"``), updated in place;
    ``src`` / ``dst`` / ``bias`` int ``[rows]``, -1 = no copy. A row with an id below -1 or
    ``>= NB``, or with valid ids and a bias outside ``[0, W)``, copies nothing and ORs
    ``BAD_COPY`` into ``errors`` (int32 ``[2]``, in place). Rows must not race (as for
    ``copy_temporal``); an empty pool launches nothing and flags nothing.""",
)


def pool_copies(kinds: Mapping[str, str], pools: Mapping[str, Any],
                copy_plan: Mapping[str, Any]) -> Iterator[Tuple[str, Op, dict, dict]]:
    """How a step's physical copy plan (``copy_tsrc`` / ``copy_csrc`` / ``copy_dst`` /
    ``copy_bias``) reaches each pool: ``kinds`` is ``CacheConfig.copy_kinds()``
    (``"temporal"``, ``"SD"`` or ``"DS"`` per pool name). Yields, per pool, its name, the op
    to launch, the op's arrays but ``errors`` (the backend adds its error flag: a
    functional one threads the updated flag from one launch to the next) and its static
    options. Both backends apply a copy plan through this."""
    for name, kind in kinds.items():
        if kind == "temporal":
            yield name, COPY_TEMPORAL, {"pool": pools[name], "src": copy_plan["copy_tsrc"],
                                        "dst": copy_plan["copy_dst"]}, {}
        else:
            yield name, COPY_CONV, {"pool": pools[name], "src": copy_plan["copy_csrc"],
                                    "dst": copy_plan["copy_dst"],
                                    "bias": copy_plan["copy_bias"]}, {"layout": kind}


def plan_pool_copies(kinds: Mapping[str, str], pools: Mapping[str, ArraySpec], rows: int,
                     errors: ArraySpec) -> None:
    """Plan every pool's copy of a step of ``rows`` rows (pools described as
    :class:`ArraySpec` by name, ``kinds`` as in :func:`pool_copies`), raising what a pool
    the copies cannot take (strides, a grid past the hardware's limits) would raise at its
    launch. A runner calls it before the step's bookkeeping changes its state."""
    _plan_pool_copies(tuple(kinds.items()), tuple((n, pools[n]) for n in kinds), rows, errors)


@functools.lru_cache(maxsize=256)
def _plan_pool_copies(kinds: Tuple[Tuple[str, str], ...], pools: Tuple[Tuple[str, ArraySpec], ...],
                      rows: int, errors: ArraySpec) -> None:
    # one cache lookup a step (a raise is not cached)
    ids = ArraySpec.row_major((rows,), ROW)  # the bookkeeping's per-row outputs
    plan = dict.fromkeys(("copy_tsrc", "copy_csrc", "copy_dst", "copy_bias"), ids)
    for name, op, arrays, statics in pool_copies(dict(kinds), dict(pools), plan):
        try:
            op.plan(errors=errors, **arrays, **statics)
        except (TypeError, ValueError) as e:
            raise type(e)(f"pool {name!r}: {e}") from e


def _pow2(align: int) -> int:
    if isinstance(align, bool) or not isinstance(align, int) or align < 1 or align & (align - 1):
        raise ValueError(f"align must be a power of two >= 1, got {align!r}")
    return align


def pool_align(scalars: dict, layout: str = "temporal", cap: int = 16) -> int:
    """The largest power of two ``<= cap`` that divides the layer and block strides of a
    pool (from :func:`pool_scalars`) and, for an "SD" conv pool, ``dim``: the alignment in
    elements that the copy kernels may promise the compiler."""
    values = [scalars["layer_stride"], scalars["block_stride"]]
    if layout == "SD":
        values.append(scalars["dim"])
    return largest_align(values, cap)

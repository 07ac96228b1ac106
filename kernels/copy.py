"""State-block copy kernels (SPEC.md §2 ``copy_block``), shared by the pre-copy and the
post-process: both produce a physical copy plan per batch row (``temporal_src``,
``conv_src``, ``dst``, ``shift``; -1 source = no copy) and launch these kernels on it.

Pools are ``[L, NB, *block]`` with explicit layer and block strides (in elements) and a
contiguous inner block. The backends pass pools viewed as same-width integers, so a copy
is a bit copy whatever the dtype. All offsets are int64.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from .plan import MAX_GRID_YZ, LaunchPlan, cdiv, next_pow2


@triton.jit
def copy_temporal_kernel(
    pool_in_ptr,  # aliased with pool_ptr; read and written through pool_ptr
    src_ptr,  # [rows] physical source block (the accepted candidate), -1 = no copy
    dst_ptr,  # [rows] physical destination block
    num_rows,
    layer_stride,
    block_stride,
    block_numel,
    num_blocks,
    pool_ptr,
    TILE: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,
    ALIGN: tl.constexpr,
    EVEN: tl.constexpr,
):
    # axis 0: a tile of the block, axis 1: a layer, axis 2: a group of ROWS_PER_PROGRAM rows.
    # The program copies its tile of its layer for each row of its group that copies, and
    # visits only those rows: a few copying rows among many still spread over all tiles
    # and layers, and a launch in which no row copies is one vector load per program.
    tile = tl.program_id(0).to(tl.int64)
    layer = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(2).to(tl.int64) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    in_batch = rows < num_rows
    src = tl.load(src_ptr + rows, mask=in_batch, other=-1).to(tl.int64)
    dst = tl.load(dst_ptr + rows, mask=in_batch, other=-1).to(tl.int64)
    ok = in_batch & (src >= 0) & (dst >= 0) & (src < num_blocks) & (dst < num_blocks)
    ok = ok & (src != dst)
    NONE: tl.constexpr = 1 << 62
    todo = tl.where(ok, rows, NONE)
    offs = tile * TILE + tl.arange(0, TILE)
    for _ in range(tl.sum(ok.to(tl.int32))):
        row = tl.min(todo)  # the next row that copies
        todo = tl.where(todo == row, NONE, todo)
        src_off = layer * layer_stride + tl.load(src_ptr + row).to(tl.int64) * block_stride
        dst_off = layer * layer_stride + tl.load(dst_ptr + row).to(tl.int64) * block_stride
        if ALIGN > 1:  # see plan_copy_temporal: the launcher may not have told the compiler
            src_off = tl.multiple_of(src_off, ALIGN)
            dst_off = tl.multiple_of(dst_off, ALIGN)
        if EVEN:  # whole tiles: no mask, so nothing stops 16-byte accesses
            x = tl.load(pool_ptr + src_off + offs, eviction_policy="evict_first")
            tl.store(pool_ptr + dst_off + offs, x, cache_modifier=".cs")
        else:
            mask = offs < block_numel
            x = tl.load(pool_ptr + src_off + offs, mask=mask, eviction_policy="evict_first")
            tl.store(pool_ptr + dst_off + offs, x, mask=mask, cache_modifier=".cs")


@triton.jit
def copy_conv_kernel(
    pool_in_ptr,  # aliased with pool_ptr
    src_ptr,  # [rows] physical source block, -1 = no copy
    dst_ptr,  # [rows] physical destination block
    shift_ptr,  # [rows] rows dropped from the front (the accepted-token bias)
    num_layers,
    layer_stride,
    block_stride,
    width,  # W = K - 1 + S
    dim,  # D
    num_blocks,
    pool_ptr,
    W_PAD: tl.constexpr,
    TILE_D: tl.constexpr,
    TILES_PER_PROGRAM: tl.constexpr,
    LAYOUT_DS: tl.constexpr,
    ALIGN: tl.constexpr,
    EVEN_D: tl.constexpr,
):
    # Destination row i takes source row i + shift, for i < W - shift; other rows keep their
    # content. One program owns every row of its channel tile and loads them all before a
    # barrier and any store, so an in-place left shift (src == dst) behaves like memmove.
    pid = tl.program_id(0).to(tl.int64)
    row = pid // num_layers
    layer = pid % num_layers
    src = tl.load(src_ptr + row).to(tl.int64)
    dst = tl.load(dst_ptr + row).to(tl.int64)
    shift = tl.load(shift_ptr + row).to(tl.int64)
    ok = (src >= 0) & (dst >= 0) & (src < num_blocks) & (dst < num_blocks)
    ok = ok & (shift >= 0) & (shift < width) & ((src != dst) | (shift != 0))
    if ok:
        src_base = layer * layer_stride + src * block_stride
        dst_base = layer * layer_stride + dst * block_stride
        if ALIGN > 1:  # see plan_copy_conv
            src_base = tl.multiple_of(src_base, ALIGN)
            dst_base = tl.multiple_of(dst_base, ALIGN)
        w = tl.arange(0, W_PAD).to(tl.int64)
        keep = w + shift < width  # [W_PAD] destination rows that receive a source row
        first = tl.program_id(1).to(tl.int64) * TILES_PER_PROGRAM
        for t in range(first, first + TILES_PER_PROGRAM):
            d = t * TILE_D + tl.arange(0, TILE_D)
            if LAYOUT_DS:  # block [D, W]: shift along the last axis
                dst_offs = d[:, None] * width + w[None, :]
                src_offs = dst_offs + shift
                mask = (d[:, None] < dim) & keep[None, :]
            else:  # block [W, D]: shift whole rows
                rows = w * dim
                moved = shift * dim
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
#: nothing (0.6-0.7 ns of GPU time each on the H200): with one program per row, layer and
#: 16 KiB, a decode step in which no row crosses cost 179 us at 64 rows and 713 us at 256
#: rows of a 36-layer model. The temporal grid groups rows instead, down to one program per
#: 4 KiB tile and layer (18 432 for 36 layers of 2 MiB blocks: ~12 us when nothing copies);
#: ``benchmarks/tune_copy.py --split``: 3.8-4.06 TB/s from 1 to 256 rows, 4 copying rows
#: among 256 at 3.97 TB/s. The conv grid runs several channel tiles per program.
#: Measured alternatives (``benchmarks/probe_copy_limit.py``): one program per tile, layer
#: and row copies up to 4 % faster but costs 2.8 ms per no-copy launch at 256 rows; a
#: persistent one-wave grid costs 2-2.5 us there but copies up to 3 % slower.
TEMPORAL_PROGRAMS = 4096
CONV_PROGRAMS = 16384
#: Rows one temporal-copy program scans (held in registers); beyond, more row groups.
MAX_ROWS_PER_PROGRAM = 1024


def _split(units: int, work: int, target: int) -> int:
    """The smallest power of two ``s <= work`` with ``units * s >= target``."""
    s = 1
    while s < work and units * s < target:
        s *= 2
    return min(s, work)


@functools.lru_cache(maxsize=256)
def plan_copy_temporal(
    num_rows: int, num_layers: int, block_numel: int, itemsize: int, align: int = 1
) -> LaunchPlan:
    """Grid and tiling for the temporal copy: 4 KiB tiles (one 16-byte vector per thread
    with 8 warps) on axis 0, layers on axis 1 (so at most 65 535 layers), groups of rows on
    axis 2: as few rows per group as keep the launch within ``max(TEMPORAL_PROGRAMS, tiles
    x layers)`` programs, at most :data:`MAX_ROWS_PER_PROGRAM`.

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
    return LaunchPlan(
        kernel=copy_temporal_kernel,
        grid=(tiles, layers, cdiv(rows, per_program)),
        inputs=("pool", "src", "dst"),
        scalars=("num_rows", "layer_stride", "block_stride", "block_numel", "num_blocks"),
        outputs=("pool",),
        constexprs={"TILE": tile, "ROWS_PER_PROGRAM": per_program, "ALIGN": _pow2(align),
                    "EVEN": block_numel % tile == 0},
        num_warps=max(1, min(8, tile * itemsize // 512)),
        aliases={"pool": "pool"},
    )


@functools.lru_cache(maxsize=256)
def plan_copy_conv(
    num_rows: int, num_layers: int, width: int, dim: int, itemsize: int, layout: str,
    align: int = 1,
) -> LaunchPlan:
    """Grid and tiling for the conv shift-copy: rows x layers on axis 0, runs of channel
    tiles on axis 1 (as few as keep about :data:`CONV_PROGRAMS` programs); every program
    covers all ``W`` rows of its channels. ``align`` (:func:`pool_align`) divides both
    strides and, in the "SD" layout, ``D``: see :func:`plan_copy_temporal`."""
    if layout not in ("SD", "DS"):
        raise ValueError(f"layout must be 'SD' or 'DS', got {layout!r}")
    w_pad = next_pow2(width)
    tile_d = max(16, min(next_pow2(dim), max(16, 8192 // (w_pad * itemsize))))
    tiles = cdiv(dim, tile_d)
    split = min(_split(max(1, num_rows * num_layers), tiles, CONV_PROGRAMS), MAX_GRID_YZ)
    per_program = cdiv(tiles, split)
    grid = (max(1, num_rows * num_layers), cdiv(tiles, per_program))
    return LaunchPlan(
        kernel=copy_conv_kernel,
        grid=grid,
        inputs=("pool", "src", "dst", "shift"),
        scalars=("num_layers", "layer_stride", "block_stride", "width", "dim", "num_blocks"),
        outputs=("pool",),
        constexprs={"W_PAD": w_pad, "TILE_D": tile_d, "TILES_PER_PROGRAM": per_program,
                     "LAYOUT_DS": layout == "DS", "ALIGN": _pow2(align),
                     "EVEN_D": dim == tile_d * per_program * grid[1]},
        num_warps=4,
        aliases={"pool": "pool"},
    )


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
    align = cap
    while align > 1 and any(v % align for v in values):
        align //= 2
    return align

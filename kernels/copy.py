"""State-block copy kernels (SPEC.md §2 ``copy_block``), shared by the pre-copy and the
post-process: both produce a physical copy plan per batch row (``temporal_src``,
``conv_src``, ``dst``, ``shift``; -1 source = no copy) and launch these kernels on it.

Pools are ``[L, NB, *block]`` with explicit layer and block strides (in elements) and a
contiguous inner block. The backends pass pools viewed as same-width integers, so a copy
is a bit copy whatever the dtype. All offsets are int64.
"""

from __future__ import annotations

import functools
import os

import triton
import triton.language as tl

from .plan import MAX_GRID_YZ, LaunchPlan, cdiv, next_pow2


@triton.jit
def copy_temporal_kernel(
    pool_in_ptr,  # aliased with pool_ptr; read and written through pool_ptr
    src_ptr,  # [rows] physical source block (the accepted candidate), -1 = no copy
    dst_ptr,  # [rows] physical destination block
    num_rows,
    num_layers,
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
    # Persistent: axis 0 holds one wave of programs, axis 1 the groups of ROWS_PER_PROGRAM
    # rows. A group's work is one unit per (copying row, layer, tile), numbered in that
    # order; program p takes units p, p + P, p + 2P, ... So the programs share the work to
    # one unit, those running at any moment stream through neighbouring tiles, and a launch
    # in which no row copies costs one wave of programs that each read the row ids once.
    rows = tl.program_id(1).to(tl.int64) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    in_batch = rows < num_rows
    src = tl.load(src_ptr + rows, mask=in_batch, other=-1).to(tl.int64)
    dst = tl.load(dst_ptr + rows, mask=in_batch, other=-1).to(tl.int64)
    ok = in_batch & (src >= 0) & (dst >= 0) & (src < num_blocks) & (dst < num_blocks)
    ok = ok & (src != dst)
    # Valid ids fit 32 bits (< num_blocks); held so, the row ids cost half the registers.
    src = tl.where(ok, src, 0).to(tl.int32)
    dst = tl.where(ok, dst, 0).to(tl.int32)
    rank = tl.where(ok, tl.cumsum(ok.to(tl.int32), axis=0) - 1, -1)  # among the copying rows
    count = tl.sum(ok.to(tl.int32))
    # The unit number as digits (row k, layer, tile), advanced by P without divisions; the
    # row's block ids are looked up (two reductions) only when k changes.
    tiles = tl.cdiv(block_numel, TILE)
    per_row = tiles * num_layers  # < 2**31: plan_copy_temporal checks
    step = tl.num_programs(0)
    step_k, step_layer, step_tile = step // per_row, step % per_row // tiles, step % tiles
    pid = tl.program_id(0)
    k, layer, tile = pid // per_row, pid % per_row // tiles, pid % tiles
    looked_up = k - 1
    s_blk = tl.zeros((), tl.int32)
    d_blk = tl.zeros((), tl.int32)
    while k < count:
        if k != looked_up:
            s_blk = tl.sum(tl.where(rank == k, src, 0))
            d_blk = tl.sum(tl.where(rank == k, dst, 0))
            looked_up = k
        src_off = layer.to(tl.int64) * layer_stride + s_blk.to(tl.int64) * block_stride
        dst_off = layer.to(tl.int64) * layer_stride + d_blk.to(tl.int64) * block_stride
        if ALIGN > 1:  # see plan_copy_temporal: the launcher may not have told the compiler
            src_off = tl.multiple_of(src_off, ALIGN)
            dst_off = tl.multiple_of(dst_off, ALIGN)
        offs = tile.to(tl.int64) * TILE + tl.arange(0, TILE)
        if EVEN:  # whole tiles: no mask, so nothing stops 16-byte accesses
            x = tl.load(pool_ptr + src_off + offs, eviction_policy="evict_first")
            tl.store(pool_ptr + dst_off + offs, x, cache_modifier=".cs")
        else:
            mask = offs < block_numel
            x = tl.load(pool_ptr + src_off + offs, mask=mask, eviction_policy="evict_first")
            tl.store(pool_ptr + dst_off + offs, x, mask=mask, cache_modifier=".cs")
        tile += step_tile
        layer += step_layer + (tile >= tiles).to(tl.int32)
        tile = tl.where(tile >= tiles, tile - tiles, tile)
        k += step_k + (layer >= num_layers).to(tl.int32)
        layer = tl.where(layer >= num_layers, layer - num_layers, layer)


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


#: Every program of a launch starts and exits even when its rows copy nothing (0.6-0.7 ns
#: of GPU time each on the H200): with one program per row, layer and 16 KiB, a decode step
#: in which no row crosses cost 179 us at 64 rows and 713 us at 256 rows of a 36-layer
#: model. The temporal copy runs one wave of persistent programs instead:
#: PROGRAMS_PER_SM per SM (8 warps each, at most 32 registers per thread: 8 fit an SM).
#: A grid of one program per tile and layer, looping over rows, ran 17.5 waves of equal
#: programs and lost 3-4 % to the half-empty last one (benchmarks/probe_copy_limit.py).
PROGRAMS_PER_SM = 8
#: The conv grid runs several channel tiles per program, about this many programs.
CONV_PROGRAMS = 16384
#: Rows one temporal-copy program holds in registers; beyond, more row groups. With 1024
#: the kernel needs 38 registers per thread and 8 programs no longer fit an SM.
MAX_ROWS_PER_PROGRAM = 512


def _split(units: int, work: int, target: int) -> int:
    """The smallest power of two ``s <= work`` with ``units * s >= target``."""
    s = 1
    while s < work and units * s < target:
        s *= 2
    return min(s, work)


@functools.lru_cache(maxsize=256)
def plan_copy_temporal(
    num_rows: int, num_layers: int, block_numel: int, itemsize: int, align: int = 1,
    num_sms: int = 1,
) -> LaunchPlan:
    """Grid and tiling for the temporal copy: 4 KiB tiles (one 16-byte vector per thread
    with 8 warps); ``num_sms x PROGRAMS_PER_SM`` persistent programs on axis 0 (fewer if
    there are fewer tiles); groups of at most :data:`MAX_ROWS_PER_PROGRAM` rows on axis 1.

    ``ROWS_PER_PROGRAM`` is the batch size rounded up to a power of two, so each batch-size
    bucket compiles once: warm them up before serving, as for CUDA graphs.

    ``align`` (:func:`pool_align`) is a power of two dividing both pool strides. The kernel
    states it to the compiler itself, so that the code does not depend on what the launcher
    specialized: torch's launcher marks integer arguments divisible by 16, jax-triton 0.3
    does not, and without it the JAX-launched copy used 4-byte instead of 16-byte accesses.
    ``num_sms`` (:func:`sm_count`) only sizes the grid; any value gives the same result.
    """
    if not isinstance(num_sms, int) or num_sms < 1:
        raise ValueError(f"num_sms must be an int >= 1, got {num_sms!r}")
    tile = max(16, min(next_pow2(block_numel), 4096 // itemsize))
    tiles, layers, rows = cdiv(block_numel, tile), max(1, num_layers), max(1, num_rows)
    if tiles * layers + num_sms * PROGRAMS_PER_SM >= 2**31:  # the kernel counts in int32
        raise ValueError(f"a temporal pool of {num_layers} layers x {block_numel} elements "
                         "per block is too large for one copy launch")
    per_program = next_pow2(min(rows, MAX_ROWS_PER_PROGRAM))
    programs = min(num_sms * PROGRAMS_PER_SM, tiles * layers * per_program)
    return LaunchPlan(
        kernel=copy_temporal_kernel,
        grid=(programs, cdiv(rows, per_program)),
        inputs=("pool", "src", "dst"),
        scalars=("num_rows", "num_layers", "layer_stride", "block_stride", "block_numel",
                 "num_blocks"),
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


@functools.lru_cache(maxsize=None)
def sm_count(device: int = 0) -> int:
    """Streaming multiprocessors of CUDA device ``device`` (from Triton's driver), or 1 under
    Triton's interpreter: what :func:`plan_copy_temporal` sizes its grid by."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return 1
    from triton.runtime import driver

    return int(driver.active.utils.get_device_properties(device)["multiprocessor_count"])


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

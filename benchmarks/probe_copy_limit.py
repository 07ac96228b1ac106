"""What bounds the temporal copy on the GPU (one-off probe, see benchmarks/README.md).

The JAX target (>= 1.9x XLA's ``pool.at[:, dst].set(pool[:, src])``) leaves little room:
XLA's gather and scatter both run near the device-to-device ceiling, so the ratio can
reach 2x only if our single pass does too. This probe times, in one process and on the
same bytes, the pieces that separate our copy from the ceiling:

- ``d2d``: ``b.copy_(a)`` of contiguous int32 buffers, timed in a CUDA graph. Not the
  ceiling: bench_copy's eager uint8 copy of the same bytes runs about 1.5x faster;
- ``read``/``write``: a Triton kernel that only loads (and keeps a checksum) or only
  stores: the HBM's one-way rates;
- ``flat``: a Triton copy between two contiguous buffers, same tile as the library;
- ``flat-inplace``: the same between the two disjoint halves of one allocation (what
  sharing an allocation costs, if anything; no element is both read and written);
- ``library``: ``copy_temporal_`` on the serving pool (36 layers x 2 MiB) at B rows: one
  program per 4 KiB tile and layer, looping over the rows that copy (17.5 waves of equal
  programs on the H200, so the last wave is half empty);
- ``one-row``: one program per tile, layer and row, no loop (the fastest full copy, but a
  launch in which no row copies costs 2.84 ms at 256 rows: results/tune_split2.log);
- ``persistent``: one wave of 8 programs per SM sharing the (copying row, layer, tile)
  units evenly, program p taking units p, p + P, ...; the unit's digits are advanced
  without divisions and a row's block ids looked up only when the row changes. No tail,
  and ~2 us when no row copies, but slower than the library on full copies;
- ``divided``: the same with integer divisions and two reductions per unit;
- ``chunked xg``: persistent, g waves, each program a contiguous range of units (its
  successive tiles stay within one block: rules out TLB reach);
- ``waves=w``, ``tile=t,w=n``: the persistent kernel with w times its program count, or
  bigger tiles per unit (more bytes in flight per program; with 16 KiB tiles a program
  needs 36-38 registers per thread, 6 fit an SM, and the grid is 1.33 waves);
- JAX: the library via jax-triton and XLA's gather + scatter, per kernel from a profiler
  trace. TB/s count the bytes the copy needs (read + write once): XLA moves each byte
  twice, through a temporary, so each of its two kernels runs at twice its printed rate.

It also prints the registers per thread of the Triton kernels (occupancy) and the compiled
HLO of a jitted pre-copy step (which XLA kernels it runs besides ours).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before jax is imported

import torch
import triton
import triton.language as tl


@triton.jit
def flat_copy(src_ptr, dst_ptr, TILE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
    x = tl.load(src_ptr + offs, eviction_policy="evict_first")
    tl.store(dst_ptr + offs, x, cache_modifier=".cs")


@triton.jit
def read_only(src_ptr, out_ptr, TILE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
    x = tl.load(src_ptr + offs, eviction_policy="evict_first")
    tl.store(out_ptr + tl.program_id(0), tl.sum(x))  # 4 bytes per tile: keeps the load


@triton.jit
def write_only(dst_ptr, TILE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
    tl.store(dst_ptr + offs, tl.zeros((TILE,), tl.int32), cache_modifier=".cs")


@triton.jit
def one_row_copy(src_ptr, dst_ptr, layer_stride, block_stride, pool_ptr, TILE: tl.constexpr):
    tile = tl.program_id(0).to(tl.int64)
    layer = tl.program_id(1).to(tl.int64)
    row = tl.program_id(2).to(tl.int64)
    src = tl.load(src_ptr + row).to(tl.int64)
    dst = tl.load(dst_ptr + row).to(tl.int64)
    if (src >= 0) & (dst >= 0) & (src != dst):
        s_off = tl.multiple_of(layer * layer_stride + src * block_stride, 16)
        d_off = tl.multiple_of(layer * layer_stride + dst * block_stride, 16)
        offs = tile * TILE + tl.arange(0, TILE)
        x = tl.load(pool_ptr + s_off + offs, eviction_policy="evict_first")
        tl.store(pool_ptr + d_off + offs, x, cache_modifier=".cs")


@triton.jit
def persistent_copy(
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
def divided_copy(src_ptr, dst_ptr, num_rows, num_layers, layer_stride, block_stride, pool_ptr,
                 TILE: tl.constexpr, TILES: tl.constexpr, R: tl.constexpr):
    # the persistent grid with the unit split by divisions and two reductions per unit
    rows = tl.arange(0, R)
    inb = rows < num_rows
    s = tl.load(src_ptr + rows, mask=inb, other=-1)
    d = tl.load(dst_ptr + rows, mask=inb, other=-1)
    ok = inb & (s >= 0) & (d >= 0) & (s != d)
    rank = tl.where(ok, tl.cumsum(ok.to(tl.int32), axis=0) - 1, -1)
    per_row = TILES * num_layers
    total = per_row.to(tl.int64) * tl.sum(ok.to(tl.int32))
    for unit in range(tl.program_id(0).to(tl.int64), total, tl.num_programs(0)):
        k = unit // per_row
        layer = (unit - k * per_row) // TILES
        tile = unit - k * per_row - layer * TILES
        s_off = tl.multiple_of(layer * layer_stride + tl.sum(tl.where(rank == k, s, 0)).to(tl.int64) * block_stride, 16)
        d_off = tl.multiple_of(layer * layer_stride + tl.sum(tl.where(rank == k, d, 0)).to(tl.int64) * block_stride, 16)
        offs = tile * TILE + tl.arange(0, TILE)
        x = tl.load(pool_ptr + s_off + offs, eviction_policy="evict_first")
        tl.store(pool_ptr + d_off + offs, x, cache_modifier=".cs")


@triton.jit
def chunked_copy(src_ptr, dst_ptr, num_rows, num_layers, layer_stride, block_stride, pool_ptr,
                 TILE: tl.constexpr, TILES: tl.constexpr, R: tl.constexpr):
    # persistent, but each program takes a contiguous range of units (tile fastest), so
    # its successive tiles stay in one block (one page) instead of jumping P tiles
    rows = tl.arange(0, R)
    inb = rows < num_rows
    s = tl.load(src_ptr + rows, mask=inb, other=-1).to(tl.int32)
    d = tl.load(dst_ptr + rows, mask=inb, other=-1).to(tl.int32)
    ok = inb & (s >= 0) & (d >= 0) & (s != d)
    rank = tl.where(ok, tl.cumsum(ok.to(tl.int32), axis=0) - 1, -1)
    per_row = TILES * num_layers
    total = per_row.to(tl.int64) * tl.sum(ok.to(tl.int32))
    lo = total * tl.program_id(0) // tl.num_programs(0)
    hi = total * (tl.program_id(0) + 1) // tl.num_programs(0)
    k = (lo // per_row).to(tl.int32)
    rem = (lo - k * per_row).to(tl.int32)
    layer = rem // TILES
    tile = rem - layer * TILES
    looked = k - 1
    sb = tl.zeros((), tl.int32)
    db = tl.zeros((), tl.int32)
    for _ in range(lo, hi):
        if k != looked:
            sb = tl.sum(tl.where(rank == k, s, 0))
            db = tl.sum(tl.where(rank == k, d, 0))
            looked = k
        s_off = tl.multiple_of(layer.to(tl.int64) * layer_stride + sb.to(tl.int64) * block_stride, 16)
        d_off = tl.multiple_of(layer.to(tl.int64) * layer_stride + db.to(tl.int64) * block_stride, 16)
        offs = tile.to(tl.int64) * TILE + tl.arange(0, TILE)
        x = tl.load(pool_ptr + s_off + offs, eviction_policy="evict_first")
        tl.store(pool_ptr + d_off + offs, x, cache_modifier=".cs")
        tile += 1
        layer += (tile == TILES).to(tl.int32)
        tile = tl.where(tile == TILES, 0, tile)
        k += (layer == num_layers).to(tl.int32)
        layer = tl.where(layer == num_layers, 0, layer)


def regs(kernel) -> str:
    try:
        cache = kernel.device_caches[torch.cuda.current_device()][0]
        return ", ".join(f"{k.n_regs} regs/{k.n_spills} spills" for k in cache.values())
    except Exception as e:  # the attribute layout differs across Triton versions
        return f"n/a ({type(e).__name__})"


def tbps(nbytes: int, ms: float) -> float:
    return nbytes / ms / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--json")
    ap.add_argument("--only-grids", action="store_true", help="skip the flat copies and JAX")
    args = ap.parse_args()
    import mamba_align.kernels as K
    from mamba_align.backends.torch import ops as tops  # registers torch.ops.mamba_align

    bench = lambda f: triton.testing.do_bench_cudagraph(f, rep=100)  # noqa: E731
    L, numel, tile, warps = 36, 32 * 128 * 128, 1024, 8
    out = {}
    n = max(args.batches) * L * numel  # int32 elements copied at the largest batch
    a = torch.randint(0, 1 << 30, (2 * n,), dtype=torch.int32, device="cuda")
    b = torch.empty(n, dtype=torch.int32, device="cuda")
    part = torch.empty(n // tile, dtype=torch.int32, device="cuda")
    grid = (n // tile,)
    flat = {
        "d2d": (lambda: b.copy_(a[:n]), 8 * n),
        "read": (lambda: read_only[grid](a, part, TILE=tile, num_warps=warps), 4 * n),
        "write": (lambda: write_only[grid](b, TILE=tile, num_warps=warps), 4 * n),
        "flat": (lambda: flat_copy[grid](a, b, TILE=tile, num_warps=warps), 8 * n),
        "flat-inplace": (lambda: flat_copy[grid](a, a[n:], TILE=tile, num_warps=warps), 8 * n),
    }
    for name, (fn, nbytes) in ({} if args.only_grids else flat).items():
        fn()
        out[name] = tbps(nbytes, bench(fn))
        print(f"{name:14s} {out[name]:.3f} TB/s (bytes of one-way traffic counted once)")
    print("registers:", "flat", regs(flat_copy), "| read", regs(read_only))
    del a, b, part
    torch.cuda.empty_cache()

    nb = 2 * max(args.batches) + 1
    pool = torch.zeros((L, nb, 32, 128, 128), dtype=torch.float32, device="cuda")
    bits = pool.view(torch.int32)
    for B in args.batches:
        perm = torch.randperm(nb - 1, device="cuda") + 1
        src, dst = perm[:B].clone(), perm[B:2 * B].clone()
        moved = 2 * B * L * numel * 4
        lib = lambda: torch.ops.mamba_align.copy_temporal_(pool, src, dst)  # noqa: E731
        one = lambda: one_row_copy[(numel // tile, L, B)](  # noqa: E731
            src, dst, bits.stride(0), bits.stride(1), bits, TILE=tile, num_warps=warps)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        r = triton.next_power_of_2(B)
        plan = dataclasses.replace(  # the persistent variant: one wave of 8 programs per SM
            K.plan_copy_temporal(B, L, numel, 4, 16), kernel=persistent_copy, grid=(sms * 8, 1),
            scalars=("num_rows", "num_layers", "layer_stride", "block_stride", "block_numel",
                     "num_blocks"), constexprs={"TILE": tile, "ROWS_PER_PROGRAM": r, "ALIGN": 16,
                                                "EVEN": True})
        scal = dict(K.pool_scalars(tuple(bits.shape), bits.stride()), num_rows=B)
        waves = {"persistent": lambda: tops._launch(plan, {"pool": bits, "src": src, "dst": dst}, scal)}
        divided = lambda: divided_copy[plan.grid[:1]](  # noqa: E731
            src, dst, B, L, bits.stride(0), bits.stride(1), bits, TILE=tile, TILES=numel // tile,
            R=triton.next_power_of_2(B), num_warps=warps)
        waves["divided"] = divided
        for g in (1, 4):
            waves[f"chunked x{g}"] = lambda g=g: chunked_copy[(plan.grid[0] * g,)](
                src, dst, B, L, bits.stride(0), bits.stride(1), bits, TILE=tile, TILES=numel // tile,
                R=triton.next_power_of_2(B), num_warps=warps)
        for w in (0.5, 2):  # the persistent kernel with other program counts
            p = dataclasses.replace(plan, grid=(int(plan.grid[0] * w),) + plan.grid[1:])
            waves[f"waves={w}"] = lambda p=p: tops._launch(p, {"pool": bits, "src": src, "dst": dst}, scal)
        for t, w, g in ((2048, 8, 1), (4096, 8, 1), (2048, 16, 0.5)):  # bigger tiles per unit
            p = dataclasses.replace(plan, grid=(int(plan.grid[0] * g),) + plan.grid[1:], num_warps=w,
                                    constexprs=dict(plan.constexprs, TILE=t))
            waves[f"tile={t},w={w}"] = lambda p=p: tops._launch(p, {"pool": bits, "src": src, "dst": dst}, scal)
        for name, fn in (("library", lib), ("one-row", one), *waves.items()):
            fn()
            out[f"{name} B={B}"] = tbps(moved, bench(fn))
            print(f"{name:8s} B={B:3d}: {out[f'{name} B={B}']:.3f} TB/s")
        src.fill_(-1)
        src[:4] = perm[:4]
        for name, fn in (("library", lib), ("persistent", waves["persistent"]),
                         ("divided", divided), ("chunked x1", waves["chunked x1"])):
            ms = bench(fn)
            print(f"{name:8s} B={B:3d}, 4 rows copy: {ms * 1e3:.1f} us ({tbps(moved * 4 / B, ms):.3f} TB/s)")
        src.fill_(-1)
        for name, fn in (("library", lib), ("persistent", waves["persistent"])):
            print(f"{name:8s} B={B:3d}, no row copies: {bench(fn) * 1e3:.1f} us")
    from mamba_align.kernels.copy import copy_temporal_kernel
    print("registers: library", regs(copy_temporal_kernel), "| one-row", regs(one_row_copy),
          "| persistent", regs(persistent_copy))
    del pool, bits
    torch.cuda.empty_cache()

    try:
        if not args.only_grids:
            out.update(jax_part(args.batches, L, nb, numel))
    except ImportError as e:
        print(f"JAX part skipped: {e}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


def jax_part(batches, L, nb, numel) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jax_device_time import device_ms
    from mamba_align.backends.jax import ops as jops

    out = {}
    jit_d = lambda f: jax.jit(f, donate_argnums=0)  # noqa: E731
    ours = jit_d(jops.copy_temporal)
    xla = jit_d(lambda p, s, d: p.at[:, d].set(p[:, s]))
    pool = jnp.zeros((L, nb, 32, 128, 128), jnp.float32)
    rng = np.random.default_rng(0)
    for B in batches:
        perm = rng.permutation(nb - 1) + 1
        src, dst = jnp.asarray(perm[:B], jnp.int32), jnp.asarray(perm[B:2 * B], jnp.int32)
        moved = 2 * B * L * numel * 4
        for name, f in (("jax", lambda p: ours(p, src, dst)), ("xla", lambda p: xla(p, src, dst))):
            ms, pool, by_name = device_ms(f, pool, n=10)
            out[f"{name} B={B}"] = tbps(moved, ms)
            print(f"{name:8s} B={B:3d}: {tbps(moved, ms):.3f} TB/s device ({ms:.3f} ms)")
            for k, v in sorted(by_name.items(), key=lambda kv: -kv[1]):
                print(f"     {v:8.3f} ms  {k[:90]}")
        text = xla.lower(pool, src, dst).compile().as_text()
        print(f"XLA scatter B={B}: fusions in the compiled HLO:")
        for line in text.splitlines():
            if " fusion(" in line or "custom-call(" in line or " copy(" in line:
                print("   ", line.strip()[:160])
    del pool
    step_hlo()
    return out


def step_hlo() -> None:
    """The XLA ops of a jitted pre-copy step besides our kernels (bench_dispatch's step)."""
    import jax

    from bench_dispatch import pool_shapes, setup
    from mamba_align.backends import jax as mj

    s = setup(small=False)
    cfg = s["config"]
    J = jax.numpy.asarray  # noqa: N806
    state = mj.init_state(s["slots"])
    pools = {n: jax.numpy.zeros(shape, cfg.states[n].dtype) for n, shape in pool_shapes(s).items()}
    step = jax.jit(mj.preprocess, static_argnames=("config", "mode"), donate_argnums=(0, 1))
    text = step.lower(state, pools, J(s["idx_mapping"]), J(s["query_len"]), J(s["is_spec"]),
                      J(s["block_table"]), config=cfg, mode="pre-copy").compile().as_text()
    print("jitted pre-copy step, compiled HLO (entry computation):")
    entry = text[text.find("ENTRY"):]
    for line in entry.splitlines()[:60]:
        print("   ", line.strip()[:200])


if __name__ == "__main__":
    main()

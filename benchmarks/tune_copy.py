"""Tiling study for the temporal state copy on the GPU (one-off tool, see BENCHMARKS.md).

Times variants of the temporal block copy on the Qwen3-Next-like pool (36 layers x 2 MiB
fp32 blocks) for several batch sizes, under CUDA-graph replay (kernel time only) and
eagerly (host launch cost included), plus the per-call host cost of the launch paths.
Prints one line per variant; ``--json`` saves them.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton
import triton.language as tl


@triton.jit
def tiled_copy(src_ptr, dst_ptr, num_layers, layer_stride, block_stride, block_numel, pool_ptr,
               TILE: tl.constexpr, TPP: tl.constexpr, HINTS: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    row = pid // num_layers
    layer = pid % num_layers
    src = tl.load(src_ptr + row).to(tl.int64)
    dst = tl.load(dst_ptr + row).to(tl.int64)
    if (src >= 0) & (dst >= 0) & (src != dst):
        base = layer * layer_stride
        start = tl.program_id(1).to(tl.int64) * (TILE * TPP)
        for t in tl.static_range(TPP):
            offs = start + t * TILE + tl.arange(0, TILE)
            m = offs < block_numel
            if HINTS:
                x = tl.load(pool_ptr + base + src * block_stride + offs, mask=m, eviction_policy="evict_first")
                tl.store(pool_ptr + base + dst * block_stride + offs, x, mask=m, cache_modifier=".cs")
            else:
                x = tl.load(pool_ptr + base + src * block_stride + offs, mask=m)
                tl.store(pool_ptr + base + dst * block_stride + offs, x, mask=m)


@triton.jit
def persistent_copy(src_ptr, dst_ptr, num_layers, layer_stride, block_stride, block_numel,
                    tiles_per_block, total, pool_ptr, TILE: tl.constexpr, HINTS: tl.constexpr):
    pid = tl.program_id(0)
    for w in range(pid, total, tl.num_programs(0)):
        w64 = w.to(tl.int64)
        rl = w64 // tiles_per_block
        tile = w64 % tiles_per_block
        row = rl // num_layers
        layer = rl % num_layers
        src = tl.load(src_ptr + row).to(tl.int64)
        dst = tl.load(dst_ptr + row).to(tl.int64)
        if (src >= 0) & (dst >= 0) & (src != dst):
            offs = tile * TILE + tl.arange(0, TILE)
            m = offs < block_numel
            base = layer * layer_stride
            if HINTS:
                x = tl.load(pool_ptr + base + src * block_stride + offs, mask=m, eviction_policy="evict_first")
                tl.store(pool_ptr + base + dst * block_stride + offs, x, mask=m, cache_modifier=".cs")
            else:
                x = tl.load(pool_ptr + base + src * block_stride + offs, mask=m)
                tl.store(pool_ptr + base + dst * block_stride + offs, x, mask=m)


@triton.jit
def split_copy(src_ptr, dst_ptr, num_layers, layer_stride, block_stride, chunks_per_program,
               pool_ptr, TILE: tl.constexpr, TPP: tl.constexpr, STAGES: tl.constexpr):
    # one row and layer per program on axis 0; axis 1 splits the block into runs of
    # chunks_per_program chunks of TPP tiles, copied in a runtime loop (block = whole chunks)
    pid = tl.program_id(0).to(tl.int64)
    row = pid // num_layers
    layer = pid % num_layers
    src = tl.load(src_ptr + row).to(tl.int64)
    dst = tl.load(dst_ptr + row).to(tl.int64)
    if (src >= 0) & (dst >= 0) & (src != dst):
        s_off = tl.multiple_of(layer * layer_stride + src * block_stride, 16)
        d_off = tl.multiple_of(layer * layer_stride + dst * block_stride, 16)
        first = tl.program_id(1).to(tl.int64) * chunks_per_program
        for c in tl.range(first, first + chunks_per_program, num_stages=STAGES):
            for t in tl.static_range(TPP):
                offs = (c * TPP + t) * TILE + tl.arange(0, TILE)
                x = tl.load(pool_ptr + s_off + offs, eviction_policy="evict_first")
                tl.store(pool_ptr + d_off + offs, x, cache_modifier=".cs")


@triton.jit
def group_copy(src_ptr, dst_ptr, num_rows, layer_stride, block_stride, pool_ptr,
               TILE: tl.constexpr, TPP: tl.constexpr, R: tl.constexpr):
    # axis 0: a chunk of TPP tiles, axis 1: layer, axis 2: a group of R rows. The program
    # copies its chunk of its layer for every row of its group that copies, visiting only
    # those rows (a min-reduction finds the next one), so a few copying rows among many
    # still spread over every chunk and layer.
    chunk = tl.program_id(0).to(tl.int64)
    layer = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(2).to(tl.int64) * R + tl.arange(0, R)
    inb = rows < num_rows
    s = tl.load(src_ptr + rows, mask=inb, other=-1).to(tl.int64)
    d = tl.load(dst_ptr + rows, mask=inb, other=-1).to(tl.int64)
    ok = inb & (s >= 0) & (d >= 0) & (s != d)
    BIG: tl.constexpr = 1 << 62
    todo = tl.where(ok, rows, BIG)
    n = tl.sum(ok.to(tl.int32))
    base = layer * layer_stride
    for _ in range(n):
        row = tl.min(todo)
        todo = tl.where(todo == row, BIG, todo)
        src = tl.load(src_ptr + row).to(tl.int64)
        dst = tl.load(dst_ptr + row).to(tl.int64)
        s_off = tl.multiple_of(base + src * block_stride, 16)
        d_off = tl.multiple_of(base + dst * block_stride, 16)
        for t in tl.static_range(TPP):
            offs = (chunk * TPP + t) * TILE + tl.arange(0, TILE)
            x = tl.load(pool_ptr + s_off + offs, eviction_policy="evict_first")
            tl.store(pool_ptr + d_off + offs, x, cache_modifier=".cs")


def group_grid(B: int, L: int, numel: int, tile: int, tpp: int, target: int) -> tuple:
    chunks = numel // (tile * tpp)
    r = 1
    while r < B and chunks * L * triton.cdiv(B, r) > target:
        r *= 2
    return (chunks, L, triton.cdiv(B, r)), r


def split_grid(B: int, L: int, numel: int, tile: int, tpp: int, target: int) -> tuple:
    chunks = numel // (tile * tpp)
    split = 1
    while split < chunks and B * L * split < target:
        split *= 2
    return (B * L, split), chunks // split


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--json")
    ap.add_argument("--split", action="store_true",
                    help="only the split-grid study: the best tiled variant vs split grids, "
                         "plus the cost of a launch in which no row copies")
    args = ap.parse_args()
    import mamba_align.backends.torch  # noqa: F401  registers torch.ops.mamba_align
    from mamba_align.backends.torch import ops

    L, nb = args.layers, 2 * max(args.batches) + 1
    pool = torch.empty((L, nb, 32, 128, 128), dtype=torch.float32, device="cuda")
    bits = pool.view(torch.int32)
    numel = 32 * 128 * 128
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = []

    # d2d ceiling on the same number of bytes as the largest batch
    n = max(args.batches) * L * numel
    a = torch.empty(n, dtype=torch.int32, device="cuda")
    b = torch.empty_like(a)
    ms = triton.testing.do_bench_cudagraph(lambda: b.copy_(a))
    ceiling = 2 * n * 4 / ms / 1e9
    print(f"d2d ceiling (graph): {ceiling:.3f} TB/s")
    del a, b

    variants = []
    for tile in (1024, 2048, 4096, 8192, 16384):
        for tpp in (1, 2, 4):
            for warps in (4, 8, 16):
                if tile * tpp > 32768 or tile // (32 * warps) < 4:
                    continue
                for hints in (True, False):
                    variants.append(("tiled", tile, tpp, warps, hints))
    for tile in (2048, 4096, 8192):
        for per_sm in (2, 4, 8, 16):
            for warps in (4, 8):
                variants.append(("persistent", tile, per_sm, warps, True))
    if args.split:
        variants = [("tiled", 1024, 4, 8, True)]
        variants += [("split", 1024, 4, 8, (16384, None))]
        variants += [("group", 1024, tpp, 8, target) for tpp in (1, 4)
                     for target in (4096, 16384)]

    for B in args.batches:
        perm = torch.randperm(nb - 1, device="cuda") + 1
        src, dst = perm[:B].clone(), perm[B : 2 * B].clone()  # own storage: src is refilled
        moved = 2 * B * L * numel * 4
        res = []
        for kind, tile, p, warps, hints in variants:
            if kind == "tiled":
                grid = (B * L, triton.cdiv(numel, tile * p))
                fn = lambda: tiled_copy[grid](src, dst, L, bits.stride(0), bits.stride(1), numel,  # noqa: E731
                                              bits, TILE=tile, TPP=p, HINTS=hints, num_warps=warps)
            elif kind == "group":  # "hints" holds the target program count
                grid, r = group_grid(B, L, numel, tile, p, hints)
                fn = lambda: group_copy[grid](src, dst, B, bits.stride(0), bits.stride(1), bits,  # noqa: E731
                                              TILE=tile, TPP=p, R=r, num_warps=warps)
            elif kind == "split":  # "hints" holds (target program count, loop stages)
                grid, cpp = split_grid(B, L, numel, tile, p, hints[0])
                fn = lambda: split_copy[grid](src, dst, L, bits.stride(0), bits.stride(1), cpp,  # noqa: E731
                                              bits, TILE=tile, TPP=p, STAGES=hints[1],
                                              num_warps=warps)
            else:
                tiles = triton.cdiv(numel, tile)
                total = B * L * tiles
                grid = (min(total, sms * p),)
                fn = lambda: persistent_copy[grid](src, dst, L, bits.stride(0), bits.stride(1),  # noqa: E731
                                                   numel, tiles, total, bits, TILE=tile, HINTS=hints,
                                                   num_warps=warps)
            fn()
            ms = triton.testing.do_bench_cudagraph(fn, rep=50)
            res.append((2 * 0 + moved / ms / 1e9, kind, tile, p, warps, hints, ms))
            if args.split:  # the same launch when no row / 4 rows copy (decode steps)
                src.fill_(-1)
                empty = triton.testing.do_bench_cudagraph(fn, rep=20)
                few = ""
                if B > 4:
                    src[:4] = perm[:4]
                    f_ms = triton.testing.do_bench_cudagraph(fn, rep=20)
                    few = f", 4 rows copy {f_ms * 1e3:.1f} us ({moved * 4 / B / f_ms / 1e9:.2f} TB/s)"
                src.copy_(perm[:B])
                print(f"  B={B} {kind} tile={tile} p={p} w={warps} {hints}: "
                      f"{moved / ms / 1e9:.3f} TB/s, empty launch {empty * 1e3:.1f} us{few}")
        res.sort(reverse=True)
        lib = lambda: torch.ops.mamba_align.copy_temporal_(pool, src, dst)  # noqa: E731
        lib_graph = triton.testing.do_bench_cudagraph(lib, rep=50)
        if args.split:
            src.fill_(-1)
            print(f"  B={B} library empty launch "
                  f"{triton.testing.do_bench_cudagraph(lib, rep=20) * 1e3:.1f} us")
            src.copy_(perm[:B])
        lib_eager = triton.testing.do_bench(lib, rep=50, return_mode="median")
        print(f"B={B}: library graph {moved / lib_graph / 1e9:.3f} TB/s, eager {moved / lib_eager / 1e9:.3f}")
        for r in res[:8]:
            print(f"  {r[0]:.3f} TB/s  {r[1]:10s} tile={r[2]:5d} p={r[3]:2d} warps={r[4]:2d} hints={r[5]} {r[6]*1e3:.1f} us")
        for r in res[-3:]:
            print(f"  worst {r[0]:.3f} TB/s  {r[1:]}")
        out.append({"batch": B, "ceiling_tbps": ceiling, "library_graph_tbps": moved / lib_graph / 1e9,
                    "library_eager_tbps": moved / lib_eager / 1e9,
                    "variants": [dict(zip(("tbps", "kind", "tile", "p", "warps", "hints", "ms"), r)) for r in res]})

    # host cost per call: custom op vs plain launch, on a tiny pool (GPU time negligible)
    tiny = torch.zeros((1, 4, 16), dtype=torch.float32, device="cuda")
    s1, d1 = torch.tensor([1], device="cuda"), torch.tensor([2], device="cuda")
    for name, f in (("torch.ops", lambda: torch.ops.mamba_align.copy_temporal_(tiny, s1, d1)),
                    ("python impl", lambda: ops.copy_temporal_._init_fn(tiny, s1, d1)),
                    ("raw kernel", lambda: tiled_copy[(1, 1)](s1, d1, 1, 64, 16, 16, tiny.view(torch.int32),
                                                              TILE=16, TPP=1, HINTS=True))):
        for _ in range(20):
            f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(500):
            f()
        torch.cuda.synchronize()
        us = (time.perf_counter() - t0) / 500 * 1e6
        print(f"host cost per call, {name}: {us:.1f} us")
        out.append({"host_path": name, "us_per_call": us})
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()

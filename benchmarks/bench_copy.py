"""GPU benchmark of the state-block pre-copy on Qwen3-Next-like pools.

For each batch size B, B rows copy a random source block into a random destination block
(all 2B ids distinct) in every layer of

- the temporal pool ``[L, NB, 32, 128, 128]`` fp32 (2 MiB per block): our
  ``mamba_align.backends.torch.ops.copy_temporal_`` vs ``pool[:, dst] = pool[:, src]`` vs
  ``pool.index_copy_(1, dst, pool.index_select(1, src))``;
- the conv pool ``[L, NB, 3, 8192]`` bf16 (SD layout), shifted by one row (bias 1): our
  ``mamba_align.backends.torch.ops.copy_conv_`` vs ``pool[:, dst, :W-1] = pool[:, src, 1:]``;
- both of our launches back to back (the whole pre-copy);
- then, with the torch pools freed, the same copies in JAX on the same ids: our kernels
  through ``mamba_align.backends.jax.ops`` vs the ``p.at[:, dst].set(p[:, src])`` scatter a
  JAX user would write, each in a ``jax.jit`` with the pool and the error flag donated
  (updated in place).

Bytes moved = read + write of the data copied (``2 * B * L * block_bytes``; for the conv
pool the ``W - 1`` rows that move). Times are ``triton.testing.do_bench`` medians; the
ceiling is a device-to-device ``b.copy_(a)`` of a contiguous buffer as large as the
biggest copy (at least 1 GiB), measured first in the same run. JAX times are host times
(:func:`host_ms`: median per-call time of back-to-back calls, one ``block_until_ready`` at
the end of each repetition), honest under asynchronous dispatch. Without a GPU the script
runs on CPU tensors (Triton interpreter) with a ``time.perf_counter`` timer: use
``--small`` for that smoke run.

Usage::

    python benchmarks/bench_copy.py [--out benchmarks/results] [--layers 36]
        [--batches 1 8 64 256] [--num-blocks NB] [--small] [--no-jax]

Writes ``copy_h200.json``, ``copy_h200.md`` and ``copy_h200.png`` under ``--out``; then
``python benchmarks/make_benchmarks_md.py`` rewrites ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from timing import bench_ms, d2d_ceiling, free, host_ms  # noqa: E402  (first: the package)
from make_benchmarks_md import tables_md  # noqa: E402
from jax_device_time import device_ms  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

from mamba_align.backends.torch import ops as tops  # noqa: E402

GIB = 1 << 30
FEW = 4  # rows that copy in the "few rows cross" decode case
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def record(method: str, pool: str, batch: int, layers: int, nbytes: int, ms: float,
           timing: str) -> Dict:
    return {"method": method, "pool": pool, "batch": batch, "layers": layers, "timing": timing,
            "bytes": nbytes, "ms": ms, "tbps": nbytes / (ms * 1e-3) / 1e12}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_BITS[t.element_size()])


# -- the benchmark ---------------------------------------------------------------------------
def pick_rows(batch: int, num_blocks: int, gen: torch.Generator, device: torch.device):
    ids = torch.randperm(num_blocks, generator=gen)[: 2 * batch].to(device)
    return ids[:batch].contiguous(), ids[batch:].contiguous()


def check_ours(temporal: torch.Tensor, conv: torch.Tensor, errors: torch.Tensor,
               src: torch.Tensor, dst: torch.Tensor, bias: torch.Tensor) -> None:
    """One launch of each of our copies; compare bit patterns with the saved sources."""
    saved = bits(temporal[:, src])  # advanced indexing returns a copy
    tops.copy_temporal_(temporal, errors, src, dst)
    if not torch.equal(bits(temporal[:, dst]), saved):
        raise SystemExit(f"copy_temporal_ is WRONG for B={src.numel()}: "
                         "pool[:, dst] != pool[:, src]")
    del saved
    w = conv.shape[2]
    saved = bits(conv[:, src, 1:])
    tops.copy_conv_(conv, errors, src, dst, bias, layout="SD")
    if not torch.equal(bits(conv[:, dst, : w - 1]), saved):
        raise SystemExit(f"copy_conv_ is WRONG for B={src.numel()}: pool[:, dst, :W-1] != "
                         "pool[:, src, 1:]")
    if errors[0].item():
        raise SystemExit(f"our copies flagged good ids as faults: {errors.tolist()}")


def run(args: argparse.Namespace) -> Dict[str, Any]:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    L, batches = args.layers, sorted(args.batches)
    nb = args.num_blocks or 2 * max(batches) + 1
    if nb < 2 * max(batches):
        raise SystemExit(f"--num-blocks {nb} < 2 * max(batches) = {2 * max(batches)}")
    t_block, c_block = tuple(args.temporal_block), tuple(args.conv_block)
    t_dtype, c_dtype = torch.float32, torch.bfloat16
    t_bytes = t_dtype.itemsize * torch.Size(t_block).numel()
    w, dim = c_block
    c_moved = (w - 1) * dim * c_dtype.itemsize  # per row and layer, bias = 1

    # 1. the ceiling first, with its own buffers (freed before the ~36 GiB pool exists)
    floor = 0 if args.small else GIB
    d2d = d2d_ceiling(max(floor, max(batches) * L * t_bytes), device, cuda)
    print(f"d2d ceiling: {d2d['tbps']:.3f} TB/s ({d2d['bytes'] / 2 / GIB:.2f} GiB copied)")

    # 2. the pools, allocated once for the largest batch
    gen = torch.Generator().manual_seed(0)
    temporal = torch.empty((L, nb) + t_block, dtype=t_dtype, device=device).normal_()
    conv = torch.empty((L, nb) + c_block, dtype=c_dtype, device=device).normal_()
    print(f"pools: temporal {list(temporal.shape)} {temporal.numel() * t_dtype.itemsize / GIB:.1f}"
          f" GiB, conv {list(conv.shape)} {conv.numel() * c_dtype.itemsize / GIB:.2f} GiB")

    errors = torch.tensor([0, 2**31 - 1], dtype=torch.int32, device=device)  # the error flag
    records: List[Dict[str, Any]] = []
    ids: Dict[int, tuple] = {}  # batch -> (src, dst) on the host, reused by the JAX section
    for b in batches:
        src, dst = pick_rows(b, nb, gen, device)
        ids[b] = (src.cpu().numpy(), dst.cpu().numpy())
        bias = torch.ones_like(src)
        check_ours(temporal, conv, errors, src, dst, bias)
        free(cuda)
        tb, cb = 2 * b * L * t_bytes, 2 * b * L * c_moved

        def idx_temporal() -> None:
            temporal[:, dst] = temporal[:, src]

        def idx_conv() -> None:
            conv[:, dst, : w - 1] = conv[:, src, 1:]

        # ours: the path StateRunner takes (the plain launcher; torch.ops under compile)
        def ours_temporal() -> None:
            tops.copy_temporal_(temporal, errors, src, dst)

        def ours_conv() -> None:
            tops.copy_conv_(conv, errors, src, dst, bias, layout="SD")

        def pre_copy() -> None:
            ours_temporal()
            ours_conv()

        cases = [
            ("ours", "temporal", tb, ours_temporal),
            ("torch_index", "temporal", tb, idx_temporal),
            ("index_copy", "temporal", tb,
             lambda: temporal.index_copy_(1, dst, temporal.index_select(1, src))),
            ("ours", "conv", cb, ours_conv),
            ("torch_index", "conv", cb, idx_conv),
            ("ours", "combined", tb + cb, pre_copy),
        ]
        for method, pool, nbytes, fn in cases:
            for timing in ("graph", "eager") if cuda else ("eager",):
                ms = bench_ms(fn, cuda, graph=timing == "graph")
                records.append(record(method, pool, b, L, nbytes, ms, timing))
                free(cuda)
                show(records[-1])
        # a decode step in which no row crosses: the launch runs, every row copies nothing
        none = torch.full_like(src, -1)
        ms = bench_ms(lambda: tops.copy_temporal_(temporal, errors, none, dst), cuda, graph=cuda)
        records.append(record("ours_no_copy", "temporal", b, L, 0, ms, "graph" if cuda else "eager"))
        show(records[-1])
        ms = bench_ms(lambda: tops.copy_conv_(conv, errors, none, dst, bias, layout="SD"), cuda,
                      graph=cuda)
        records.append(record("ours_no_copy", "conv", b, L, 0, ms, "graph" if cuda else "eager"))
        show(records[-1])
        if b > FEW:  # a decode step in which a few of the B rows cross a block boundary
            few = none.clone()
            few[:FEW] = src[:FEW]
            ms = bench_ms(lambda: tops.copy_temporal_(temporal, errors, few, dst), cuda, graph=cuda)
            records.append(record(f"ours_{FEW}_rows_copy", "temporal", b, L, 2 * FEW * L * t_bytes,
                                  ms, "graph" if cuda else "eager"))
            show(records[-1])

    del temporal, conv, cases
    free(cuda)
    jax_header = {} if args.no_jax else run_jax(args, cuda, nb, ids, records)

    header = {
        "device": torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "timer": ("graph: timing.graph_ms (do_bench_cudagraph's method, thread-local "
                  "capture: median, device time of a "
                  "CUDA-graph replay); eager: triton.testing.do_bench (median, host launch cost "
                  "included when it exceeds the kernel's time)" if cuda
                  else "time.perf_counter, median of 3 (CPU fallback, not a GPU number)"),
        "d2d": d2d,
        "config": {
            "layers": L, "num_blocks": nb, "batches": batches,
            "temporal_shape": [L, nb, *t_block], "temporal_block_bytes": t_bytes,
            "temporal_dtype": str(t_dtype).replace("torch.", ""),
            "conv_shape": [L, nb, *c_block], "conv_dtype": str(c_dtype).replace("torch.", ""),
            "conv_layout": "SD", "conv_bias": 1,
        },
        **jax_header,
    }
    return {"header": header, "records": records}


def show(r: Dict[str, Any]) -> None:
    print(f"B={r['batch']:4d} {r['pool']:9s} {r['method']:12s} {r['timing']:8s} {r['ms']:9.4f} ms "
          f"{r['tbps']:7.3f} TB/s")


# -- JAX -----------------------------------------------------------------------------------
def run_jax(args: argparse.Namespace, cuda: bool, nb: int, ids: Dict[int, tuple],
            records: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The same copies in JAX (pools ``jnp.zeros``, src blocks filled with random values per
    batch): ours (jax-triton) vs an XLA scatter, both jitted with the pool and the error
    flag donated. Appends ``timing="jax-host"`` records and, on the GPU, ``timing="jax-device"``
    ones (GPU busy time from a profiler trace, and what it is made of); returns header
    fields (empty when JAX is unavailable)."""
    try:
        import jax
        import jax.numpy as jnp
        from mamba_align.backends.jax import ops as jops
    except ImportError as e:
        print(f"JAX section skipped: {e}")
        return {}
    if cuda != (jax.default_backend() == "gpu"):
        print(f"JAX section skipped: torch cuda={cuda} but jax backend {jax.default_backend()}")
        return {}
    L, w = args.layers, args.conv_block[0]
    jit_d = lambda f: jax.jit(f, donate_argnums=0)  # noqa: E731
    bitcast = lambda x: jax.lax.bitcast_convert_type(  # noqa: E731
        x, {2: jnp.int16, 4: jnp.int32}[x.dtype.itemsize])

    @jit_d
    def seed(pool, rows, key):
        """Random values into blocks ``rows`` of every layer (one layer at a time)."""
        def layer(l, p):
            v = jax.random.normal(jax.random.fold_in(key, l), rows.shape + p.shape[2:], p.dtype)
            return p.at[l, rows].set(v)
        return jax.lax.fori_loop(0, pool.shape[0], layer, pool)

    saved_t = jax.jit(lambda p, s: bitcast(p[:, s]))
    same_t = jax.jit(lambda p, d, saved: jnp.array_equal(bitcast(p[:, d]), saved))
    saved_c = jax.jit(lambda p, s: bitcast(p[:, s, 1:]))
    same_c = jax.jit(lambda p, d, saved: jnp.array_equal(bitcast(p[:, d, : w - 1]), saved))
    # Every timed call takes and returns (pool, error flag), both donated, as a serving loop
    # threads them: a flag captured by the jitted function would be a constant, which the
    # in-place custom call cannot write, so XLA would copy it on every call.
    clear = [0, 2**31 - 1]  # the error flag, clear (the ids are good)
    both = lambda out: (out["pool"], out["errors"])  # noqa: E731
    ours_t = jit_d(lambda c, s, d: both(jops.copy_temporal(c[0], c[1], s, d)))
    xla_t = jit_d(lambda c, s, d: (c[0].at[:, d].set(c[0][:, s]), c[1]))
    ours_c = jit_d(lambda c, s, d, b: both(jops.copy_conv(c[0], c[1], s, d, b, layout="SD")))
    xla_c = jit_d(lambda c, s, d: (c[0].at[:, d, : w - 1].set(c[0][:, s, 1:]), c[1]))

    pools = {"temporal": jnp.zeros((L, nb, *args.temporal_block), jnp.float32),
             "conv": jnp.zeros((L, nb, *args.conv_block), jnp.bfloat16)}
    t_bytes = 4 * math.prod(args.temporal_block)
    c_moved = 2 * (w - 1) * args.conv_block[1]
    timer = dict(reps=2, n0=2, min_s=0.0) if args.small else {}
    key = jax.random.key(0)
    for b in sorted(ids):
        src, dst = (jnp.asarray(x, jnp.int32) for x in ids[b])
        bias = jnp.ones_like(src)
        cases = {
            "temporal": [("jax", lambda p: ours_t(p, src, dst)),
                         ("xla_scatter", lambda p: xla_t(p, src, dst))],
            "conv": [("jax", lambda p: ours_c(p, src, dst, bias)),
                     ("xla_scatter", lambda p: xla_c(p, src, dst))],
        }
        checks = {"temporal": (saved_t, same_t), "conv": (saved_c, same_c)}
        for pool, methods in cases.items():
            pools[pool] = seed(pools[pool], src, jax.random.fold_in(key, b))
            save, same = checks[pool]
            saved = save(pools[pool], src)
            carry = methods[0][1]((pools[pool], jnp.array(clear, jnp.int32)))
            if not bool(same(carry[0], dst, saved)):
                raise SystemExit(f"JAX copy of the {pool} pool is WRONG for B={b}")
            del saved
            nbytes = 2 * b * L * (t_bytes if pool == "temporal" else c_moved)
            for method, fn in methods:
                ms, carry = host_ms(fn, carry, jax.block_until_ready, **timer)
                records.append(record(method, pool, b, L, nbytes, ms, "jax-host"))
                show(records[-1])
                if cuda:  # the GPU's busy time per call, from a profiler trace
                    ms, carry, by_name = device_ms(fn, carry, n=10)
                    records.append(record(method, pool, b, L, nbytes, ms, "jax-device"))
                    records[-1]["ms_by_activity"] = by_name  # what the busy time is made of
                    show(records[-1])
            if carry[1].tolist() != clear:
                raise SystemExit(f"JAX copies of the {pool} pool flagged faults: {carry[1]}")
            pools[pool] = carry[0]
            del carry
    del pools
    try:
        from importlib.metadata import version
        jt = version("jax-triton")
    except Exception:  # not installed (CPU runs use the interpreter bridge)
        jt = None
    return {"jax": jax.__version__, "jax_triton": jt, "jax_backend": jax.default_backend(),
            "jax_timer": "jax-host: perf_counter around back-to-back jitted calls (pool "
                         "and error flag donated), block_until_ready on the last output; "
                         "median per-call "
                         "time of " + ("2 repetitions (CPU smoke run)" if args.small else
                                       "5 repetitions of >= 20 calls and >= 50 ms")}


# -- output ------------------------------------------------------------------------------------
def plot(data: Dict[str, Any], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed: skipping {path}")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: Dict[tuple, List[tuple]] = {}
    shown = "graph" if any(r.get("timing") == "graph" for r in data["records"]) else "eager"
    jax_timing = "jax-device" if any(r.get("timing") == "jax-device" for r in data["records"]) \
        else "jax-host"
    for r in data["records"]:
        timing = r.get("timing", "eager")
        if timing in (shown, jax_timing) and r["method"] != "ours_no_copy":
            series.setdefault((r["pool"], r["method"], timing), []).append((r["batch"], r["tbps"]))
    for (pool, method, timing), pts in series.items():
        pts.sort()
        jx = timing.startswith("jax")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", linestyle="--" if jx else "-",
                label=f"{pool}: {method}" + (f" ({timing})" if jx else ""))
    d2d = data["header"]["d2d"]["tbps"]
    ax.axhline(d2d, color="black", linestyle="--", label=f"d2d copy_ ({d2d:.2f} TB/s)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(data["header"]["config"]["batches"])
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("batch rows B")
    ax.set_ylabel("TB/s (read + write)")
    ax.set_title(f"State-block pre-copy, {data['header']['device']} ({shown} timing)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "results", help="output directory")
    ap.add_argument("--layers", type=int, help="layers L (default 36, --small: 2)")
    ap.add_argument("--batches", type=int, nargs="+", help="batch sizes (default 1 8 64 256)")
    ap.add_argument("--num-blocks", type=int, help="blocks NB per pool (default 2*max(B)+1)")
    ap.add_argument("--small", action="store_true",
                    help="quick smoke run: 2 layers, blocks [2,8,8] / [3,32], batches 1 2")
    ap.add_argument("--no-jax", action="store_true", help="skip the JAX section")
    args = ap.parse_args(argv)
    small = args.small
    args.layers = args.layers or (2 if small else 36)
    args.batches = args.batches or ([1, 2] if small else [1, 8, 64, 256])
    args.temporal_block = [2, 8, 8] if small else [32, 128, 128]
    args.conv_block = [3, 32] if small else [3, 8192]
    return args


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    data = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "copy_h200.json").write_text(json.dumps(data, indent=1) + "\n")
    table = tables_md(data)
    (args.out / "copy_h200.md").write_text(table + "\n")
    plot(data, args.out / "copy_h200.png")
    print()
    print(table)
    print(f"\nwrote {args.out}/copy_h200.{{json,md,png}}")


if __name__ == "__main__":
    main()

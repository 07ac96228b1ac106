"""What the benchmarks share: the package made importable from a checkout, and the timers.

Imported first by every benchmark script (``from timing import ...``): it registers the
torch ops (which picks Triton's interpreter when there is no GPU, so before triton is
imported) and, when the package is not installed, loads the repository root as
``mamba_align``.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before jax is imported

import contextlib  # noqa: E402
import importlib  # noqa: E402
import importlib.util  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Dict, Iterator, Optional, Tuple  # noqa: E402

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent


def import_package() -> None:
    """Register ``torch.ops.mamba_align.*`` (this also picks the Triton interpreter when
    there is no GPU, so it runs before triton is imported). Falls back to loading the
    repository root as ``mamba_align`` when the package is not installed."""
    try:
        import mamba_align.backends.torch  # noqa: F401
    except ImportError:
        root = HERE.parent
        spec = importlib.util.spec_from_file_location(
            "mamba_align", root / "__init__.py", submodule_search_locations=[str(root)])
        module = importlib.util.module_from_spec(spec)
        sys.modules["mamba_align"] = module
        spec.loader.exec_module(module)
        importlib.import_module("mamba_align.backends.torch")
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


import_package()
import triton.testing  # noqa: E402


def bench_ms(fn: Callable[[], Any], cuda: bool, graph: bool = False) -> float:
    """Median time of ``fn`` in ms on the GPU: replayed from a CUDA graph (``graph``: device
    time only, as in a captured serving step) or launched eagerly (host launch cost
    included when it exceeds the kernel's time). On CPU: a few perf_counter runs."""
    if cuda and graph:
        return graph_ms(fn)
    if cuda:
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def captured(step: Callable[[], Any], warmups: int = 3) -> "torch.cuda.CUDAGraph":
    """One call of ``step`` captured in a CUDA graph, after ``warmups`` calls on a side
    stream (as capture requires); thread-local capture, as in :func:`graph_ms`."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        step()
    return graph


def graph_ms(fn: Callable[[], Any], rep: float = 100.0, replays: int = 10) -> float:
    """``triton.testing.do_bench_cudagraph(fn, rep, return_mode="median")``, captured in
    thread-local mode: the median over ``replays`` replays of one graph of as many calls of
    ``fn`` as take about ``rep`` ms, per call. In the default global mode a CUDA call from
    another thread of the process (JAX's runtime keeps some) invalidates the capture: the
    recurrent benchmark, which runs JAX beside torch, failed that way twice."""
    with torch.cuda.stream(torch.cuda.Stream()):
        fn()  # warm-up (compiles)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            fn()
        end.record()
        torch.cuda.synchronize()
        estimate = start.elapsed_time(end) / 5
        n = 1000 if estimate == 0 else max(1, int(rep / estimate))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            for _ in range(n):
                fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(replays):
            start.record()
            g.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / n)
    return statistics.median(times)


def host_ms(step: Callable[[Any], Any], carry: Any, sync: Callable[[Any], Any], reps: int = 5,
            n0: int = 20, min_s: float = 0.05) -> tuple:
    """Host-timed median per-call time of ``carry = step(carry)`` in ms, and the last carry.

    One warm-up call (compiles), then ``reps`` repetitions of ``n`` back-to-back calls with
    ``sync`` (``jax.block_until_ready`` / a device synchronize) on the final output only:
    with asynchronous dispatch this times whichever is slower, the host dispatch or the
    device. ``n >= n0`` is chosen so that a repetition takes ``>= min_s`` seconds."""
    carry = sync(step(carry))

    def timed(n: int, carry: Any) -> tuple:
        t0 = time.perf_counter()
        for _ in range(n):
            carry = step(carry)
        carry = sync(carry)
        return time.perf_counter() - t0, carry

    dt, carry = timed(n0, carry)
    n = max(n0, math.ceil(n0 * min_s / max(dt, 1e-9)))
    times = []
    for _ in range(reps):
        dt, carry = timed(n, carry)
        times.append(dt / n * 1e3)
    return statistics.median(times), carry


def free(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def d2d_ceiling(nbytes: int, device: torch.device, cuda: bool) -> Dict[str, Any]:
    """``b.copy_(a)`` of ``nbytes`` contiguous bytes (2 * nbytes moved); buffers freed."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 256)
    b = torch.empty_like(a)
    ms = bench_ms(lambda: b.copy_(a), cuda)
    del a, b
    free(cuda)
    return {"bytes": 2 * nbytes, "ms": ms, "tbps": 2 * nbytes / (ms * 1e-3) / 1e12}


def parse_variant(text: str) -> Tuple[str, Dict[str, int]]:
    """``NAME:module.ATTR=INT,...`` -> ``(NAME, {"module.ATTR": INT})``; the name must be
    given and must not be ``current`` (the package's own constants)."""
    name, _, sets = text.partition(":")
    if not name or name == "current":
        raise ValueError(f"a variant needs a name other than 'current': {text!r}")
    return name, {k: int(v) for k, v in (kv.split("=") for kv in sets.split(",") if kv)}


def _clear_plan_caches() -> None:
    from mamba_align import kernels as K  # after import_package
    K.clear_plan_caches()


@contextlib.contextmanager
def constants(sets: Dict[str, int]) -> Iterator[None]:
    """``mamba_align`` module constants set for the block (every one must exist), every
    plan cache cleared on the way in and out; the old values are restored even when the
    block or a later assignment fails."""
    targets = []
    for key in sets:
        mod, attr = key.rsplit(".", 1)
        m = importlib.import_module(f"mamba_align.{mod}")
        targets.append((m, attr, getattr(m, attr)))  # AttributeError before any change
    try:
        for (m, attr, _), value in zip(targets, sets.values()):
            setattr(m, attr, value)
        _clear_plan_caches()
        yield
    finally:
        for m, attr, old in reversed(targets):
            setattr(m, attr, old)
        _clear_plan_caches()


def dist_version(dist: str) -> Optional[str]:
    """The installed version of distribution ``dist`` (e.g. ``"fla-core"``), or None."""
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:  # noqa: BLE001
        return None


def results_folder(out: Optional[Path], small: bool, prefix: str) -> Path:
    """Where a benchmark writes: ``out`` if given, else ``benchmarks/results``, or with
    ``small`` a new temporary folder (a smoke run never overwrites the recorded GPU
    results); created."""
    if out is None:
        import tempfile
        out = Path(tempfile.mkdtemp(prefix=prefix)) if small \
            else Path(__file__).resolve().parent / "results"
    out.mkdir(parents=True, exist_ok=True)
    return out

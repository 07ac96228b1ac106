"""Host dispatch cost of one bookkeeping step (preprocess + pre-copy + resolve, then
postprocess + its copies).

A decode batch in which no row reaches a block boundary: every slot is seeded with one
computed token, each row schedules ``1 + S`` tokens and accepts 2, and the block size is
so large (2^20) that every step stays in column 0: the copy launches run but copy nothing,
and the step can be repeated as is. Ways:

- ``jax_jit``: one ``jax.jit`` of ``mamba_align.backends.jax.preprocess`` + ``postprocess``
  (config and mode static, state and pools donated), host timer :func:`timing.host_ms`
  (back-to-back calls, ``block_until_ready`` on the last output);
- ``torch_eager``: ``StateRunner.preprocess`` + ``postprocess``, same host timer with a
  final synchronize;
- ``torch_graph``: the same call captured once in a CUDA graph, ``graph.replay()`` timed
  the same way (GPU only);
- ``*_checked``: the checked mode (``validate=True``): torch eager (a trial launch on copies
  and one synchronisation per step) and the jitted JAX step through ``checkify``.

Usage::

    python benchmarks/bench_dispatch.py [--out benchmarks/results] [--small] [--label L]

Writes ``dispatch_h200.json`` (``dispatch_<L>_h200.json`` with a label) under ``--out``;
``make_benchmarks_md.py`` adds it to ``BENCHMARKS.md``. ``--small`` (CPU smoke run, Triton
interpreter): tiny pools, few calls. The same script runs on an earlier version of the
package (``PYTHONPATH`` first), for a same-run baseline: variants that version lacks are
left out.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before jax is imported

import argparse
import datetime
import inspect
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from timing import captured, dist_version, host_ms  # noqa: E402  (makes mamba_align
#                                                               importable, too)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import checkify  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402

from mamba_align.backends import jax as mj  # noqa: E402
from mamba_align.backends.torch import StateRunner  # noqa: E402
from mamba_align.core import CacheConfig, ConvSpec, TemporalSpec  # noqa: E402

SCAN = 16  # steps per jitted lax.scan in the decode-loop variant
#: XLA flag of the "+cmdbuf" variants: capture even single commands in CUDA graphs
CMDBUF_FLAGS = "--xla_gpu_graph_min_graph_size=1"
SLOT_FIELDS = ("temporal_read", "conv_read", "conv_read_bias", "temporal_write", "conv_write")


def setup(small: bool, rows: int = 64) -> Dict[str, Any]:
    """Config and host inputs: ``rows`` live slots spread over ``slots``, each with its own
    ``1 + S`` blocks in the block table (0 = null block), one computed token per slot."""
    B, S, slots, layers = 1 << 20, 3, max(256, rows), 2
    conv = ConvSpec(4, 32 if small else 8192, "SD", "bfloat16")
    ssm = TemporalSpec((2, 8, 8) if small else (32, 128, 128))
    config = CacheConfig(B, S, layers, {"conv": conv, "ssm": ssm})
    cols = config.columns_needed(1 + 1 + S)  # 1 computed + 1 + S scheduled tokens
    live = np.arange(rows, dtype=np.int32) * (slots // rows)
    table = np.zeros((slots, cols), np.int32)
    table[live] = 1 + np.arange(rows * cols, dtype=np.int32).reshape(rows, cols)
    return {"config": config, "slots": slots, "num_blocks": rows * cols + 1, "live": live,
            "idx_mapping": live, "query_len": np.full(rows, 1 + S, np.int32),
            "is_spec": np.ones(rows, bool), "block_table": table,
            "num_computed": np.ones(rows, np.int32), "num_sampled": np.full(rows, 2, np.int32)}


CHECKED = "validate" in inspect.signature(mj.preprocess).parameters  # this version has it


def jax_step(state, pools, idx, q, spec, bt, ns, *, config, validate=False):
    """One whole step, as a jitted serving loop would run it."""
    kw = {"validate": True} if validate else {}
    state, pools, blocks = mj.preprocess(state, pools, idx, q, spec, bt, config=config,
                                         mode="pre-copy", **kw)
    state, pools, cache = mj.postprocess(state, pools, idx, q, spec, ns, bt, config=config, **kw)
    return state, pools, blocks


def pool_shapes(s: Dict[str, Any]) -> Dict[str, tuple]:
    cfg = s["config"]
    return {n: cfg.pool_shape(n, s["num_blocks"]) for n in cfg.states}


def enqueue_ms(step: Callable[[Any], Any], carry: Any, sync: Callable[[Any], Any],
               n: int = 100, reps: int = 5) -> tuple:
    """Host cost of *issuing* one step (the dispatch): median over ``reps`` of the time to
    call ``carry = step(carry)`` ``n`` times without waiting for the device, per call. The
    device catches up (``sync``) outside the timed region."""
    carry = sync(step(carry))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            carry = step(carry)
        times.append((time.perf_counter() - t0) / n * 1e3)
        carry = sync(carry)
    return statistics.median(times), carry


def run_jax(s: Dict[str, Any], timer: Dict[str, Any]) -> tuple:
    """Per-step ms of the jitted step (sustained, dispatch), the same step inside a jitted
    ``lax.scan`` of ``SCAN`` steps (per step), JAX's own floor (a jitted ``x + 1``), and the
    resolved slots (host) after the first step."""
    cfg = s["config"]
    J = jnp.asarray  # noqa: N806
    inputs = (J(s["idx_mapping"]), J(s["query_len"]), J(s["is_spec"]), J(s["block_table"]),
              J(s["num_sampled"]))
    state = jax.jit(mj.add_requests, static_argnames="config")(
        mj.init_state(s["slots"]), J(s["live"]), J(s["num_computed"]), config=cfg)
    seeded = np.asarray(state.state_idx)
    pools = {n: jnp.zeros(shape, cfg.states[n].dtype) for n, shape in pool_shapes(s).items()}
    step = jax.jit(jax_step, static_argnames=("config", "validate"), donate_argnums=(0, 1))
    state, pools, slots = step(state, pools, *inputs, config=cfg)
    first = {f: np.asarray(getattr(slots, f)) for f in SLOT_FIELDS}
    if not np.array_equal(np.asarray(state.state_idx), seeded):
        raise SystemExit("JAX preprocess moved a row: the batch is not crossing-free")
    fn = lambda c: step(c[0], c[1], *inputs, config=cfg)  # noqa: E731
    ms, carry = host_ms(fn, (state, pools, slots), jax.block_until_ready, **timer)
    enq, (state, pools, _) = enqueue_ms(fn, carry, jax.block_until_ready, n=timer["n0"],
                                        reps=timer["reps"])
    out = {"jax_jit": (ms, enq)}

    def body(c, _):  # a decode loop: SCAN steps in one jitted call
        st, p, _blocks = jax_step(c[0], c[1], *inputs, config=cfg)
        return (st, p), None

    scan = jax.jit(lambda c: jax.lax.scan(body, c, None, length=SCAN)[0], donate_argnums=0)
    ms, carry = host_ms(scan, (state, pools), jax.block_until_ready, **timer)
    enq, (state, pools) = enqueue_ms(scan, carry, jax.block_until_ready, n=max(2, timer["n0"] // 4),
                                     reps=timer["reps"])
    out[f"jax_scan{SCAN}_per_step"] = (ms / SCAN, enq / SCAN)
    if not np.array_equal(np.asarray(state.state_idx), seeded):
        raise SystemExit("JAX state_idx changed over repeated steps")

    out["jax_floor_x_plus_1"] = floor(timer)
    if not CHECKED:
        return out, first

    def checked(st, p):  # the checked mode: faults come back in checkify's error
        return jax_step(st, p, *inputs, config=cfg, validate=True)

    cstep = jax.jit(checkify.checkify(checked), donate_argnums=(0, 1))

    def cfn(c):
        err, (st, p, _) = cstep(c[0], c[1])
        return st, p, err

    csync = lambda c: (jax.block_until_ready(c[:2]), c)[1]  # noqa: E731
    ms, (state, pools, err) = host_ms(cfn, (state, pools, None), csync, **timer)
    if err.get() is not None:
        raise SystemExit(f"the checked JAX step faulted: {err.get()}")
    enq, (state, pools, _) = enqueue_ms(cfn, (state, pools, None), csync, n=timer["n0"],
                                        reps=timer["reps"])
    out["jax_jit_checked"] = (ms, enq)
    return out, first


def floor(timer: Dict[str, Any]) -> tuple:
    """What any jitted call costs on this host: a donated ``x + 1`` on int32[64]."""
    inc = jax.jit(lambda a: a + 1, donate_argnums=0)
    x = jnp.zeros(64, jnp.int32)
    ms, x = host_ms(inc, x, jax.block_until_ready, **timer)
    return ms, enqueue_ms(inc, x, jax.block_until_ready, n=timer["n0"], reps=timer["reps"])[0]


def torch_step(s: Dict[str, Any], dev: torch.device) -> tuple:
    """A seeded ``StateRunner`` on ``dev`` and one whole step on it (``step(_=None)``
    returns the step's blocks): the torch step every variant times."""
    cfg = s["config"]
    T = lambda a: torch.as_tensor(a, device=dev)  # noqa: E731, N806
    runner = StateRunner(cfg, s["slots"], dev, "pre-copy", torch.int32)
    runner.add_requests(T(s["live"]), T(s["num_computed"]))
    pools = {n: torch.zeros(shape, dtype=getattr(torch, cfg.states[n].dtype), device=dev)
             for n, shape in pool_shapes(s).items()}
    idx, q, spec, bt = (T(s[k]) for k in ("idx_mapping", "query_len", "is_spec", "block_table"))
    ns = T(s["num_sampled"])

    def step(_=None):
        blocks = runner.preprocess(pools, idx, q, spec, bt)
        runner.postprocess(pools, idx, q, spec, ns, bt)
        return blocks

    return runner, step


def run_torch(s: Dict[str, Any], cuda: bool, timer: Dict[str, Any]) -> tuple:
    """Per-step ms eager (and CUDA-graph replay on the GPU), and the slots of the first step."""
    runner, step = torch_step(s, torch.device("cuda" if cuda else "cpu"))
    seeded = runner.state_idx.clone()
    slots = step()
    first = {f: getattr(slots, f).cpu().numpy() for f in SLOT_FIELDS}
    sync = (lambda c: (torch.cuda.synchronize(), c)[1]) if cuda else (lambda c: c)
    ms = {"torch_eager": (host_ms(step, None, sync, **timer)[0],
                          enqueue_ms(step, None, sync, n=timer["n0"], reps=timer["reps"])[0])}
    if CHECKED:  # the checked mode: a trial launch and a sync per kernel
        runner.validate = True
        ms["torch_eager_checked"] = (host_ms(step, None, sync, **timer)[0],
                                     enqueue_ms(step, None, sync, n=timer["n0"],
                                                reps=timer["reps"])[0])
        runner.validate = False
    if cuda:
        graph = captured(step)
        replay = lambda c: graph.replay()  # noqa: E731
        ms["torch_graph"] = (host_ms(replay, None, sync, **timer)[0],
                             enqueue_ms(replay, None, sync, n=timer["n0"], reps=timer["reps"])[0])
    if not torch.equal(runner.state_idx, seeded):
        raise SystemExit("torch state_idx changed over repeated steps")
    if CHECKED and runner.errors():
        raise SystemExit(f"the torch steps faulted: {runner.errors()}")
    return ms, first


def run(args: argparse.Namespace) -> Dict[str, Any]:
    cuda = torch.cuda.is_available()
    if cuda != (jax.default_backend() == "gpu"):
        raise SystemExit(f"torch cuda={cuda} but jax backend {jax.default_backend()}")
    s = setup(args.small, args.rows)
    timer = dict(reps=2, n0=2, min_s=0.0) if args.small else dict(reps=5, n0=20, min_s=0.05)
    jax_ms, j_slots = run_jax(s, timer)  # {method: (sustained ms, enqueue ms)}
    if args.jax_only:  # the child of the command-buffer variant: print and stop
        print(json.dumps({m: list(v) for m, v in jax_ms.items()}))
        return {}
    torch_ms, t_slots = run_torch(s, cuda, timer)
    for f in SLOT_FIELDS:
        if not np.array_equal(j_slots[f].astype(np.int64), t_slots[f].astype(np.int64)):
            raise SystemExit(f"JAX and torch disagree on {f}")
    if cuda:  # XLA flags are read once per process: the variant runs in a child
        env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + CMDBUF_FLAGS).strip())
        r = subprocess.run([sys.executable, __file__, "--jax-only", "--rows", str(args.rows)],
                           env=env, capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"command-buffer variant failed:\n{r.stderr[-3000:]}")
        child = json.loads(r.stdout.strip().splitlines()[-1])
        jax_ms.update({f"{m}+cmdbuf": tuple(v) for m, v in child.items()})
    rows = len(s["idx_mapping"])
    records = [{"method": m, "us_per_step": v[0] * 1e3, "dispatch_us": v[1] * 1e3, "rows": rows}
               for m, v in {**jax_ms, **torch_ms}.items()]
    cfg = s["config"]
    header = {
        "device": torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)",
        "torch": torch.__version__, "triton": triton.__version__, "jax": jax.__version__,
        "jax_backend": jax.default_backend(), "jax_triton": dist_version("jax-triton"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "step": "preprocess + pre-copy + resolve, postprocess + copies (no row reaches a "
                "boundary: the copy launches copy nothing)",
        "package": str(Path(mj.__file__).resolve().parents[2]),
        "timer": "dispatch: host time to issue one step (calls not waited for); per step: "
                 "perf_counter around back-to-back calls, one block_until_ready / "
                 "torch.cuda.synchronize after the last (the slower of host and device); "
                 "medians of " + ("2 repetitions (CPU smoke run)" if args.small
                                  else "5 repetitions of >= 20 calls"),
        "variants": {f"jax_scan{SCAN}_per_step": f"{SCAN} steps in one jitted lax.scan, "
                                                  f"divided by {SCAN}",
                     "jax_floor_x_plus_1": "a jitted, donated x + 1 on int32[64]: what any "
                                           "jitted call costs on this host",
                     "+cmdbuf": f"the same in a process with XLA_FLAGS={CMDBUF_FLAGS}"},
        "cpu": _cpu_name(),
        "config": {"rows": rows, "num_slots": s["slots"], "block_size": cfg.block_size,
                   "num_spec": cfg.num_spec, "num_layers": cfg.num_layers,
                   "num_blocks": s["num_blocks"], "mode": "pre-copy",
                   "pools": {n: list(v) for n, v in pool_shapes(s).items()}},
    }
    return {"header": header, "records": records}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return "unknown"



def table(records: List[Dict[str, Any]]) -> str:
    lines = ["| method | dispatch µs | µs per step (sustained) | rows |", "|---|---:|---:|---:|"]
    lines += [f"| {r['method']} | {r.get('dispatch_us', float('nan')):.1f} | "
              f"{r['us_per_step']:.1f} | {r['rows']} |" for r in records]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "results", help="output directory")
    ap.add_argument("--small", action="store_true",
                    help="CPU smoke run: tiny pools, 2 repetitions of 2 calls")
    ap.add_argument("--jax-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--label", default="", help="output name: dispatch_<label>_h200.json")
    ap.add_argument("--rows", type=int, default=64, help="batch rows (slots: max(256, rows))")
    args = ap.parse_args(argv)
    data = run(args)
    if args.jax_only:
        return
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"dispatch_{args.label}_h200.json" if args.label else "dispatch_h200.json"
    (args.out / name).write_text(json.dumps(data, indent=1) + "\n")
    print(table(data["records"]))
    print(f"\nwrote {args.out}/{name}")


if __name__ == "__main__":
    main()

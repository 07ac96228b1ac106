"""Where does a jitted JAX step's host dispatch time go? (one-off probe, see BENCHMARKS.md)

Prints, on the GPU machine:

- the issue cost of a trivial jitted function for bursts of 4 to 256 calls (a long burst
  can stall on XLA's limit of computations in flight, so it measures the device, not the
  host);
- the issue cost of 1, 2 and 4 tiny jax-triton custom calls;
- the library's preprocess step (bench_dispatch.py's batch), in both modes, and a
  ``lax.scan`` over 16 such steps (per-step cost, device included);
- a cProfile of the step's host path, and the device activities of one step (profiler).

``--sweep`` runs the floor and the step again under a few ``XLA_FLAGS`` settings, each in
its own process.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import cProfile  # noqa: E402
import io  # noqa: E402
import pstats  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from bench_copy import host_ms  # noqa: E402
from bench_dispatch import enqueue_ms, pool_shapes, setup  # noqa: E402
from jax_device_time import device_ms  # noqa: E402
from mamba_align.backends import jax as mj  # noqa: E402


def issue_us(fn, carry, n, reps=7):
    """Median per-call host time (µs) to issue a burst of ``n`` calls (device idle at start)."""
    ms, carry = enqueue_ms(fn, carry, jax.block_until_ready, n=n, reps=reps)
    return ms * 1e3, carry


def wall_us(fn, carry, n, reps=5):
    """Median per-call time (µs) of ``n`` calls including the wait for the device."""
    ms, carry = host_ms(fn, carry, jax.block_until_ready, reps=reps, n0=n, min_s=0.0)
    return ms * 1e3, carry


def step_fns(s):
    cfg = s["config"]
    J = jnp.asarray  # noqa: N806
    inputs = (J(s["idx_mapping"]), J(s["query_len"]), J(s["is_spec"]), J(s["block_table"]))
    state = mj.add_requests(mj.init_state(s["slots"]), J(s["live"]), J(s["num_computed"]), cfg)
    pools = {n: jnp.zeros(shape, cfg.states[n].dtype) for n, shape in pool_shapes(s).items()}
    step = jax.jit(mj.preprocess, static_argnames=("config", "mode"), donate_argnums=(0, 1))

    def one(mode):
        return lambda c: step(c[0], c[1], *inputs, config=cfg, mode=mode)[:2]

    def body(c, _):
        st, p, _slots = mj.preprocess(c[0], c[1], *inputs, cfg, "pre-copy")
        return (st, p), None

    scan16 = jax.jit(lambda c: lax.scan(body, c, None, length=16)[0], donate_argnums=0)
    return (state, pools), one, scan16


def floor_and_step(label):
    x = jnp.zeros(64, jnp.int32)
    inc = jax.jit(lambda a: a + 1, donate_argnums=0)
    for n in (4, 16, 64, 256):
        us, x = issue_us(inc, x, n)
        print(f"[{label}] jit x+1 donated, burst {n}: {us:.1f} us/call")
    s = setup(small=False)
    carry, one, scan16 = step_fns(s)
    for mode in ("pre-copy", "copy-free"):
        for n in (4, 16, 64):
            us, carry = issue_us(one(mode), carry, n)
            print(f"[{label}] step {mode}, burst {n}: {us:.1f} us/call issue")
        us, carry = wall_us(one(mode), carry, 64)
        print(f"[{label}] step {mode}: {us:.1f} us/call sustained (device waited for)")
    us, carry = issue_us(scan16, carry, 4)
    print(f"[{label}] scan of 16 steps: {us:.1f} us to issue, {us / 16:.1f} us/step")
    us, carry = wall_us(scan16, carry, 8)
    print(f"[{label}] scan of 16 steps: {us / 16:.1f} us/step sustained")
    return carry, one


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--only-floor", action="store_true")
    args = ap.parse_args()
    label = os.environ.get("XLA_FLAGS", "default") or "default"
    carry, one = floor_and_step(label)
    if args.only_floor:
        return
    slots, nc = jnp.arange(64, dtype=jnp.int32), jnp.ones(64, jnp.int32)

    def k_calls(k):
        def f(st):
            for _ in range(k):
                st = mj.SlotArrays(*mj.ops.add_requests(*st, slots, nc, 64))
            return st
        return jax.jit(f, donate_argnums=0)

    for k in (1, 2, 4):
        us, _ = issue_us(k_calls(k), mj.init_state(256), 16)
        print(f"jit {k} tiny triton calls, burst 16: {us:.1f} us/call")

    fn = one("pre-copy")
    carry = jax.block_until_ready(fn(carry))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(100):
        carry = fn(carry)
    prof.disable()
    carry = jax.block_until_ready(carry)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
    print(buf.getvalue())

    ms, carry, by_name = device_ms(fn, carry, n=20)
    print(f"device time of one pre-copy step: {ms * 1e3:.1f} us")
    for name, v in sorted(by_name.items(), key=lambda kv: -kv[1]):
        print(f"   {v * 1e3:8.2f} us  {name[:100]}")

    if args.sweep:
        for flags in ("--xla_gpu_enable_command_buffer=",
                      "--xla_gpu_graph_min_graph_size=1",
                      "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL "
                      "--xla_gpu_graph_min_graph_size=1"):
            env = dict(os.environ, XLA_FLAGS=flags)
            r = subprocess.run([sys.executable, __file__, "--only-floor"], env=env,
                               capture_output=True, text=True)
            print(r.stdout)
            if r.returncode:
                print(r.stderr[-3000:])


if __name__ == "__main__":
    main()

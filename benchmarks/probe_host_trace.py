"""Where does the host time of one jitted JAX step go? (one-off probe, see BENCHMARKS.md)

Traces ``N`` back-to-back calls of bench_dispatch.py's step (pre-copy and copy-free) with
``jax.profiler`` and prints, per host event name, the number of events per call and the
host microseconds per call, largest first.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import glob  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402

from probe_jax_dispatch import setup, step_fns  # noqa: E402

N = 3 if "--small" in sys.argv else 30


def host_events(fn, carry, label):
    carry = jax.block_until_ready(fn(carry))
    carry = jax.block_until_ready(fn(carry))
    opts = jax.profiler.ProfileOptions()
    opts.host_tracer_level = 3
    opts.python_tracer_level = 0
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d, profiler_options=opts)
        for _ in range(N):
            carry = fn(carry)
        carry = jax.block_until_ready(carry)
        jax.profiler.stop_trace()
        data = jax.profiler.ProfileData.from_file(glob.glob(f"{d}/**/*.xplane.pb", recursive=True)[0])
    agg = {}
    for plane in data.planes:
        if not plane.name.startswith("/host"):
            continue
        for line in plane.lines:
            for e in line.events:
                key = (line.name[:24], e.name[:90])
                c, t = agg.get(key, (0, 0.0))
                agg[key] = (c + 1, t + e.duration_ns)
    print(f"== {label}: host events per call (of {N}), largest total first")
    for (ln, name), (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:45]:
        print(f"{t / N / 1e3:9.2f} us  x{c / N:5.1f}  [{ln}] {name}")
    return carry


def main() -> None:
    s = setup(small="--small" in sys.argv)
    carry, one, _ = step_fns(s)
    carry = host_events(one("pre-copy"), carry, "pre-copy step")
    host_events(one("copy-free"), carry, "copy-free step")


if __name__ == "__main__":
    main()

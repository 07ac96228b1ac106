"""Device time of jitted JAX calls, read from a ``jax.profiler`` trace (CUPTI).

A host timer around back-to-back jitted calls measures the slower of the host (dispatch)
and the device. To compare kernels launched from JAX with the same kernels launched from
torch (timed with CUDA events / graph replay), we need the GPU's own busy time: this
module traces ``n`` calls and sums, per call, the durations of the activities on the
device's stream lines (kernels, memcpys, memsets — so a copy XLA inserts counts against
the call that caused it).
"""

from __future__ import annotations

import glob
import tempfile
from typing import Any, Callable, Dict, List, Tuple


def _stream_events(path: str) -> List[Tuple[str, float, float]]:
    """(name, start_ns, duration_ns) of every activity on a GPU stream line."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(path)
    out = []
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            # "Stream #N(...)" lines hold the activities; "XLA Ops"/"XLA Modules" and
            # similar lines are derived from them and would count them twice.
            if not line.name.startswith("Stream"):
                continue
            out += [(e.name, e.start_ns, e.duration_ns) for e in line.events]
    return out


def device_ms(fn: Callable[[Any], Any], carry: Any, n: int = 20) -> Tuple[float, Any, Dict]:
    """Device time per call: total GPU busy time of ``n`` calls of
    ``carry = fn(carry)`` divided by ``n``, in ms. Also returns the final carry and the
    busy time per activity name (ms per call), for the report."""
    import jax  # optional for the benchmarks that import this module

    carry = jax.block_until_ready(fn(carry))  # compile and warm up outside the trace
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d)
        try:
            for _ in range(n):
                carry = fn(carry)
            carry = jax.block_until_ready(carry)
        finally:
            jax.profiler.stop_trace()
        files = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
        if not files:
            raise RuntimeError("jax.profiler wrote no trace")
        events = _stream_events(files[0])
    if not events:
        raise RuntimeError("the trace holds no GPU activity (CUPTI unavailable?)")
    by_name: Dict[str, float] = {}
    for name, _, dur in events:
        by_name[name] = by_name.get(name, 0.0) + dur / n / 1e6
    return sum(by_name.values()), carry, by_name

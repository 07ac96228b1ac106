"""Where does a jitted JAX step's host dispatch time go? (one-off probe, see BENCHMARKS.md)

Issue cost per call (calls not waited for) of: an empty-ish jitted function; one, two and
four custom calls of a tiny Triton kernel through jax-triton; the library's preprocess step
with its config static vs closed over; with and without donation.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from mamba_align import kernels as K  # noqa: E402
from mamba_align.backends import jax as mj  # noqa: E402
from mamba_align.core import CacheConfig, ConvSpec, TemporalSpec  # noqa: E402


def issue_us(fn, carry, n=200, reps=5):
    carry = jax.block_until_ready(fn(carry))
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            carry = fn(carry)
        out.append((time.perf_counter() - t0) / n * 1e6)
        carry = jax.block_until_ready(carry)
    return statistics.median(out)


def main() -> None:
    x = jnp.zeros(64, jnp.int32)
    print(f"jit x + 1: {issue_us(jax.jit(lambda a: a + 1), x):.1f} us")
    print(f"jit x + 1 donated: {issue_us(jax.jit(lambda a: a + 1, donate_argnums=0), x):.1f} us")
    slots, nc = jnp.arange(64, dtype=jnp.int32), jnp.ones(64, jnp.int32)

    def k_calls(k):
        def f(s):
            for _ in range(k):
                s = mj.SlotArrays(*mj.ops.add_requests(*s, slots, nc, 64))
            return s
        return f

    for k in (1, 2, 4, 8):
        fresh = mj.init_state(256)
        print(f"jit {k} triton calls: {issue_us(jax.jit(k_calls(k), donate_argnums=0), fresh):.1f} us")

    cfg = CacheConfig(64, 3, 2, {"conv": ConvSpec(4, 8192, "SD", "bfloat16"),
                                 "ssm": TemporalSpec((32, 128, 128))})
    rows, nb = 64, 257
    pools = {n: jnp.zeros(cfg.pool_shape(n, nb), jnp.bfloat16 if n == "conv" else jnp.float32)
             for n in cfg.states}
    J = lambda a: jnp.asarray(np.asarray(a), jnp.int32)  # noqa: E731
    idx, q = J(np.arange(rows) * 4), J(np.full(rows, 4))
    spec = jnp.ones(rows, bool)
    bt = J((np.arange(256 * 8) % (nb - 1) + 1).reshape(256, 8))
    state = mj.add_requests(mj.init_state(256), idx, J(np.ones(rows)), cfg)

    static = jax.jit(mj.preprocess, static_argnames=("config", "mode"), donate_argnums=(0, 1))
    f_static = lambda c: static(c[0], c[1], idx, q, spec, bt, config=cfg, mode="pre-copy")[:2]  # noqa: E731
    print(f"preprocess, config static, donated: {issue_us(f_static, (state, pools)):.1f} us")
    closed = jax.jit(lambda s, p: mj.preprocess(s, p, idx, q, spec, bt, cfg, "pre-copy")[:2],
                     donate_argnums=(0, 1))
    print(f"preprocess, config closed over, donated: {issue_us(lambda c: closed(*c), (state, pools)):.1f} us")
    plain = jax.jit(lambda s, p: mj.preprocess(s, p, idx, q, spec, bt, cfg, "copy-free")[:2])
    print(f"preprocess copy-free (2 triton calls), not donated: {issue_us(lambda c: plain(*c), (state, pools)):.1f} us")
    print(f"plan cache: {K.plan_copy_temporal.cache_info()}")


if __name__ == "__main__":
    main()

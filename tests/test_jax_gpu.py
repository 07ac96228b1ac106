"""GPU-only properties of the JAX backend (run by ``make gpu`` on the device machine).

Pools past 2^31 elements through jax-triton: the kernels' offsets are 64-bit, and a stride
of 2^31 elements or more reaches the kernel as a u32 scalar (below 2^32) or an i64 one.
Scalars are Python ints handed to jax-triton, so this needs no ``jax_enable_x64``.
"""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs JAX on a GPU (make gpu)"),
]


def _clear():
    return jnp.array([0, 2**31 - 1], jnp.int32)  # a clear error flag


def _pattern(shape, seed):
    """int8 content from a hash of each element's flat index (mod 2^32) and ``seed``."""
    idx, size = jnp.zeros(shape, jnp.uint32), 1
    for axis in reversed(range(len(shape))):
        idx = idx + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(size % 2**32)
        size *= shape[axis]
    return ((idx * jnp.uint32(2654435761) + jnp.uint32(seed)) >> 24).astype(jnp.int8)


@pytest.mark.parametrize("num_blocks", [33, 65])  # layer stride u32 (< 2^32), then i64
def test_temporal_pool_with_a_layer_stride_beyond_2_31(num_blocks):
    from mamba_align.backends.jax import ops

    L, NB, E = 2, num_blocks, 2**26  # int8: layer stride NB * 2^26 elements (2.2 G / 4.4 G)

    @jax.jit
    def make():
        p = jnp.zeros((L, NB, E), jnp.int8)
        p = p.at[:, NB - 1].set(_pattern((L, E), 1))
        return p.at[:, 1].set(_pattern((L, E), 2))

    pool = make()
    copy = jax.jit(lambda p, s, d: ops.copy_temporal(p, _clear(), s, d), donate_argnums=0)
    src, dst = jnp.array([NB - 1, 1], jnp.int32), jnp.array([2, NB - 2], jnp.int32)
    out = copy(pool, src, dst)
    pool = out["pool"]
    assert np.asarray(out["errors"]).tolist() == [0, 2**31 - 1]
    check = jax.jit(lambda p: (jnp.array_equal(p[:, 2], _pattern((L, E), 1)),
                               jnp.array_equal(p[:, NB - 2], _pattern((L, E), 2)),
                               jnp.array_equal(p[:, NB - 1], _pattern((L, E), 1)),
                               jnp.all(p[:, NB - 3] == 0), jnp.all(p[:, 3] == 0)))
    assert [bool(x) for x in check(pool)] == [True] * 5
    del pool


def test_conv_pool_with_a_layer_stride_beyond_2_31():
    from mamba_align.backends.jax import ops

    L, NB, W, D = 2, 700, 3, 2**20  # int8 SD: layer stride 700 * 3 * 2^20 = 2.2 G elements

    @jax.jit
    def make():
        p = jnp.zeros((L, NB, W, D), jnp.int8)
        p = p.at[:, NB - 1].set(_pattern((L, W, D), 3))
        return p.at[:, NB - 3].set(_pattern((L, W, D), 4))

    pool = make()
    copy = jax.jit(lambda p, s, d, b: ops.copy_conv(p, _clear(), s, d, b, layout="SD"),
                   donate_argnums=0)
    # bias 1 from the last block into NB - 2; an in-place shift by 1 of block NB - 3, a
    # memmove: rows 1 and 2 must be read before rows 0 and 1 are written
    src, dst = jnp.array([NB - 1, NB - 3], jnp.int32), jnp.array([NB - 2, NB - 3], jnp.int32)
    out = copy(pool, src, dst, jnp.array([1, 1], jnp.int32))
    pool = out["pool"]
    assert np.asarray(out["errors"]).tolist() == [0, 2**31 - 1]
    a, b = _pattern((L, W, D), 3), _pattern((L, W, D), 4)
    check = jax.jit(lambda p: (jnp.array_equal(p[:, NB - 2, :2], a[:, 1:]),
                               jnp.all(p[:, NB - 2, 2] == 0),  # rows W - bias.. untouched
                               jnp.array_equal(p[:, NB - 3, :2], b[:, 1:]),
                               jnp.array_equal(p[:, NB - 3, 2], b[:, 2]),
                               jnp.array_equal(p[:, NB - 1], a)))
    assert [bool(x) for x in check(pool)] == [True] * 5


def test_jax_compiles_the_gated_delta_rule_under_its_register_cap(tmp_path, monkeypatch):
    """jax-triton 0.3 takes no register cap; the bridge adds the kernel's own
    (kernels/gdn_recurrent.py), so that JAX compiles the binary torch compiles. jax-triton writes the
    PTX it compiles to its dump folder: the cap is there as ``.maxnreg``."""
    import jax_triton.triton_lib as lib

    from mamba_align.backends.jax import ops
    from mamba_align.kernels import gdn

    monkeypatch.setattr(lib, "_JAX_TRITON_DUMP_DIR", str(tmp_path))
    monkeypatch.setattr(lib, "_COMPILED_KERNEL_CACHE", {})  # compile, even if cached
    rng = np.random.default_rng(3)
    T, H, HV, K, V = 2, 1, 2, 24, 40  # head sizes no other test compiles
    f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    i = lambda *v: jnp.asarray(v, jnp.int32)  # noqa: E731
    run = jax.jit(ops.gated_delta_rule, static_argnames=("layer",), donate_argnums=(0, 1))
    out = run(f(1, 3, HV, V, K), _clear(), f(T, H, K), f(T, H, K), f(T, HV, V),
              -jnp.abs(f(T, HV)), f(T, HV), i(0, T), i(1), i([2, -1]), i(0), layer=0)
    assert int(np.asarray(out["errors"])[0]) == 0
    ptx = [p.read_text() for p in tmp_path.rglob("*.ptx")]
    assert any(f".maxnreg {gdn.REGISTER_CAP}" in p for p in ptx), [p[:200] for p in ptx]

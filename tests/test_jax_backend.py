"""What only the JAX backend has: steps are jittable with donated pools and run inside
``lax.fori_loop`` / ``lax.scan`` (the ops themselves are checked three ways in the
per-operation test files), and the bridge speaks the jax-triton API of its version."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mamba_align.backends import jax as mj
from mamba_align.core import (
    CacheConfig,
    ConvSpec,
    TemporalSpec,
    accept,
    add_requests,
    apply_copy,
    init_slots,
    postprocess,
    postprocess_copy_plan,
    precopy_plan,
    preprocess,
)


def cfg_small():
    return CacheConfig(4, 2, 2, {"conv": ConvSpec(3, 8, "SD", "float32"),
                                 "ssm": TemporalSpec((2, 4), "float32")})


def test_jitted_decode_loop_with_donation_matches_the_core():
    """Eight decode steps of three spec rows inside lax.fori_loop, pools and state donated;
    the same eight steps through the core reference must give the same state and pools."""
    cfg, steps = cfg_small(), 8
    slots, nb = 4, 40
    rng = np.random.default_rng(0)
    bt = rng.permutation(np.arange(1, nb))[: slots * 9].reshape(slots, 9).astype(np.int32)
    idx = np.array([2, -1, 0, 3], np.int32)
    q = np.array([3, 0, 3, 2], np.int32)
    ns = np.array([2, 0, 1, 2], np.int32)
    spec = np.array([True, False, True, True])
    nc0 = np.array([5, 0, 6, 7], np.int32)
    pools = {n: rng.standard_normal(cfg.pool_shape(n, nb)).astype(np.float32) for n in cfg.states}

    # core reference
    st = add_requests(init_slots(slots), np.arange(slots), nc0, cfg.block_size)
    ref = {n: p.copy() for n, p in pools.items()}
    for _ in range(steps):
        st, pre = preprocess(st, idx, q, cfg.block_size)
        apply_copy(ref, cfg, precopy_plan(bt, idx, pre))
        st = accept(st, idx, q, ns, spec)
        st, post = postprocess(st, idx, cfg.block_size)
        apply_copy(ref, cfg, postprocess_copy_plan(bt, idx, post))

    # JAX: one jitted function, the steps in a fori_loop
    def run(state, pools):
        def body(_, carry):
            state, pools = carry
            state, pools, _ = mj.preprocess(state, pools, J(idx), J(q), jnp.asarray(spec), J(bt),
                                            config=cfg, mode="pre-copy")
            state, pools, _ = mj.postprocess(state, pools, J(idx), J(q), jnp.asarray(spec), J(ns),
                                             J(bt), config=cfg)
            return state, pools
        return jax.lax.fori_loop(0, steps, body, (state, pools))

    J = lambda a: jnp.asarray(a, jnp.int32)  # noqa: E731
    state = mj.add_requests(mj.init_state(slots), J(np.arange(slots)), J(nc0), config=cfg)
    state, out = jax.jit(run, donate_argnums=(0, 1))(state, {n: jnp.asarray(p) for n, p in pools.items()})
    for f in ("state_idx", "acc", "num_computed"):
        assert np.array_equal(np.asarray(getattr(state, f)), getattr(st, f)), f
    assert st.state_idx.max() >= 3  # the loop crossed several columns
    for n in pools:
        assert np.array_equal(np.asarray(out[n]), ref[n]), n


def test_scan_over_steps_and_static_config():
    cfg = cfg_small()
    J = lambda a: jnp.asarray(a, jnp.int32)  # noqa: E731
    bt = J(np.arange(1, 1 + 2 * 9).reshape(2, 9))
    pools = {n: jnp.zeros(cfg.pool_shape(n, 20), jnp.float32) for n in cfg.states}
    state = mj.add_requests(mj.init_state(2), J([0, 1]), J([1, 2]), config=cfg)

    @jax.jit
    def decode(state, pools):
        def step(carry, ns):
            state, pools = carry
            state, pools, _ = mj.preprocess(state, pools, J([0, 1]), J([3, 3]),
                                            jnp.ones(2, bool), bt, config=cfg)
            state, pools, cache = mj.postprocess(state, pools, J([0, 1]), J([3, 3]),
                                                 jnp.ones(2, bool), ns, bt, config=cfg)
            return (state, pools), cache
        return jax.lax.scan(step, (state, pools), J([[1, 2], [3, 1], [2, 2]]))

    (state, _), caches = decode(state, pools)
    assert np.asarray(state.num_computed).tolist() == [1 + 6, 2 + 5]
    assert caches.shape == (3, 2)


@pytest.mark.parametrize("version, key", [((0, 3), "out_shape"), ((0, 4), "out_type")])
def test_bridge_speaks_the_jax_triton_api_of_its_version(monkeypatch, version, key):
    """The GPU branch of ``bridge.launch``, with a stand-in for jax_triton (which cannot be
    imported without a GPU, and whose 0.4.x needs a newer triton than the GPU image has):
    arrays then scalars positionally, aliases as indices of the input arrays, the output
    shapes under the keyword of that version."""
    from mamba_align import kernels as K
    from mamba_align.backends.jax import bridge

    calls = []

    class FakeJaxTriton:
        @staticmethod
        def triton_call(*args, **kw):
            calls.append((args, kw))
            return [jnp.zeros(s.shape, s.dtype) for s in kw[key]]

    monkeypatch.setattr(bridge, "on_gpu", lambda: True)
    monkeypatch.setattr(bridge, "_JT", FakeJaxTriton)
    monkeypatch.setattr(bridge, "_JT_VERSION", version)
    pool, src, dst = jnp.zeros((2, 5, 64), jnp.int32), jnp.array([1, 2]), jnp.array([3, 4])
    err = mj.init_state(1).errors
    p = K.plan_copy_temporal(mj.ops.spec("pool", pool), mj.ops.spec("errors", err),
                             mj.ops.spec("src", src), mj.ops.spec("dst", dst))
    out = jax.jit(lambda a, e, s, d: bridge.launch(p, {"pool": a, "errors": e, "src": s,
                                                       "dst": d}))(pool, err, src, dst)
    args, kw = calls[-1]
    assert out["pool"].shape == pool.shape and out["errors"].shape == (2,)
    assert len(args) == 4 + len(p.scalars) and args[4:] == (2, 5 * 64, 64, 64, 5)
    assert all(type(x) is int for x in args[4:])
    assert kw["input_output_aliases"] == {0: 0, 1: 1}  # pool, errors: inputs 0, 1 -> outputs
    assert [tuple(s.shape) for s in kw[key]] == [pool.shape, (2,)]
    assert ({"out_shape", "out_type"} - {key}).isdisjoint(kw)
    assert kw["kernel"] is p.kernel and kw["grid"] == p.grid and kw["num_warps"] == p.num_warps
    assert all(kw[c] == v for c, v in p.constexprs.items())


def test_a_kernels_register_cap_reaches_jax_tritons_compile_options(monkeypatch):
    """jax-triton 0.3 takes no register cap (Triton's ``maxnreg``): the bridge adds a capped
    kernel's cap to the options jax-triton parses, and only that kernel's (a stand-in for
    jax-triton here; tests/test_jax_gpu.py checks the compiled PTX on the GPU)."""
    import types

    from mamba_align.backends.jax import bridge

    class Backend:
        def parse_options(self, opts):
            return dict(opts)

    seen = []

    def create(init, platform, fn, *args, **kwargs):
        seen.append((init(0, 90).parse_options({"num_warps": 1}), platform, args, kwargs))

    lib = types.SimpleNamespace(get_or_create_triton_kernel=create)
    jt = types.SimpleNamespace(triton_lib=lib, __version__="0.3.1")
    monkeypatch.setattr(bridge, "_JT_VERSION", (0, 3))
    bridge._pass_register_caps(jt)
    wrapped = lib.get_or_create_triton_kernel
    assert wrapped is not create
    bridge._pass_register_caps(jt)
    assert lib.get_or_create_triton_kernel is wrapped  # installed once
    for fn in (types.SimpleNamespace(maxnreg=80), types.SimpleNamespace()):
        lib.get_or_create_triton_kernel(lambda device, capability: Backend(), "cuda", fn,
                                        ["*fp32"], [], num_warps=1, dump=False)
    rest = ("cuda", (["*fp32"], []), {"num_warps": 1, "dump": False})
    assert seen == [({"num_warps": 1, "maxnreg": 80},) + rest, ({"num_warps": 1},) + rest]
    monkeypatch.setattr(bridge, "_JT_VERSION", (0, 4))
    with pytest.raises(NotImplementedError, match="register cap"):
        bridge._pass_register_caps(types.SimpleNamespace(triton_lib=types.SimpleNamespace(),
                                                         __version__="0.4.0"))

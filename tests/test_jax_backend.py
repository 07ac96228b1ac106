"""The JAX backend: copies equal the core and torch bit for bit, steps are jittable with
donated pools and run inside ``lax.fori_loop``, and bad input gets clear errors."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

from mamba_align.backends import jax as mj
from mamba_align.backends.torch import ops as tops
from mamba_align.core import (
    CacheConfig,
    ConvSpec,
    CopyPlan,
    TemporalSpec,
    accept,
    add_requests,
    apply_conv_copy,
    apply_copy,
    apply_temporal_copy,
    init_slots,
    postprocess,
    postprocess_copy_plan,
    precopy_plan,
    preprocess,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore:.*called outside jax.jit")


def plan(rng, rows, nb, max_shift):
    blocks = rng.permutation(np.arange(1, nb))
    dst = blocks[:rows].copy()
    kind = rng.integers(0, 4, rows)  # copy, in place, no source, skipped
    src = np.where(kind == 1, dst, rng.choice(blocks[rows:], rows))
    src[kind >= 2] = -1
    dst[kind == 3] = -1
    return CopyPlan(src, src, dst, rng.integers(0, max_shift + 1, rows))


def bits(a):
    return np.asarray(a).view(np.uint16 if np.asarray(a).dtype.itemsize == 2 else np.uint32)


@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("layout", ["SD", "DS", "temporal"])
def test_copies_core_torch_jax_bit_identical(rows, dtype, layout):
    rng = np.random.default_rng(rows)
    nb, S = 2 * rows + 3, 2
    shape = {"SD": (2, nb, 4, 24), "DS": (2, nb, 24, 4), "temporal": (2, nb, 3, 8, 8)}[layout]
    raw = rng.integers(0, 2**16, size=int(np.prod(shape)) * np.dtype(dtype).itemsize // 2,
                       dtype=np.uint16)
    pool = raw.view(dtype).reshape(shape)  # random bits, NaN payloads included
    p = plan(rng, rows, nb, S)
    want = pool.copy()
    j = lambda a: jnp.asarray(a, jnp.int32)  # noqa: E731
    t = torch.from_numpy(pool.view(np.int16) if dtype == ml_dtypes.bfloat16 else pool.copy())
    t = (t.view(torch.bfloat16) if dtype == ml_dtypes.bfloat16 else t).to(DEVICE, copy=True)
    i64 = lambda a: torch.as_tensor(a, device=DEVICE)  # noqa: E731
    if layout == "temporal":
        apply_temporal_copy(want, p)
        got = mj.ops.copy_temporal(jnp.asarray(pool), j(p.tsrc), j(p.dst))
        tops.call("copy_temporal_", t, i64(p.tsrc), i64(p.dst))
    else:
        apply_conv_copy(want, p, layout)
        got = mj.ops.copy_conv(jnp.asarray(pool), j(p.csrc), j(p.dst), j(p.bias), layout)
        tops.call("copy_conv_", t, i64(p.csrc), i64(p.dst), i64(p.bias), layout)
    t_host = t.cpu()
    t_host = (t_host.view(torch.int16) if dtype == ml_dtypes.bfloat16 else t_host).numpy()
    assert np.array_equal(bits(got), bits(want))
    assert np.array_equal(bits(t_host.view(dtype)), bits(want))


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
                                            cfg, "pre-copy")
            state, pools, _ = mj.postprocess(state, pools, J(idx), J(q), jnp.asarray(spec), J(ns),
                                             J(bt), cfg)
            return state, pools
        return jax.lax.fori_loop(0, steps, body, (state, pools))

    J = lambda a: jnp.asarray(a, jnp.int32)  # noqa: E731
    state = mj.add_requests(mj.init_state(slots), J(np.arange(slots)), J(nc0), cfg)
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
    state = mj.add_requests(mj.init_state(2), J([0, 1]), J([1, 2]), cfg)

    @jax.jit
    def decode(state, pools):
        def step(carry, ns):
            state, pools = carry
            state, pools, slots = mj.preprocess(state, pools, J([0, 1]), J([3, 3]),
                                                jnp.ones(2, bool), bt, cfg)
            state, pools, cache = mj.postprocess(state, pools, J([0, 1]), J([3, 3]),
                                                 jnp.ones(2, bool), ns, bt, cfg)
            return (state, pools), cache
        return jax.lax.scan(step, (state, pools), J([[1, 2], [3, 1], [2, 2]]))

    (state, _), caches = decode(state, pools)
    assert np.asarray(state.num_computed).tolist() == [1 + 6, 2 + 5]
    assert caches.shape == (3, 2)


def test_jax_errors():
    cfg = cfg_small()
    J = lambda a: jnp.asarray(a, jnp.int32)  # noqa: E731
    pools = {n: jnp.zeros(cfg.pool_shape(n, 8), jnp.float32) for n in cfg.states}
    state = mj.init_state(2)
    bt = J(np.ones((2, 6)))
    with pytest.raises(TypeError, match="idx_mapping must have dtype"):
        mj.preprocess(state, pools, jnp.zeros(1, jnp.float32), J([1]), jnp.ones(1, bool), bt, cfg)
    with pytest.raises(ValueError, match="query_len must have shape"):
        mj.preprocess(state, pools, J([0]), J([1, 1]), jnp.ones(1, bool), bt, cfg)
    with pytest.raises(ValueError, match="mode"):
        mj.preprocess(state, pools, J([0]), J([1]), jnp.ones(1, bool), bt, cfg, "lazy")
    with pytest.raises(KeyError, match="ssm"):
        mj.preprocess(state, {"conv": pools["conv"]}, J([0]), J([1]), jnp.ones(1, bool), bt, cfg)
    with pytest.raises(ValueError, match="pools\\['conv'\\] must be"):
        mj.postprocess(state, dict(pools, conv=pools["conv"][:, :, :2]), J([0]), J([1]),
                       jnp.ones(1, bool), J([1]), bt, cfg)
    with pytest.raises(TypeError, match="is_spec must have dtype"):
        mj.postprocess(state, pools, J([0]), J([1]), jnp.ones(1, jnp.float32), J([1]), bt, cfg)
    with pytest.raises(ValueError, match="dst must have shape"):
        mj.ops.copy_temporal(pools["ssm"], J([1]), J([2, 3]))
    with pytest.raises(ValueError, match="layout"):
        mj.ops.copy_conv(pools["conv"], J([1]), J([2]), J([0]), "XY")
    with pytest.raises(TypeError, match="config must be a CacheConfig"):
        mj.preprocess(state, pools, J([0]), J([1]), jnp.ones(1, bool), bt, {"B": 4})
    with pytest.raises(TypeError, match="scalar"):
        from mamba_align import kernels as K
        mj.launch(K.plan_add_requests(1), {}, {"num_new": 1.5}, {})


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
    scal = dict(K.pool_scalars(tuple(pool.shape), (5 * 64, 64, 1)), num_rows=2)
    p = K.plan_copy_temporal(2, 2, 64, 4, K.pool_align(scal))
    out = jax.jit(lambda a, s, d: bridge.launch(p, {"pool": a, "src": s, "dst": d}, scal, {}))(
        pool, src, dst)
    args, kw = calls[-1]
    assert out["pool"].shape == pool.shape
    assert len(args) == 3 + len(p.scalars) and args[3:] == tuple(scal[n] for n in p.scalars)
    assert kw["input_output_aliases"] == {0: 0}  # pool: input 0 -> output 0
    assert [tuple(s.shape) for s in kw[key]] == [pool.shape]
    assert ({"out_shape", "out_type"} - {key}).isdisjoint(kw)
    assert kw["kernel"] is p.kernel and kw["grid"] == p.grid and kw["num_warps"] == p.num_warps
    assert all(kw[c] == v for c, v in p.constexprs.items())

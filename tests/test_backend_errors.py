"""Both backends reject bad arguments with the same clear errors (the checks live once, in
the kernels' plan builders and in ``CacheConfig.check_pools``), before anything is
launched: dtype, rank, shape, strides, layout, static options, pools against the config.
Values are never read on the host (that would synchronise): the kernels skip ids they
cannot trust instead, which ``test_copy.py`` and ``test_bookkeeping.py`` check."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from mamba_align.backends import jax as mj
from mamba_align.backends.torch import StateRunner
from mamba_align.backends.torch import ops as tops
from mamba_align.core import CacheConfig, ConvSpec, TemporalSpec

DEV = "cuda" if torch.cuda.is_available() else "cpu"


class Args:
    """Arrays of one backend, by the same recipe: ``ids`` int, ``f32`` float, ``flags``
    bool; ``op(name)`` the backend's function for a kernel op."""

    def __init__(self, name):
        self.name = name

    def ids(self, *v, shape=None):
        a = np.array(v, np.int64).reshape(shape or (len(v),))
        return torch.as_tensor(a, device=DEV) if self.name == "torch" else jnp.asarray(a, jnp.int32)

    def f32(self, *shape):
        a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        return torch.as_tensor(a, device=DEV) if self.name == "torch" else jnp.asarray(a)

    def flags(self, n, dtype=bool):
        a = np.ones(n, dtype)
        return torch.as_tensor(a, device=DEV) if self.name == "torch" else jnp.asarray(a)

    def err(self):
        """A clear error flag."""
        a = np.array([0, 2**31 - 1], np.int32)
        return torch.as_tensor(a, device=DEV) if self.name == "torch" else jnp.asarray(a)

    def op(self, name):
        # every op updates something in place: torch names it with a trailing underscore
        return getattr(tops, name + "_") if self.name == "torch" else getattr(mj.ops, name)


@pytest.fixture(params=["torch", "jax"])
def a(request):
    return Args(request.param)


def slots4(a):
    """Four slots' bookkeeping and a clear error flag."""
    return a.ids(0, 0, 0, 0), a.ids(1, 1, 1, 1), a.ids(0, 0, 0, 0), a.err()


BT = np.arange(1, 17).reshape(4, 4)


def step(a, **change):
    """A good preprocess_resolve call of one row, with ``change`` replacing arguments."""
    arrays = dict(zip(("state_idx", "acc", "num_computed", "errors"), slots4(a)),
                  idx_mapping=a.ids(0), query_len=a.ids(1), is_spec=a.flags(1),
                  block_table=a.ids(*BT.flat, shape=BT.shape))
    statics = {"block_size": 4, "num_spec": 1, "num_blocks": 17, "mode": "pre-copy"}
    arrays.update({k: v for k, v in change.items() if k in arrays})
    statics.update({k: v for k, v in change.items() if k in statics})
    return tuple(arrays.values()), statics

CASES = [
    # copies
    ("copy_temporal", lambda a: ((a.f32(2, 6, 3, 4), a.err(), a.f32(1), a.ids(2)), {}),
     TypeError, "src must have dtype"),
    ("copy_temporal", lambda a: ((a.f32(2, 6, 3, 4), a.err(), a.ids(1, 2), a.ids(3)), {}),
     ValueError, "dst must have shape"),
    ("copy_temporal", lambda a: ((a.f32(2, 6, 3, 4), a.err(), a.ids(1, shape=(1, 1)),
                                  a.ids(3)), {}), ValueError, "src must have shape"),
    ("copy_temporal", lambda a: ((a.f32(2, 6, 3, 4), a.f32(2), a.ids(1), a.ids(3)), {}),
     TypeError, "errors must have dtype"),
    ("copy_temporal", lambda a: ((a.flags(48).reshape(2, 6, 4), a.err(), a.ids(1), a.ids(3)), {}),
     TypeError, "unsupported dtype bool"),
    ("copy_conv", lambda a: ((a.f32(2, 6, 3, 4), a.err(), a.ids(1), a.ids(2), a.ids(0)),
                             {"layout": "XY"}), ValueError, "layout"),
    ("copy_conv", lambda a: ((a.f32(6, 3, 4), a.err(), a.ids(1), a.ids(2), a.ids(0)),
                             {"layout": "SD"}), ValueError, "pool must be"),
    ("copy_conv", lambda a: ((a.f32(2, 6, 3, 4), a.err(), a.ids(1), a.ids(2), a.ids(0, 1)),
                             {"layout": "SD"}), ValueError, "bias must have shape"),
    ("copy_conv", lambda a: ((a.f32(2, 6, 3, 4), a.err(), a.ids(1), a.ids(2), a.flags(1)),
                             {"layout": "SD"}), TypeError, "bias must have dtype"),
    ("copy_conv", lambda a: ((a.f32(2, 6, 3, 4), a.err(), a.ids(1), a.ids(2), a.ids(0)), {}),
     TypeError, "missing the keyword option 'layout'"),
    ("copy_temporal", lambda a: ((a.f32(2, 6, 3, 4), a.err(), a.ids(1), a.ids(2)),
                                 {"layout": "SD"}), TypeError, "unexpected options"),
    # bookkeeping
    ("add_requests", lambda a: ((*slots4(a), a.ids(0), a.ids(1)), {"block_size": 0}),
     ValueError, "block_size"),
    ("add_requests", lambda a: ((*slots4(a), a.ids(0), a.ids(1, 2)), {"block_size": 4}),
     ValueError, "num_computed_new must have shape"),
    ("preprocess_resolve", lambda a: step(a, num_spec=-1), ValueError, "num_spec"),
    ("preprocess_resolve", lambda a: step(a, mode="lazy"), ValueError, "mode must be one of"),
    ("preprocess_resolve", lambda a: step(a, block_table=a.ids(*BT[:2].flat, shape=(2, 4))),
     ValueError, "fewer than the 4 slots"),
    ("preprocess_resolve", lambda a: step(a, idx_mapping=a.f32(1)), TypeError,
     "idx_mapping must have dtype"),
    ("preprocess_resolve", lambda a: step(a, block_table=a.ids(*BT[0])), ValueError,
     "block_table must have shape"),
    ("postprocess", lambda a: ((*slots4(a), a.ids(0), a.ids(1), a.flags(1), a.ids(1, 1),
                                a.ids(*BT.flat, shape=BT.shape)), {"block_size": 4, "num_spec": 1,
                                                                    "num_blocks": 17}),
     ValueError, "num_sampled must have shape"),
    ("postprocess", lambda a: ((*slots4(a), a.ids(0), a.ids(1), a.f32(1), a.ids(1),
                                a.ids(*BT.flat, shape=BT.shape)), {"block_size": 4, "num_spec": 1,
                                                                    "num_blocks": 17}),
     TypeError, "is_spec must have dtype"),
    ("postprocess", lambda a: ((a.ids(0, 0), a.ids(1, 1, 1), a.ids(0, 0), slots4(a)[3], a.ids(0),
                                a.ids(1), a.flags(1), a.ids(1), a.ids(*BT.flat, shape=BT.shape)),
                               {"block_size": 4, "num_spec": 1, "num_blocks": 17}), ValueError,
     "acc must have shape"),
    ("postprocess", lambda a: ((*slots4(a)[:3], a.f32(2), a.ids(0), a.ids(1), a.flags(1),
                                a.ids(1), a.ids(*BT.flat, shape=BT.shape)),
                               {"block_size": 4, "num_spec": 1, "num_blocks": 17}), TypeError,
     "errors must have dtype"),
    ("preprocess_resolve", lambda a: step(a, num_blocks=0), ValueError, "num_blocks must be"),
]


@pytest.mark.parametrize("name,make,exc,match", CASES,
                         ids=[f"{c[0]}-{c[3].split()[0]}" for c in CASES])
def test_op_argument_errors_are_the_same_in_both_backends(a, name, make, exc, match):
    args, kw = make(a)
    before = [np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x) for x in args]
    with pytest.raises(exc, match=match):
        a.op(name)(*args, **kw)
    after = [np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x) for x in args]
    assert all(np.array_equal(x, y) for x, y in zip(before, after))  # nothing written


def test_torch_strides_are_checked():
    pool = torch.zeros(2, 6, 3, 4, device=DEV)
    i64 = lambda *v: torch.tensor(v, device=DEV)  # noqa: E731
    with pytest.raises(ValueError, match="contiguous"):
        tops.copy_temporal_(pool, Args("torch").err(), i64(1, 2, 3, 4)[::2], i64(3, 4))
    with pytest.raises(ValueError, match="inner block"):
        tops.copy_temporal_(pool.transpose(2, 3), Args("torch").err(), i64(1), i64(2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device kind")
def test_torch_arrays_on_mixed_devices_are_rejected():
    pool = torch.zeros(2, 6, 3, 4, device=DEV)
    with pytest.raises(ValueError, match="is on cpu, expected cuda"):
        tops.copy_temporal_(pool, Args("torch").err(), torch.tensor([1]), torch.tensor([2]))


def test_torch_meta_tensors_are_rejected():
    # compiled or interpreted, a tensor without data is refused by name, before any launch
    x, w = torch.empty(3, 8, device="meta"), torch.empty(8, device="meta")
    with pytest.raises(ValueError, match="the tensors are on meta"):
        tops.rms_norm(x, w)


# -- the runners: pools against the config, the same rule in both ---------------------------
CFG = CacheConfig(4, 1, 1, {"conv": ConvSpec(3, 4, "SD", "bfloat16"),
                            "ssm": TemporalSpec((2, 2), "float32")})


def pools_of(name, cfg=CFG, nb=12):
    out = {}
    for n, s in cfg.states.items():
        a = np.zeros(cfg.pool_shape(n, nb), np.float32)
        if name == "torch":
            out[n] = torch.as_tensor(a, device=DEV).to(getattr(torch, s.dtype))
        else:
            out[n] = jnp.asarray(a, getattr(jnp, s.dtype))
    return out


def preprocess(a, pools, cfg=CFG, mode="pre-copy"):
    bt = a.ids(*BT.flat, shape=BT.shape)
    step = (a.ids(0, 1), a.ids(2, 2), a.flags(2), bt)
    if a.name == "torch":
        return StateRunner(cfg, 4, DEV, mode=mode).preprocess(pools, *step)
    return mj.preprocess(mj.init_state(4), pools, *step, config=cfg, mode=mode)


def cast(a, x, dtype):
    return x.to(getattr(torch, dtype)) if a.name == "torch" else x.astype(getattr(jnp, dtype))


@pytest.mark.parametrize("change,exc,match", [
    (lambda a, p: {"conv": p["conv"]}, KeyError, "pools has no entry 'ssm'"),
    (lambda a, p: dict(p, ssm=p["ssm"][:, :, :1]), ValueError, r"pools\['ssm'\] must be \[L=1"),
    (lambda a, p: dict(p, ssm=(torch.cat if a.name == "torch" else jnp.concatenate)(
        [p["ssm"]] * 2)), ValueError, r"pools\['ssm'\] must be \[L=1"),
    (lambda a, p: dict(p, ssm=cast(a, p["ssm"], "float16")), TypeError,
     "has dtype float16, the config's spec says float32"),
    (lambda a, p: dict(p, conv=cast(a, p["conv"], "float32")), TypeError,
     "has dtype float32, the config's spec says bfloat16"),
    # a DS-shaped pool for an SD config
    (lambda a, p: dict(p, conv=cast(a, a.f32(1, 12, 4, 3), "bfloat16")), ValueError,
     r"must be \[L=1, NB, 3, 4\] \(SD\)"),
])
def test_pools_are_checked_against_the_config(a, change, exc, match):
    with pytest.raises(exc, match=match):
        preprocess(a, change(a, pools_of(a.name)))


def _strided_ssm(pools):
    """The pools with the temporal one's inner block transposed in memory (same shape)."""
    return dict(pools, ssm=pools["ssm"].transpose(2, 3).contiguous().transpose(2, 3))


def _ids(*v):
    return torch.tensor(v, device=DEV)


@pytest.mark.parametrize("mode,validate,compiled", [
    ("pre-copy", False, False), ("copy-free", False, False), ("pre-copy", True, False),
    ("pre-copy", False, True), ("copy-free", False, True)])
def test_a_pool_the_copies_cannot_take_raises_before_the_step_changes_anything(mode, validate,
                                                                               compiled):
    # right shape, inner block not contiguous: the copies' plans refuse it. The torch runner
    # plans them before its bookkeeping launches, so the slots are as they were and the next
    # step with a good pool runs (before: acc marked mid-step, then STEP_ORDER). Compiled
    # (fullgraph, so not the checked mode, which reads the flag on the host), the copies'
    # fake implementations plan them at trace time: a copy-free preprocess copies nothing
    # and so checks nothing
    pools = pools_of("torch")
    bad, ids = _strided_ssm(pools), _ids
    runner = StateRunner(CFG, 4, DEV, mode=mode, validate=validate)
    runner.add_requests(ids(0), ids(5))
    bt = torch.as_tensor(BT, device=DEV)
    pre, post = runner.preprocess, runner.postprocess
    if compiled:
        torch._dynamo.reset()
        pre, post = (torch.compile(f, fullgraph=True) for f in (pre, post))

    def state():
        return [t.clone() for t in (runner.state_idx, runner.acc, runner.num_computed)]
    before = state()
    if not (compiled and mode == "copy-free"):
        with pytest.raises(Exception, match="pool must have a contiguous inner block"):
            pre(bad, ids(0), ids(2), ids(True), bt)
        assert all(torch.equal(x, y) for x, y in zip(before, state()))
    runner.preprocess(pools, ids(0), ids(2), ids(True), bt)
    during = state()
    with pytest.raises(Exception, match="pool must have a contiguous inner block"):
        post(bad, ids(0), ids(2), ids(True), ids(2), bt)
    assert all(torch.equal(x, y) for x, y in zip(during, state()))
    runner.postprocess(pools, ids(0), ids(2), ids(True), ids(2), bt)
    assert runner.errors() == [] and not torch.equal(before[2], runner.num_computed)


def test_the_runner_names_the_pool_the_copies_refuse():
    pools = pools_of("torch")
    bad, ids = _strided_ssm(pools), _ids
    with pytest.raises(ValueError, match="pool 'ssm': pool must have a contiguous inner"):
        StateRunner(CFG, 4, DEV).preprocess(bad, ids(0), ids(2), ids(True),
                                            torch.as_tensor(BT, device=DEV))
    with pytest.raises(ValueError, match="idx_mapping must have shape"):  # checked first
        StateRunner(CFG, 4, DEV).preprocess(pools, ids(0)[0], ids(2), ids(True),
                                            torch.as_tensor(BT, device=DEV))


def test_extra_pool_entries_are_ignored_by_both(a):
    pools = pools_of(a.name)
    scratch = a.f32(3)  # not a state of the config: neither checked nor copied
    pools["scratch"] = scratch
    out = preprocess(a, pools)
    if a.name == "jax":
        assert out[1]["scratch"] is scratch  # passed through as it was
    else:
        assert torch.equal(pools["scratch"], torch.arange(3.0, device=DEV))


@pytest.mark.parametrize("bad,exc,match", [
    (None, TypeError, r"pools\['ssm'\] must be a"),
    ([[0.0]], TypeError, r"pools\['ssm'\] must be a"),
])
def test_pools_that_are_not_arrays_are_rejected(a, bad, exc, match):
    pools = dict(pools_of(a.name), ssm=bad)
    with pytest.raises(exc, match=match):
        preprocess(a, pools)
    with pytest.raises(TypeError, match="pools must map state names to arrays"):
        preprocess(a, list(pools_of(a.name).values()))


def test_an_empty_step_through_both_runners(a):
    # no rows (an idle step): nothing launched, empty per-row results, nothing changed
    pools = pools_of(a.name)
    bt = a.ids(*BT.flat, shape=BT.shape)
    none, flags = a.ids(), a.flags(0)
    if a.name == "torch":
        r = StateRunner(CFG, 4, DEV)
        blocks = r.preprocess(pools, none, none, flags, bt)
        cache = r.postprocess(pools, none, none, flags, none, bt)
        state = [r.state_idx, r.acc, r.num_computed]
    else:
        st, pools2, blocks = mj.preprocess(mj.init_state(4), pools, none, none, flags, bt,
                                           config=CFG)
        st, _, cache = mj.postprocess(st, pools2, none, none, flags, none, bt, config=CFG)
        state = list(st)[:3]
    assert tuple(blocks.temporal_write.shape) == (0, 1 + CFG.num_spec)
    assert tuple(cache.shape) == (0,)
    assert [np.asarray(x.cpu() if a.name == "torch" else x).tolist() for x in state] == \
        [[-1] * 4, [1] * 4, [0] * 4]


def test_runner_options_are_checked(a):
    with pytest.raises(ValueError, match="mode must be one of"):
        preprocess(a, pools_of(a.name), mode="lazy")
    with pytest.raises(TypeError, match="config must be a CacheConfig"):
        preprocess(a, pools_of(a.name), cfg={"B": 4})


def test_torch_runner_options():
    with pytest.raises(TypeError, match="index_dtype"):
        StateRunner(CFG, 4, DEV, index_dtype=torch.float32)
    with pytest.raises(ValueError, match="num_slots"):
        StateRunner(CFG, 0, DEV)


def test_jax_bridge_scalars_are_python_numbers():
    from mamba_align.backends.jax.bridge import _scalar

    assert _scalar("x", 3) == 3 and isinstance(_scalar("x", 0.5), np.float32)
    with pytest.raises(TypeError, match="scalar x"):
        _scalar("x", np.int64(3))
    with pytest.raises(TypeError, match="scalar x"):
        _scalar("x", True)


def test_jax_checks_are_static_under_jit():
    # the checks read shapes and dtypes only, so they run (and raise) at trace time
    bad = jax.jit(lambda s: mj.ops.copy_temporal(jnp.zeros((1, 4, 2)), Args("jax").err(), s,
                                                 jnp.zeros(2, jnp.int32)))
    with pytest.raises(ValueError, match="dst must have shape"):
        bad(jnp.zeros(1, jnp.int32))


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="with x64 int64 state is kept")
def test_jax_int64_state_without_x64_is_refused_clearly():
    # JAX without x64 would hand back int32 arrays for int64 ones updated in place
    state = mj.SlotArrays(np.full(4, -1, np.int64), np.ones(4, np.int64), np.zeros(4, np.int64),
                          mj.init_state(4).errors)
    with pytest.raises(TypeError, match="state_idx is int64, which JAX without jax_enable_x64"):
        mj.add_requests(state, np.array([0]), np.array([5]), config=CFG)
    # read-only int64 NumPy ids are fine (stored as int32), and int32 state works
    out = mj.add_requests(state._replace(**{f: np.asarray(getattr(state, f)).astype(np.int32)
                                            for f in ("state_idx", "acc", "num_computed")}),
                          np.array([0]), np.array([5]), config=CFG)
    assert np.asarray(out.state_idx).tolist() == [1, -1, -1, -1]


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="with x64 int64 state is kept")
def test_jax_refuses_what_it_would_narrow_as_torch_refuses_it():
    # float64 NumPy data (JAX without x64 would run it as float32; torch refuses float64),
    # an int64 error flag (the flag is int32 with or without x64), int64 state asked of
    # init_state (JAX would hand back int32), each with torch's wording where it has one
    with pytest.raises(TypeError, match="x must have dtype float32/float16/bfloat16, got "
                                        "float64"):
        mj.ops.rms_norm(np.ones((2, 8)), np.ones(8, np.float32))
    with pytest.raises(TypeError, match="errors must have dtype int32, got int64"):
        mj.ops.copy_temporal(jnp.zeros((1, 4, 2)), np.zeros(2, np.int64),
                             jnp.array([1], jnp.int32), jnp.array([2], jnp.int32))
    with pytest.raises(TypeError, match="dtype int64 needs jax_enable_x64"):
        mj.init_state(4, jnp.int64)
    with pytest.raises(TypeError, match="x must be a jax array, got Tensor"):
        mj.ops.rms_norm(torch.ones(2, 8), np.ones(8, np.float32))


def test_jax_arrays_on_several_devices_are_refused_by_name(tmp_path):
    # two CPU devices need XLA_FLAGS before jax is imported: a process of its own
    import subprocess
    import sys
    script = tmp_path / "devices.py"
    script.write_text("""
import numpy as np, jax, jax.numpy as jnp
from mamba_align.backends import jax as mj
from mamba_align.core import new_errors
d0, d1 = jax.devices()[:2]
src, dst = jnp.array([1], jnp.int32), jnp.array([2], jnp.int32)
pool = jax.device_put(jnp.arange(16.0).reshape(1, 4, 2, 2), d1)
out = mj.ops.copy_temporal(pool, jnp.asarray(new_errors()), src, dst)  # the rest moves
assert out["pool"].devices() == {d1}, out["pool"].devices()
assert np.asarray(out["pool"])[0, 2].tolist() == np.asarray(pool)[0, 1].tolist()
for errors, want in ((jax.device_put(jnp.asarray(new_errors()), d0), "errors is on"),):
    try:
        mj.ops.copy_temporal(pool, errors, src, dst)
        raise SystemExit("mixed devices were not refused")
    except ValueError as e:
        assert want in str(e) and "(as pool)" in str(e), e
mesh = jax.sharding.Mesh(np.array([d0, d1]), ("x",))
spread = jax.device_put(jnp.zeros((1, 4, 2, 2)), jax.sharding.NamedSharding(
    mesh, jax.sharding.PartitionSpec(None, "x")))
try:
    mj.ops.copy_temporal(spread, jnp.asarray(new_errors()), src, dst)
    raise SystemExit("a sharded pool was not refused")
except ValueError as e:
    assert "pool is placed on 2 devices" in str(e), e
# under jax.jit XLA places the arrays, those the function closes over too
w1, x0 = jax.device_put(jnp.ones(8), d1), jax.device_put(jnp.ones((2, 8)), d0)
for f in (lambda x: mj.ops.rms_norm(x, w1)["y"], lambda x: mj.ops.rms_norm(x0, w1)["y"]):
    assert np.allclose(np.asarray(jax.jit(f)(x0)), 1, atol=1e-5)
# a launch with no rows runs nothing, and still refuses
try:
    mj.ops.copy_temporal(pool, jax.device_put(jnp.asarray(new_errors()), d0),
                         jnp.zeros(0, jnp.int32), jnp.zeros(0, jnp.int32))
    raise SystemExit("mixed devices were not refused on an empty launch")
except ValueError as e:
    assert "errors is on" in str(e), e
print("ok")
""")
    env = dict(__import__("os").environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu", TRITON_INTERPRET="1")  # (also on a GPU machine)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=300, env=env, cwd=str(__import__("pathlib").Path(__file__)
                                                    .resolve().parents[1]))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="with x64 int64 ids are kept")
@pytest.mark.parametrize("bad", [2**32 + 1, -(2**32) - 1, 2**40])
def test_jax_int64_ids_outside_int32_stay_bad_without_x64(bad):
    # 2**32 + 1 would wrap to block 1 and -2**32 - 1 to -1 ("none"): saturated, they stay
    # out of range, and JAX flags and skips the rows as torch does
    from mamba_align.core import decode_errors

    def run(name, op, pool, floats, ids, **opts):
        # the ids as NumPy int64 arrays, as users pass them (torch: int64 tensors)
        a = Args(name)
        pool, err = a.f32(*pool), a.err()
        ids = [np.array(v, np.int64) for v in ids]
        if name == "torch":
            getattr(tops, op + "_")(pool, err, *floats,
                                    *[torch.as_tensor(v, device=DEV) for v in ids], **opts)
            pool, err = pool.cpu(), err.cpu()
        else:
            out = getattr(mj.ops, op)(pool, err, *floats, *ids, **opts)
            pool, err = out["pool"], out["errors"]
        return np.asarray(pool).tolist(), decode_errors(np.asarray(err))

    def launches(name):
        a = Args(name)
        xs = [a.f32(1, 2), a.f32(2, 4), a.f32(2)]  # x, weight, bias
        conv = lambda cu, wb: run(name, "conv1d_update", (1, 4, 3, 2), xs,  # noqa: E731
                                  [cu, [1], [0], wb, [0]], layer=0, layout="SD")
        return [run(name, "copy_temporal", (1, 4, 2), [], [[bad], [2]]),
                conv([0, 1], [bad]),  # the write block
                conv([0, bad], [2])]  # the row's cu_seqlens

    torch_out, jax_out = launches("torch"), launches("jax")
    assert jax_out == torch_out
    untouched = (np.asarray(Args("jax").f32(1, 4, 2)).tolist(),
                 np.asarray(Args("jax").f32(1, 4, 3, 2)).tolist())
    assert [p for p, _ in jax_out] == [untouched[0], untouched[1], untouched[1]]
    assert all(faults for _, faults in jax_out)  # every launch flagged


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="with x64 int64 counts are kept")
@pytest.mark.parametrize("count", [2**31, 2**32 + 5, 2**40, -(2**32) + 5])
def test_jax_counts_past_its_32_bit_state_are_refused_as_a_negative_count_is(count):
    # an int32 state cannot hold the count: clipped to 2**31 - 1 it would pass as a valid
    # count, wrapped it could be 5; it must be refused like any bad count (slot left
    # faulty, the count not stored)
    from mamba_align.core import Fault

    def seed(c):
        out = mj.ops.add_requests(*mj.init_state(4), np.array([1], np.int64),
                                  np.array([c], np.int64), block_size=CFG.block_size)
        return {n: np.asarray(v).tolist() for n, v in out.items()}
    got, refused = seed(count), seed(-5)
    assert got == refused
    assert got["errors"][0] & Fault.BAD_NUM_COMPUTED and got["num_computed"] == [0] * 4


def test_torch_gradients_through_the_ops_raise():
    # as JAX's do: a launch's outputs have no autograd history, so an input that wants a
    # gradient would silently get none through them
    x = torch.randn(3, 8, device=DEV, requires_grad=True)
    w = torch.randn(8, device=DEV)
    y = tops.rms_norm(x, w)["y"]
    with pytest.raises(RuntimeError, match="rms_norm is not differentiable"):
        (y.sum() + x.sum()).backward()
    # an op that updates in place: torch's own refusal (it takes no formula for one)
    pool = torch.zeros(1, 2, 3, 8, device=DEV)
    ids = [torch.tensor(v, dtype=torch.int32, device=DEV) for v in ([0, 1], [-1], [0], [1], [0])]
    out = tops.conv1d_update_(pool, tops_errors(), x[:1], torch.randn(8, 4, device=DEV),
                              torch.zeros(8, device=DEV), *ids, layer=0, layout="SD")
    with pytest.raises(RuntimeError, match="conv1d_update_"):
        (out["y"].sum() + x.sum()).backward()
    # without gradients wanted, a plain launch; the same values either way
    with torch.no_grad():
        plain = tops.rms_norm(x, w)["y"]
    assert plain.grad_fn is None and torch.equal(plain, y.detach())
    assert tops.rms_norm(x.detach(), w)["y"].grad_fn is None
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):  # still named
        tops.rms_norm(x.detach().cpu().numpy(), w)


def tops_errors():
    return torch.zeros(2, dtype=torch.int32, device=DEV)


def _conv_args(pool):
    ids = [torch.tensor(v, dtype=torch.int32, device=DEV) for v in ([0, 1], [1], [0], [2], [0])]
    return (pool, tops_errors(), torch.randn(1, 8, device=DEV), torch.randn(8, 4, device=DEV),
            torch.zeros(8, device=DEV), *ids)


@pytest.mark.parametrize("leaf", [True, False])
def test_torch_refuses_a_pool_that_requires_grad(leaf):
    # no backward can see the update: the gradient would flow as if the op had not run
    # (JAX raises "not differentiable" on the same function)
    base = torch.randn(1, 4, 3, 8, device=DEV, requires_grad=True)
    pool = base if leaf else base * 2
    before = pool.detach().clone()
    with pytest.raises(RuntimeError, match="conv1d_update_ updates pool in place and pool "
                                           "requires grad"):
        tops.conv1d_update_(*_conv_args(pool), layer=0, layout="SD")
    assert torch.equal(pool.detach(), before)  # refused before the launch
    with torch.no_grad():  # allowed there, as torch's own in-place ops are
        tops.conv1d_update_(*_conv_args(pool), layer=0, layout="SD")
    assert not torch.equal(pool.detach(), before)


def test_torch_in_place_updates_bump_the_version_counter():
    # as torch's own in-place ops do: a tensor autograd saved before the update then makes
    # backward raise instead of using the new values
    pool = torch.zeros(1, 4, 3, 8, device=DEV)
    a = torch.ones(1, 4, 3, 8, device=DEV, requires_grad=True)
    prod = a * pool  # saves pool for a's gradient
    args = _conv_args(pool)
    v0, e0 = pool._version, args[1]._version
    tops.conv1d_update_(*args, layer=0, layout="SD")
    assert pool._version > v0 and args[1]._version > e0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        prod.sum().backward()


@pytest.mark.parametrize("one_at_a_time", [False, True])
def test_torch_version_bumps_pass_over_inference_tensors(monkeypatch, one_at_a_time):
    # an inference tensor has no version counter; torch 2.4 (which pyproject allows) takes
    # one tensor at a time and raises on an inference tensor outside inference mode:
    # emulated here, where it raises, the launcher must still complete
    from mamba_align.backends.torch import ops as backend
    real = backend.increment_version
    seen = []

    def torch_2_4(t):
        if not isinstance(t, torch.Tensor):
            raise RuntimeError("increment_version expect a Tensor as input")
        if t.is_inference():
            raise RuntimeError("Inplace update to inference tensor outside InferenceMode")
        seen.append(t)
        real(t)
    if one_at_a_time:
        monkeypatch.setattr(backend, "increment_version", torch_2_4)
        monkeypatch.setattr(backend, "_BUMP_LIST", False)
    with torch.inference_mode():
        frozen = torch.zeros(1, 4, 3, 8, device=DEV)
    pool = torch.zeros(1, 4, 3, 8, device=DEV)
    for p in (frozen, pool):
        args = _conv_args(p)
        v0 = None if p.is_inference() else p._version
        with torch.no_grad():
            tops.conv1d_update_(*args, layer=0, layout="SD")
        assert p.is_inference() or p._version > v0
        assert not torch.equal(p, torch.zeros_like(p))  # written
    assert not one_at_a_time or any(t is pool for t in seen)


@pytest.mark.parametrize("grad_input", [False, True])
def test_torch_a_refused_call_leaves_the_version_counter(grad_input):
    # as torch's own in-place ops: a call refused before its kernel changes nothing, also
    # on the custom op's path (an input that requires grad), where torch bumps the arrays
    # an op updates before the op runs
    pool = torch.zeros(1, 4, 3, 8, device=DEV)
    args = list(_conv_args(pool))
    args[1] = torch.zeros(2, dtype=torch.int64, device=DEV)  # the flag must be int32
    if grad_input:
        args[3].requires_grad_()  # the weight
    v0 = pool._version
    with pytest.raises(TypeError, match="errors"):
        tops.conv1d_update_(*args, layer=0, layout="SD")
    assert pool._version == v0


def test_torch_copies_a_misaligned_broadcast_input_whole():
    # the launcher copies an input off a 16-byte boundary to aligned storage with the same
    # strides; a broadcast row (stride 0) cannot be copied element by element into such a
    # layout, so its span is copied (GPU launches only take this path: called directly)
    from mamba_align.backends.torch import ops as backend
    src = torch.arange(40, dtype=torch.float32).view(5, 8)
    x = src[1:2].expand(3, 8)[:, 1:]  # strides (0, 1), 36 bytes past src's start
    assert x.data_ptr() % 16 and x.stride() == (0, 1)

    class Plan:
        inputs, aliases = ("x",), {}
    args = {"x": x}
    backend._align_inputs(Plan, args)
    got = args["x"]
    assert got.data_ptr() % 16 == 0 and got.stride() == x.stride() and torch.equal(got, x)
    y = src[:, 1:5]  # an ordinary misaligned view: same strides, its own storage
    args = {"x": y}
    backend._align_inputs(Plan, args)
    assert args["x"].data_ptr() % 16 == 0 and args["x"].stride() == (8, 1)
    assert torch.equal(args["x"], y)


def test_jax_gradients_through_the_ops_raise():
    pool = jnp.ones((1, 4, 2, 2))
    src, dst = jnp.array([1], jnp.int32), jnp.array([2], jnp.int32)
    err = Args("jax").err()
    with pytest.raises(TypeError, match="copy_temporal is not differentiable"):
        jax.grad(lambda p: mj.ops.copy_temporal(p, err, src, dst)["pool"].sum())(pool)
    with pytest.raises(TypeError, match="copy_temporal is not differentiable"):
        jax.jit(jax.grad(lambda p: mj.ops.copy_temporal(p, err, src, dst)["pool"].sum()))(pool)
    # stopped gradients pass: the op sees a constant
    g = jax.grad(lambda p: (p + mj.ops.copy_temporal(jax.lax.stop_gradient(p), err, src,
                                                     dst)["pool"]).sum())(pool)
    assert np.asarray(g).tolist() == np.ones((1, 4, 2, 2)).tolist()

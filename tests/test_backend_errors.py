"""Both backends reject bad arguments with the same clear errors (the checks live once, in
the kernels' plan builders and in ``CacheConfig.check_pools``), before anything is
launched: dtype, rank, shape, strides, layout, static options, pools against the config.
Values are never read on the host (that would synchronise): the kernels skip ids they
cannot trust instead, which ``test_copy.py`` and ``test_bookkeeping.py`` check."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from backend_args import CFG, DEV, Args

from mamba_align.backends import jax as mj
from mamba_align.backends.torch import StateRunner
from mamba_align.backends.torch import ops as tops

# the launchers' own handling of framework-specific inputs: test_torch_launcher.py,
# test_jax_launcher.py


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


@pytest.mark.parametrize("narrow", ["state_idx", "acc", "num_computed"])
def test_slot_arrays_of_two_dtypes_are_refused(narrow):
    # the counts' bounds are the slot arrays' dtype's: an int32 state_idx beside int64 counts
    # had taken 2**33 tokens and stored a wrapped column (JAX, without x64, has int32 only)
    a = Args("torch")
    slots = dict(zip(("state_idx", "acc", "num_computed"), slots4(a)[:3]))
    slots[narrow] = slots[narrow].to(torch.int32)
    with pytest.raises(TypeError, match="must share one dtype"):
        tops.add_requests_(*slots.values(), a.err(), a.ids(0), a.ids(2**33 + 5), block_size=4)
    with pytest.raises(TypeError, match="must share one dtype"):
        tops.preprocess_resolve_(*step(a, **slots)[0], **step(a)[1])


def test_an_array_given_twice_is_named(a):
    # every array by position and one again by keyword: "multiple values", as Python says
    args = (a.f32(2, 6, 3, 4), a.err(), a.ids(1), a.ids(2))
    with pytest.raises(TypeError, match="got multiple values for src"):
        a.op("copy_temporal")(*args, src=a.ids(1))


def test_argument_errors_name_the_function_called(a):
    # torch's in-place functions end in an underscore: the message names the one called
    fn = "copy_conv_" if a.name == "torch" else "copy_conv"
    args = (a.f32(2, 6, 3, 4), a.err(), a.ids(1), a.ids(2), a.ids(0))
    with pytest.raises(TypeError, match=rf"^{fn}\(\) missing the keyword option 'layout'"):
        a.op("copy_conv")(*args)
    with pytest.raises(TypeError, match=rf"^{fn}\(\): missing a required argument: 'bias'"):
        a.op("copy_conv")(*args[:4], layout="SD")


def test_torch_strides_are_checked():
    pool = torch.zeros(2, 6, 3, 4, device=DEV)
    i64 = lambda *v: torch.tensor(v, device=DEV)  # noqa: E731
    with pytest.raises(ValueError, match="contiguous"):
        tops.copy_temporal_(pool, Args("torch").err(), i64(1, 2, 3, 4)[::2], i64(3, 4))
    with pytest.raises(ValueError, match="inner block"):
        tops.copy_temporal_(pool.transpose(2, 3), Args("torch").err(), i64(1), i64(2))



# -- the runners: pools against the config, the same rule in both ---------------------------


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


@pytest.mark.parametrize("mode", ["pre-copy", "copy-free"])
def test_a_pool_that_requires_grad_is_refused_before_the_step_changes_anything(mode):
    # the copies refuse such a pool, but they ran after the bookkeeping: a pre-copy step was
    # left marked in flight, and a copy-free postprocess had accepted the tokens without
    # their snapshot copy (the next step then read a stale block, with no error flagged)
    pools, ids = pools_of("torch"), _ids
    runner = StateRunner(CFG, 4, DEV, mode=mode)
    runner.add_requests(ids(0), ids(5))
    bt = torch.as_tensor(BT, device=DEV)
    wants_grad = dict(pools, ssm=pools["ssm"].clone().requires_grad_())

    def state():
        return [t.clone() for t in (runner.state_idx, runner.acc, runner.num_computed)]
    before = state()
    with pytest.raises(RuntimeError, match=r"pools\['ssm'\] requires grad"):
        runner.preprocess(wants_grad, ids(0), ids(2), ids(True), bt)
    assert all(torch.equal(x, y) for x, y in zip(before, state()))
    runner.preprocess(pools, ids(0), ids(2), ids(True), bt)
    during = state()
    with pytest.raises(RuntimeError, match="requires grad"):
        runner.postprocess(wants_grad, ids(0), ids(2), ids(True), ids(2), bt)
    assert all(torch.equal(x, y) for x, y in zip(during, state()))
    with torch.no_grad():  # no gradient wanted: the pool serves
        runner.postprocess(wants_grad, ids(0), ids(2), ids(True), ids(2), bt)
    assert runner.errors() == []


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

"""The runners on bad input (docs/semantics.md §1): the torch StateRunner and the JAX step
functions record faults in their error flag and decode them; postprocess called twice is
caught; the checked mode (validate=True) raises with the faults' messages and changes
nothing, in torch eagerly and in JAX eagerly or through checkify under jax.jit."""

import numpy as np
import pytest
import torch
from fault_cases import B, BT, NB, S, table_with

from mamba_align.core import Fault
from mamba_align.core.faults import MESSAGES


def runner_case():
    """Pools with distinct contents and a block table naming block 99 (of 26) for slot 1."""
    from mamba_align.core import CacheConfig, ConvSpec, TemporalSpec

    cfg = CacheConfig(B, S, 1, {"conv": ConvSpec(3, 4, "SD", "float32"),
                                "ssm": TemporalSpec((2, 2), "float32")})
    pools = {n: np.arange(np.prod(cfg.pool_shape(n, NB)), dtype=np.float32)
             .reshape(cfg.pool_shape(n, NB)) for n in cfg.states}
    bt = table_with(1, 1, 99)
    return cfg, pools, bt


def jax_runner_case():
    """The JAX runner on ``runner_case``: slots 0 and 1 admitted with 3 tokens each."""
    import jax.numpy as jnp

    from mamba_align.backends import jax as mj

    cfg, pools, bt = runner_case()
    jp = {n: jnp.asarray(p) for n, p in pools.items()}
    state = mj.add_requests(mj.init_state(4), jnp.array([0, 1]), jnp.array([3, 3]), config=cfg)
    return mj, cfg, pools, jp, state, bt


def torch_runner_step(validate, bt_bad=True):
    from mamba_align.backends.torch import StateRunner

    cfg, pools, bt = runner_case()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    r = StateRunner(cfg, 4, dev, validate=validate)
    T = lambda a: torch.as_tensor(np.asarray(a), device=dev)  # noqa: E731
    tp = {n: T(p) for n, p in pools.items()}
    r.add_requests(T([0, 1]), T([3, 3]))
    before = [t.clone() for t in (r.state_idx, r.acc, r.num_computed)] + \
        [p.clone() for p in tp.values()]
    step = (T([0, 1]), T([2, 2]), T([True, True]), T(bt if bt_bad else BT))
    return r, tp, step, before


def test_torch_runner_records_faults_and_decodes_them():
    r, tp, step, _ = torch_runner_step(validate=False)
    assert r.errors() == []
    blocks = r.preprocess(tp, *step)
    assert blocks.run_col.tolist() == [1, -1]  # slot 1 skipped, slot 0 served
    assert r.errors() == [MESSAGES[Fault.BAD_BLOCK]]
    with pytest.raises(ValueError, match="lowest offending row: 1"):
        r.raise_errors()
    cache = r.postprocess(tp, step[0], step[1], step[2], torch.ones_like(step[1]), step[3])
    assert cache[1] == -1 and r.acc[1] == 0  # faulty until re-admitted
    assert r.faulty_slots() == [1]
    r.clear_errors()
    assert r.errors() == []
    r.preprocess(tp, *step)  # a step on the faulty slot: skipped again, and said
    assert r.errors() == [MESSAGES[Fault.FAULTY_SLOT]]
    r.postprocess(tp, step[0], step[1], step[2], torch.ones_like(step[1]), step[3])
    r.add_requests(torch.as_tensor([1], device=r.device), torch.as_tensor([0], device=r.device))
    assert r.faulty_slots() == []  # re-admitted


def test_torch_postprocess_twice_is_caught():
    r, tp, step, _ = torch_runner_step(validate=False, bt_bad=False)
    r.preprocess(tp, *step)
    ns = torch.ones_like(step[1])
    first = r.postprocess(tp, step[0], step[1], step[2], ns, step[3])
    nc = r.num_computed.clone()
    again = r.postprocess(tp, step[0], step[1], step[2], ns, step[3])
    assert r.errors() == [MESSAGES[Fault.STEP_ORDER]]
    assert again.tolist() == [-1, -1] and first.tolist() == [0, 0]
    assert torch.equal(r.num_computed, nc)  # tokens not counted twice
    assert r.acc.tolist()[:2] == [0, 0]


def test_torch_checked_mode_raises_and_changes_nothing():
    r, tp, step, before = torch_runner_step(validate=True)
    with pytest.raises(ValueError, match="bad step input, nothing changed .lowest offending "
                                         "row: 1.: the block table names"):
        r.preprocess(tp, *step)
    after = [r.state_idx, r.acc, r.num_computed] + list(tp.values())
    assert all(torch.equal(x, y) for x, y in zip(before, after))
    assert r.errors() == []  # nothing recorded: the step did not run
    with pytest.raises(ValueError, match="slots name a slot outside"):
        r.add_requests(torch.as_tensor([9], device=r.device), torch.as_tensor([0], device=r.device))
    # a good step runs as in the fast path
    good = (step[0], step[1], step[2], torch.as_tensor(BT, device=r.device))
    assert r.preprocess(tp, *good).run_col.tolist() == [1, 1]
    r.postprocess(tp, *good[:3], torch.ones_like(step[1]), good[3])
    with pytest.raises(ValueError, match="steps out of order"):
        r.postprocess(tp, *good[:3], torch.ones_like(step[1]), good[3])


def test_jax_runner_records_faults_and_the_checked_mode_raises():
    import jax
    import jax.numpy as jnp
    from jax.experimental import checkify

    mj, cfg, pools, jp, state, bt = jax_runner_case()
    step = (jnp.array([0, 1]), jnp.array([2, 2]), jnp.array([True, True]), jnp.asarray(bt))
    # the fast path: served without the bad row, the flag says why
    st1, _, blocks = mj.preprocess(state, jp, *step, config=cfg)
    assert np.asarray(blocks.run_col).tolist() == [1, -1]
    assert mj.errors(st1) == [MESSAGES[Fault.BAD_BLOCK]]
    assert mj.errors(mj.clear_errors(st1)) == []
    assert mj.faulty_slots(st1) == [1] and mj.faulty_slots(state) == []
    # checked, eagerly: raises ValueError, as the torch runner does, with its message
    with pytest.raises(ValueError, match=r"^bad step input, nothing changed \(lowest offending "
                                         r"row: 1\): the block table"):
        mj.preprocess(state, jp, *step, config=cfg, validate=True)

    # checked under jit: checkify reports it, and the step changed nothing
    def run(state, pools, *args):
        return mj.preprocess(state, pools, *args, config=cfg, validate=True)

    err, (st2, jp2, _) = checkify.checkify(jax.jit(run))(state, jp, *step)
    assert "the block table names" in err.get()
    for f in ("state_idx", "acc", "num_computed", "errors"):
        assert np.array_equal(np.asarray(getattr(st2, f)), np.asarray(getattr(state, f))), f
    assert all(np.array_equal(np.asarray(jp2[n]), pools[n]) for n in pools)
    # a good checked step under checkify: no error, the same result as the fast path
    good = step[:3] + (jnp.asarray(BT),)
    err, (st3, _, b3) = checkify.checkify(jax.jit(run))(state, jp, *good)
    assert err.get() is None
    _, _, b4 = mj.preprocess(state, jp, *good, config=cfg)
    assert np.array_equal(np.asarray(b3.temporal_write), np.asarray(b4.temporal_write))


def test_jax_checked_postprocess_masks_every_result():
    import jax
    import jax.numpy as jnp
    from jax.experimental import checkify

    mj, cfg, _, jp, state, _ = jax_runner_case()
    step = (jnp.array([0, 1]), jnp.array([1, 1]), jnp.array([True, True]), jnp.asarray(BT))
    state, jp, _ = mj.preprocess(state, jp, *step, config=cfg)

    def post(state, pools, ns):
        return mj.postprocess(state, pools, step[0], step[1], step[2], ns, step[3], config=cfg,
                              validate=True)

    err, (st, _, cache) = checkify.checkify(jax.jit(post))(state, jp, jnp.array([1, 0]))
    assert "num_sampled must be in" in err.get()
    assert np.asarray(cache).tolist() == [-1, -1]  # the good row's column withheld too
    assert np.array_equal(np.asarray(st.acc), np.asarray(state.acc))
    err, (_, _, cache) = checkify.checkify(jax.jit(post))(state, jp, jnp.array([1, 1]))
    assert err.get() is None and np.asarray(cache).tolist() == [0, 0]

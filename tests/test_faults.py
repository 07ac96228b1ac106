"""Bad input on the device path (docs/semantics.md §1, "Bad values"), both backends: every
fault is served as a skipped row (no bookkeeping, no block, no copy, no cache column), the
row's slot is left faulty (acc = 0) until re-admitted, the error flag names the fault, and
the good rows of the same step give exactly what they give alone. The runners' error
readers decode the flag into the core's messages."""

import numpy as np
import pytest
import torch
from support import Torch, in_flight, make_backend, slots

from mamba_align.core import Fault, decode_errors, error_row, new_errors, raise_errors
from mamba_align.core.faults import MESSAGES, NO_ROW

B, S = 4, 3
BT = np.arange(10, 26).reshape(4, 4)  # slot r owns blocks 10 + 4r .. 13 + 4r
NB = 26
PER_ROW_EMPTY = {"src_col": -1, "src_bias": 0, "run_col": -1, "copy_tsrc": -1, "copy_csrc": -1,
                 "copy_dst": -1, "copy_bias": 0, "temporal_read": -1, "conv_read": -1,
                 "conv_read_bias": 0, "conv_write": -1}
GOOD = (0, 1, 3)  # slot 1: column 0, acc 1, 3 tokens; one more token crosses into column 1


def bits(backend):
    return Fault(int(backend.last_errors[0]))


def state_with(slot0, good=GOOD):
    """Slot 0 as given (state_idx, acc, num_computed), slot 1 a good request, 2-3 unused."""
    cols = list(zip(slot0, good, (-1, 1, 0), (-1, 1, 0)))
    return slots(*cols)


def assert_skipped(out, b, what):
    for n, v in PER_ROW_EMPTY.items():
        assert out[n][b] == v, (what, n)
    assert (out["temporal_write"][b] == -1).all(), what


def assert_good_row_as_alone(backend, state, new, out, bt=BT, num_blocks=NB):
    alone_state, alone = backend.preprocess_resolve(state, [1], [1], [True], bt, B, S,
                                                    num_blocks=num_blocks)
    assert all(np.array_equal(out[n][1], alone[n][0]) for n in out)
    assert [getattr(new, f)[1] for f in ("state_idx", "acc", "num_computed")] == \
        [getattr(alone_state, f)[1] for f in ("state_idx", "acc", "num_computed")]


# -- preprocess ---------------------------------------------------------------------------------
def table_with(r, c, block):
    bt = BT.copy()
    bt[r, c] = block
    return bt


PRE_CASES = [
    # (slot 0 state, its query_len, is_spec, block table, num_blocks, expected fault, why)
    ((0, 1, 3), 2, 1, table_with(0, 1, 99), NB, Fault.BAD_BLOCK, "block 99 in a pool of 26"),
    ((0, 1, 3), 2, 1, table_with(0, 1, -3), NB, Fault.BAD_BLOCK, "a negative id other than -1"),
    ((0, 1, 3), 2, 1, table_with(0, 1, 0), NB, Fault.BAD_BLOCK, "the null block"),
    ((0, 2, 3), 1, 1, table_with(0, 1, 99), NB, Fault.BAD_BLOCK, "read slot 99 (acc 2)"),
    ((1, 2, 7), 2, 1, table_with(0, 1, 99), NB, Fault.BAD_BLOCK, "pre-copy source 99"),
    ((3, 1, 15), 2, 1, BT, NB, Fault.BAD_COLUMN, "a window past the block table"),
    ((0, 1, 3), 5, 1, BT, NB, Fault.BAD_QUERY_LEN, "a spec row with query_len 5 > 1 + S"),
    ((0, 1, 3), 0, 0, BT, NB, Fault.BAD_QUERY_LEN, "a row without tokens"),
    ((0, 1, 3), 2, 2, BT, NB, Fault.BAD_IS_SPEC, "is_spec 2 (num_sampled passed instead?)"),
    ((0, 0, 3), 1, 1, BT, NB, Fault.FAULTY_SLOT, "a faulty slot"),
    ((0, -1, 3), 1, 1, BT, NB, Fault.STEP_ORDER, "a step in flight: never postprocessed"),
    ((0, 9, 3), 1, 1, BT, NB, Fault.INCONSISTENT, "acc past the window"),
]


@pytest.mark.parametrize("slot0,q,spec,bt,nb,fault,why", PRE_CASES, ids=[c[-1] for c in PRE_CASES])
def test_preprocess_skips_a_faulty_row_and_flags_it(device_backend, slot0, q, spec, bt, nb,
                                                    fault, why):
    s = state_with(slot0)
    new, out = device_backend.preprocess_resolve(s, [0, 1], [q, 1], [spec, 1], bt, B, S,
                                                 num_blocks=nb)
    assert bits(device_backend) == fault and device_backend.last_errors[1] == 0, why
    assert_skipped(out, 0, why)
    assert (new.state_idx[0], new.acc[0], new.num_computed[0]) == (slot0[0], 0, slot0[2]), why
    assert_good_row_as_alone(device_backend, s, new, out, bt, nb)


def test_pools_smaller_than_the_block_table(device_backend):
    # pools of 12 blocks: slot 0 crosses into column 1 and writes columns 1-2 (blocks 11,
    # 12): block 12 is past the pools; slot 1 (blocks 2..5) is fine
    s = state_with((0, 1, 3))
    bt = BT.copy()
    bt[1] = [2, 3, 4, 5]
    new, out = device_backend.preprocess_resolve(s, [0, 1], [2, 1], [1, 1], bt, B, S,
                                                 num_blocks=12)
    assert bits(device_backend) == Fault.BAD_BLOCK
    assert_skipped(out, 0, "blocks past the smallest pool")
    assert_good_row_as_alone(device_backend, s, new, out, bt, 12)


def test_minus_one_where_a_row_only_writes_drops_the_write(device_backend):
    # -1 = no block (docs/semantics.md §1): a candidate written there is dropped, unflagged
    s = state_with((0, 1, 3))
    new, out = device_backend.preprocess_resolve(s, [0], [2], [1], table_with(0, 2, -1), B, S,
                                                 num_blocks=NB)
    assert bits(device_backend) == 0
    assert out["temporal_write"][0].tolist() == [11, -1, -1, -1]  # window columns 1, 2
    assert new.state_idx[0] == 1


def test_duplicate_rows_are_both_skipped(device_backend):
    s = state_with((0, 1, 3))
    new, out = device_backend.preprocess_resolve(s, [0, 1, 0], [1, 1, 1], [1, 1, 1], BT, B, S,
                                                 num_blocks=NB)
    assert bits(device_backend) == Fault.DUPLICATE_SLOT and device_backend.last_errors[1] == 0
    assert_skipped(out, 0, "duplicate")
    assert_skipped(out, 2, "duplicate")
    assert new.acc[0] == 0 and new.state_idx[0] == 0
    assert_good_row_as_alone(device_backend, s, new, out)


@pytest.mark.parametrize("n,partner", [(80, 70), (300, 290)])
def test_duplicates_are_found_across_programs(device_backend, n, partner):
    # rows of several programs, compared in several tiles
    s = slots(np.zeros(n, np.int64), np.ones(n, np.int64), np.full(n, 3))
    bt = np.arange(1, 1 + n * 4).reshape(n, 4)
    idx = np.arange(n)
    idx[partner] = 3
    _, out = device_backend.preprocess_resolve(s, idx, np.ones(n), np.ones(n), bt, B, S)
    assert bits(device_backend) == Fault.DUPLICATE_SLOT and device_backend.last_errors[1] == 3
    assert out["run_col"][3] == out["run_col"][partner] == -1
    assert (np.delete(out["run_col"], [3, partner]) == 0).all()


@pytest.mark.parametrize("bad_slot", [7, -3])
def test_a_slot_outside_the_arrays_is_skipped_and_flagged(device_backend, bad_slot):
    s = state_with((0, 1, 3))
    new, out = device_backend.preprocess_resolve(s, [bad_slot, 1], [1, 1], [1, 1], BT, B, S,
                                                 num_blocks=NB)
    assert bits(device_backend) == Fault.BAD_SLOT
    assert_skipped(out, 0, "bad slot")
    assert new.acc.tolist()[0] == 1  # no slot to mark faulty
    assert_good_row_as_alone(device_backend, s, new, out)


def test_num_computed_near_the_int32_limit_is_flagged():
    # int32 per-slot arrays: 2^31 - 3 computed tokens plus 4 scheduled would wrap
    for name in ("torch", "jax"):
        backend = make_backend(name, index_dtype="int32")
        s = state_with((0, 1, 2**31 - 3))
        new, out = backend.preprocess_resolve(s, [0, 1], [4, 1], [1, 1], BT, B, S, num_blocks=NB)
        assert Fault.OVERFLOW in bits(backend), name
        assert_skipped(out, 0, "overflow")
        assert_good_row_as_alone(backend, s, new, out)


# -- postprocess --------------------------------------------------------------------------------
POST_CASES = [
    # (slot 0 state, query_len, is_spec, num_sampled, table, expected fault, why)
    # column 1 recorded at 8 tokens, the state moved to column 2: num_sampled = 0 would
    # re-copy window column 0 over the recorded column 1
    ((2, 2, 8), 2, 1, 0, BT, Fault.BAD_NUM_SAMPLED, "num_sampled = 0 on a boundary"),
    ((1, 1, 6), 5, 1, 2, BT, Fault.BAD_QUERY_LEN, "query_len 5 > 1 + S: never-written candidates"),
    ((1, 1, 6), 2, 1, 3, BT, Fault.BAD_NUM_SAMPLED, "num_sampled > query_len"),
    ((1, 1, 8), 0, 0, 0, BT, Fault.BAD_QUERY_LEN, "a non-spec row without tokens, on a boundary"),
    ((1, 1, 6), 2, 3, 2, BT, Fault.BAD_IS_SPEC, "is_spec 3"),
    ((3, 1, 2), 2, 1, 2, BT, Fault.INCONSISTENT, "boundary column 0 far behind column 3"),
    ((1, 1, 6), 2, 1, 2, table_with(0, 1, 99), Fault.BAD_BLOCK, "cached block 99"),
    ((1, 2, 6), 2, 1, 2, table_with(0, 2, 99), Fault.BAD_BLOCK, "copy source 99"),
    ((-1, 1, 0), 8, 0, 1, BT, Fault.INCONSISTENT, "postprocess with no running column"),
]


@pytest.mark.parametrize("slot0,q,spec,ns,bt,fault,why", POST_CASES,
                         ids=[c[-1] for c in POST_CASES])
def test_postprocess_skips_a_faulty_row_and_caches_nothing(device_backend, slot0, q, spec, ns,
                                                           bt, fault, why):
    s = state_with(slot0, good=(0, 1, 3))
    new, out = device_backend.postprocess(s, [0, 1], [q, 1], [spec, 1], [ns, 1], bt, B, S,
                                          num_blocks=NB)
    assert bits(device_backend) == fault and device_backend.last_errors[1] == 0, why
    assert out["cache_col"][0] == -1, why
    assert all(out[n][0] == -1 for n in ("copy_tsrc", "copy_csrc", "copy_dst")), why
    assert (new.state_idx[0], new.acc[0], new.num_computed[0]) == (slot0[0], 0, slot0[2]), why
    # the good row of the same step gives its result alone (3 + 1 = 4: column 0's boundary)
    alone, alone_out = device_backend.postprocess(s, [1], [1], [True], [1], bt, B, S,
                                                  num_blocks=NB)
    assert (out["cache_col"][1], new.num_computed[1], new.acc[1]) == (0, 4, 1)
    assert alone_out["cache_col"].tolist() == [0] and alone.num_computed[1] == 4


def test_a_cached_block_of_minus_one_gives_no_cache_column(device_backend):
    s = state_with((1, 1, 6))
    _, out = device_backend.postprocess(s, [0], [2], [1], [2], table_with(0, 1, -1), B, S,
                                        num_blocks=NB)
    assert bits(device_backend) == 0 and out["cache_col"].tolist() == [-1]


def test_postprocess_skips_a_faulty_slot_silently(device_backend):
    # it was flagged when it became faulty; the step's postprocess changes nothing more
    s = state_with((1, 0, 6))
    new, out = device_backend.postprocess(s, [0], [2], [1], [2], BT, B, S, num_blocks=NB)
    assert bits(device_backend) == 0 and out["cache_col"].tolist() == [-1]
    assert (new.acc[0], new.num_computed[0]) == (0, 6)


# -- add_requests -------------------------------------------------------------------------------
@pytest.mark.parametrize("slots_,nc,fault,faulty", [
    ([7, 1], [5, 4], Fault.BAD_SLOT, []),
    ([-3, 1], [5, 4], Fault.BAD_SLOT, []),
    ([2, 1], [-4, 4], Fault.BAD_NUM_COMPUTED, [2]),
    ([2, 1, 2], [5, 4, 9], Fault.DUPLICATE_SLOT, [2]),
])
def test_add_requests_skips_bad_rows(device_backend, slots_, nc, fault, faulty):
    s = state_with((0, 1, 3))
    new = device_backend.add_requests(s, slots_, nc, B)
    assert bits(device_backend) == fault and device_backend.last_errors[1] == 0
    assert new.num_computed[1] == 4 and new.state_idx[1] == 0  # the good admission
    for r in range(4):
        if r in faulty:
            assert new.acc[r] == 0  # left faulty, not stale
        elif r != 1:
            assert [getattr(new, f)[r] for f in ("state_idx", "acc", "num_computed")] == \
                [getattr(s, f)[r] for f in ("state_idx", "acc", "num_computed")]


def test_add_requests_skips_minus_one_silently(device_backend):
    new = device_backend.add_requests(state_with((0, 1, 3)), [-1, 2], [5, 4], B)
    assert bits(device_backend) == 0 and new.num_computed.tolist() == [3, 3, 4, 0]


def test_int64_num_computed_past_int32_state_is_flagged():
    backend = Torch(index_dtype="int32")
    s = state_with((0, 1, 3))
    st = backend._state(s)
    backend.ops.add_requests_(*st, backend.ids([2]), torch.tensor([2**31], device=backend.device),
                              block_size=B)
    new = backend._back(st)
    assert bits(backend) == Fault.BAD_NUM_COMPUTED and new.acc[2] == 0


def test_re_admission_clears_a_faulty_slot(device_backend):
    s = state_with((0, 0, 3))  # slot 0 faulty
    new = device_backend.add_requests(s, [0], [4], B)
    assert bits(device_backend) == 0 and (new.state_idx[0], new.acc[0]) == (0, 1)
    _, out = device_backend.preprocess_resolve(new, [0], [1], [1], BT, B, S, num_blocks=NB)
    assert bits(device_backend) == 0 and out["run_col"].tolist() == [1]


# -- the error flag ---------------------------------------------------------------------------
def test_decoding_the_error_flag():
    assert decode_errors(new_errors()) == [] and error_row(new_errors()) is None
    raise_errors(new_errors())  # clear: nothing raised
    e = np.array([int(Fault.BAD_BLOCK | Fault.DUPLICATE_SLOT), 3], np.int32)
    assert decode_errors(e) == [MESSAGES[Fault.DUPLICATE_SLOT], MESSAGES[Fault.BAD_BLOCK]]
    assert error_row(e) == 3
    with pytest.raises(ValueError, match=r"lowest offending row: 3\): two rows of one step"):
        raise_errors(e)
    assert "unknown fault bits" in decode_errors(np.array([1 << 20, NO_ROW]))[0]
    with pytest.raises(ValueError, match="shape"):
        decode_errors(np.zeros(3))


def test_the_flag_is_sticky_and_keeps_the_lowest_row(device_backend):
    """Faults OR together across launches; the row is the lowest seen."""
    import jax.numpy as jnp

    s = state_with((0, 1, 3))
    if device_backend.name == "torch":
        st = device_backend._state(s)
        ops = device_backend.ops
        ops.add_requests_(*st, device_backend.ids([1, 9]), device_backend.ids([4, 4]), block_size=B)
        ops.add_requests_(*st, device_backend.ids([3, 3, 1]), device_backend.ids([0, 0, 0]),
                          block_size=B)
        e = device_backend.host(st[3])
    else:
        st = device_backend._state(s)
        out = device_backend.ops.add_requests(*st, jnp.array([1, 9]), jnp.array([4, 4]),
                                              block_size=B)
        out = device_backend.ops.add_requests(out["state_idx"], out["acc"], out["num_computed"],
                                              out["errors"], jnp.array([3, 3, 1]),
                                              jnp.array([0, 0, 0]), block_size=B)
        e = np.asarray(out["errors"])
    assert Fault(int(e[0])) == Fault.BAD_SLOT | Fault.DUPLICATE_SLOT and e[1] == 0


# -- the runners: the flag in the fast path, raising in the checked mode -----------------------
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
    r.clear_errors()
    assert r.errors() == []
    r.preprocess(tp, *step)  # a step on the faulty slot: skipped again, and said
    assert r.errors() == [MESSAGES[Fault.FAULTY_SLOT]]


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
    # checked, eagerly: raises
    with pytest.raises(Exception, match="bad step input, nothing changed: the block table"):
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


# -- the core's screen names the same faults as the kernels -----------------------------------
@pytest.mark.parametrize("slot0,q,spec,bt,nb,fault,why", PRE_CASES, ids=[c[-1] for c in PRE_CASES])
def test_the_screen_agrees_on_preprocess(slot0, q, spec, bt, nb, fault, why):
    from mamba_align.core import screen_preprocess

    s = state_with(slot0)
    bits_ = screen_preprocess(s.state_idx, s.acc, s.num_computed, [0, 1], [q, 1], [spec, 1], bt,
                              block_size=B, num_spec=S, num_blocks=nb)
    assert bits_.tolist() == [int(fault), 0], why


@pytest.mark.parametrize("slot0,q,spec,ns,bt,fault,why", POST_CASES,
                         ids=[c[-1] for c in POST_CASES])
def test_the_screen_agrees_on_postprocess(slot0, q, spec, ns, bt, fault, why):
    from mamba_align.core import screen_postprocess

    s = in_flight(state_with(slot0, good=(0, 1, 3)), [0, 1])
    bits_ = screen_postprocess(s.state_idx, s.acc, s.num_computed, [0, 1], [q, 1], [spec, 1],
                               [ns, 1], bt, block_size=B, num_spec=S, num_blocks=NB)
    assert bits_.tolist() == [int(fault), 0], why


def test_the_screen_on_admissions_duplicates_and_overflow():
    from mamba_align.core import screen_add_requests, screen_preprocess

    assert screen_add_requests(4, [7, 1, 2, 2, -1], [5, -4, 0, 0, 3]).tolist() == [
        int(Fault.BAD_SLOT), int(Fault.BAD_NUM_COMPUTED), int(Fault.DUPLICATE_SLOT),
        int(Fault.DUPLICATE_SLOT), 0]
    assert screen_add_requests(4, [1], [2**31], index_dtype="int32").tolist() == [
        int(Fault.BAD_NUM_COMPUTED)]
    s = state_with((0, 1, 2**31 - 3))
    got = screen_preprocess(s.state_idx, s.acc, s.num_computed, [0, 1, 1], [4, 1, 1], [1, 1, 1],
                            BT, block_size=B, num_spec=S, num_blocks=NB, index_dtype="int32")
    assert got.tolist() == [int(Fault.OVERFLOW), int(Fault.DUPLICATE_SLOT),
                            int(Fault.DUPLICATE_SLOT)]


# -- found in review: aliasing ids, wrapping counts, missing read blocks ----------------------
def test_a_bad_int64_slot_does_not_alias_a_good_one():
    backend = Torch()  # int64 ids: 2^32 + 1 must not compare equal to slot 1
    s = state_with((0, 1, 3))
    new, out = backend.preprocess_resolve(s, [2**32 + 1, 1], [1, 1], [1, 1], BT, B, S,
                                          num_blocks=NB)
    assert bits(backend) == Fault.BAD_SLOT and out["run_col"][1] == 0 and new.acc[1] == 1


def test_a_count_that_would_wrap_int64_is_an_overflow():
    backend = Torch(index_dtype="int32")
    s = state_with((0, 1, 999))
    st = backend._state(s)
    huge = torch.tensor([2**63 - 1], device=backend.device)
    backend.ops.preprocess_resolve_(*st, backend.ids([0]), huge, backend.ids([0]),
                                    backend.ids(BT), block_size=B, num_spec=S, num_blocks=NB,
                                    mode="pre-copy")
    backend._back(st)
    assert Fault(int(backend.last_errors[0])) == Fault.OVERFLOW
    st = backend._state(in_flight(s, [0]))
    backend.ops.postprocess_(*st, backend.ids([0]), huge, backend.ids([0]), backend.ids([1]),
                             backend.ids(BT), block_size=B, num_spec=S, num_blocks=NB)
    new = backend._back(st)
    assert Fault(int(backend.last_errors[0])) == Fault.OVERFLOW and new.num_computed[0] == 999


@pytest.mark.parametrize("mode", ["pre-copy", "copy-free"])
@pytest.mark.parametrize("col,why", [(0, "the old column: the temporal source of the crossing"),
                                     (1, "the new running block")])
def test_a_missing_block_a_row_reads_is_a_fault_in_both_modes(device_backend, mode, col, why):
    # slot 0 at column 0 crosses into column 1; a -1 where it reads its state would make
    # it compute from a zero or stale state and cache that later
    s = state_with((0, 1, 3))
    new, out = device_backend.preprocess_resolve(s, [0, 1], [2, 1], [0, 1],
                                                 table_with(0, col, -1), B, S, mode,
                                                 num_blocks=NB)
    assert bits(device_backend) == Fault.BAD_BLOCK, why
    assert_skipped(out, 0, why)
    assert new.acc[0] == 0


def test_postprocess_on_a_faulty_slot_stays_silent_with_huge_counts(device_backend):
    s = state_with((1, 0, 6))
    _, out = device_backend.postprocess(s, [0], [2**30], [0], [1], BT, B, S, num_blocks=NB)
    assert bits(device_backend) == 0 and out["cache_col"].tolist() == [-1]


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

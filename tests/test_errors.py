"""Bad input to every public entry point of ``mamba_align.core`` raises a clear
``TypeError`` / ``ValueError`` that names the offending argument, and the pure bookkeeping
functions never mutate their inputs.

Every error case first runs the *good* call (so the case proves that exactly the one
replaced argument is what breaks it), then replaces one argument and checks the error
type and that the message names the argument.
"""

import re

import numpy as np
import pytest

from mamba_align.core import (
    BlockPool,
    CacheConfig,
    ConvSpec,
    PostprocessPlan,
    PreprocessPlan,
    Scheduler,
    SlotState,
    SymbolicRunner,
    TemporalSpec,
    accept,
    add_requests,
    apply_conv_copy,
    apply_copy,
    apply_temporal_copy,
    copy_plan,
    gather_columns,
    init_slots,
    pad_batch,
    postprocess,
    postprocess_copy_plan,
    precopy_plan,
    preprocess,
    resolve_blocks,
    running_column,
    window_blocks,
)

B, S = 4, 1
BT = np.arange(1, 16, dtype=np.int64).reshape(3, 5)  # 3 slots x 5 columns, ids 1..15
IDX = np.array([0, -1, 1])
QLEN = np.array([2, 0, 4])  # slot 0: 7 -> 9 tokens crosses column 1 -> 2; slot 1: fresh
SPEC = np.array([True, False, False])


def _state() -> SlotState:
    """Slot 0: 7 computed tokens (column 1), slot 1 fresh, slot 2: 3 computed (column 0)."""
    return add_requests(init_slots(3), np.array([0, 2]), np.array([7, 3]), B)


def _config() -> CacheConfig:
    return CacheConfig(
        B, S, states={"conv": ConvSpec(3, 2, "SD", "float32"), "ssm": TemporalSpec((2,))}
    )


def _scheduler() -> Scheduler:
    s = Scheduler(_config(), num_blocks=16, max_num_seqs=2, max_num_tokens=8, max_model_len=32)
    s.add_request(0, [1, 2, 3], [4, 5])
    return s


def _copy_plan():
    return copy_plan(BT, np.array([0, 1]), np.array([1, -1]), np.array([2, 0]), np.array([1, 0]))


def _held_pool() -> BlockPool:
    pool = BlockPool(8)
    assert pool.allocate() == 1
    return pool


def _scheduled():
    s = _scheduler()
    batch = s.schedule()
    return s, batch


def _update():
    s, batch = _scheduled()
    return s.update, dict(batch=batch, num_sampled=s.sample(batch))


def _resolve():
    state, plan = preprocess(_state(), IDX, QLEN, B)
    return resolve_blocks, dict(
        block_table=BT, idx_mapping=IDX, state=state, plan=plan, query_len=QLEN,
        is_spec=SPEC, num_spec=S, mode="pre-copy",
    )


#: name -> factory returning ``(callable, good keyword arguments)``; fresh objects per call.
GOOD = {
    "CacheConfig": lambda: (CacheConfig, dict(block_size=B, num_spec=S, num_layers=1,
                                              states={"ssm": TemporalSpec((2,))})),
    "CacheConfig.pool_shape": lambda: (_config().pool_shape, dict(name="ssm", num_blocks=4)),
    "CacheConfig.columns_needed": lambda: (_config().columns_needed, dict(num_tokens=5)),
    "ConvSpec": lambda: (ConvSpec, dict(kernel_size=4, dim=8, layout="SD", dtype="bfloat16")),
    "TemporalSpec": lambda: (TemporalSpec, dict(shape=(2, 3), dtype="float32")),
    "init_slots": lambda: (init_slots, dict(num_slots=3)),
    "add_requests": lambda: (add_requests, dict(state=_state(), slots=np.array([1]),
                                                num_computed=np.array([5]), block_size=B)),
    "preprocess": lambda: (preprocess, dict(state=_state(), idx_mapping=IDX, query_len=QLEN,
                                            block_size=B)),
    "accept": lambda: (accept, dict(state=_state(), idx_mapping=IDX, query_len=QLEN,
                                    num_sampled=np.array([2, 0, 0]), is_spec=SPEC)),
    "postprocess": lambda: (postprocess, dict(state=_state(), idx_mapping=IDX, block_size=B)),
    "running_column": lambda: (running_column, dict(state_idx=np.array([0, -1]),
                                                    num_tokens=np.array([5, 1]), block_size=B)),
    "window_blocks": lambda: (window_blocks, dict(block_table=BT, idx_mapping=IDX,
                                                  run_col=np.array([2, -1, 0]), num_spec=S)),
    "gather_columns": lambda: (gather_columns, dict(block_table=BT, idx_mapping=IDX,
                                                    cols=np.array([[0, 1], [0, 0], [3, 4]]))),
    "resolve_blocks": _resolve,
    "copy_plan": lambda: (copy_plan, dict(block_table=BT, idx_mapping=np.array([0, 1]),
                                          src_col=np.array([1, -1]), dst_col=np.array([2, 0]),
                                          bias=np.array([1, 0]))),
    "precopy_plan": lambda: (precopy_plan, dict(block_table=BT, idx_mapping=IDX,
                                                plan=preprocess(_state(), IDX, QLEN, B)[1])),
    "postprocess_copy_plan": lambda: (postprocess_copy_plan, dict(
        block_table=BT, idx_mapping=IDX, plan=postprocess(_state(), IDX, B)[1])),
    "apply_temporal_copy": lambda: (apply_temporal_copy, dict(pool=np.zeros((1, 16, 2)),
                                                              plan=_copy_plan())),
    "apply_conv_copy": lambda: (apply_conv_copy, dict(pool=np.zeros((1, 16, 3, 2)),
                                                      plan=_copy_plan(), layout="SD")),
    "apply_copy": lambda: (apply_copy, dict(
        pools={"conv": np.zeros((1, 16, 3, 2), np.float32), "ssm": np.zeros((1, 16, 2))},
        config=_config(), plan=_copy_plan())),
    "BlockPool": lambda: (BlockPool, dict(num_blocks=8)),
    "BlockPool.hold": lambda: (_held_pool().hold, dict(block=1)),
    "BlockPool.release": lambda: (_held_pool().release, dict(block=1)),
    "BlockPool.record": lambda: (_held_pool().record, dict(block=1, key=(1, 2, 3, 4))),
    "BlockPool.lookup": lambda: (BlockPool(8).lookup, dict(key=(1, 2))),
    "Scheduler": lambda: (Scheduler, dict(config=_config(), num_blocks=16, max_num_seqs=2,
                                          max_num_tokens=8, max_model_len=32, drafter=None)),
    "Scheduler.add_request": lambda: (_scheduler().add_request, dict(req_id=1, prompt=[1, 2],
                                                                     output=[3])),
    "Scheduler.update": _update,
    "pad_batch": lambda: (pad_batch, dict(batch=_scheduled()[1], positions=[0])),
    "SymbolicRunner": lambda: (SymbolicRunner, dict(scheduler=_scheduler(), mode="copy-free",
                                                    pad=None)),
}

T, V = TypeError, ValueError
# (entry point, argument, bad value, exception, message regex; None = the argument name)
CASES = [
    # --- configuration ---------------------------------------------------------------
    ("CacheConfig", "block_size", 0, V, None),
    ("CacheConfig", "block_size", 4.0, T, None),
    ("CacheConfig", "num_spec", B, V, None),  # S >= B: one step could jump two columns
    ("CacheConfig", "num_spec", -1, V, None),
    ("CacheConfig", "num_layers", True, T, None),
    ("CacheConfig", "states", {"ssm": (2,)}, T, None),
    ("CacheConfig.pool_shape", "num_blocks", 0, V, None),
    ("CacheConfig.columns_needed", "num_tokens", -1, V, None),
    ("ConvSpec", "kernel_size", 1, V, None),
    ("ConvSpec", "dim", 0, V, None),
    ("ConvSpec", "layout", "WD", V, None),
    ("ConvSpec", "dtype", "int8", V, None),
    ("TemporalSpec", "shape", [2, 3], T, None),
    ("TemporalSpec", "shape", (2, 0), V, None),
    ("TemporalSpec", "dtype", "float64", V, None),
    # --- bookkeeping -----------------------------------------------------------------
    ("init_slots", "num_slots", 0, V, None),
    ("init_slots", "num_slots", 3.0, T, None),
    ("add_requests", "slots", np.array([3]), V, None),  # >= num_slots
    ("add_requests", "slots", np.array([1, 1]), V, None),  # duplicated
    ("add_requests", "num_computed", np.array([-1]), V, None),
    ("add_requests", "num_computed", np.array([5, 6]), V, None),  # length != slots
    ("add_requests", "state", (np.zeros(3),) * 3, T, None),
    ("preprocess", "idx_mapping", np.array([0.0, -1.0, 1.0]), T, None),
    ("preprocess", "idx_mapping", [0.0, -1.0, 1.0], T, None),  # a float list is not truncated
    ("preprocess", "idx_mapping", np.array([True, False, True]), T, None),
    ("preprocess", "idx_mapping", np.array([[0, -1, 1]]), V, None),  # 2-D
    ("preprocess", "idx_mapping", np.array([0, -1, 3]), V, None),  # >= num_slots
    ("preprocess", "idx_mapping", np.array([0, -2, 1]), V, None),  # < -1
    ("preprocess", "idx_mapping", np.array([0, 1, 0]), V, None),  # duplicated slot
    ("preprocess", "query_len", np.array([2, 0, -1]), V, None),
    ("preprocess", "query_len", np.array([0, 0, 4]), V, None),  # 0 on a mapped row
    ("preprocess", "query_len", np.array([2, 4]), V, None),  # wrong length
    ("preprocess", "block_size", 0, V, None),
    ("preprocess", "state",
     SlotState(np.array([1, -1, 0]), np.array([1, 0, 1]), np.array([7, 0, 3])), V, "state.acc"),
    ("preprocess", "state",
     SlotState(np.array([1.0, -1, 0]), np.ones(3, int), np.zeros(3, int)), T, "state.state_idx"),
    ("preprocess", "state",
     SlotState(np.array([1, -1, 0]), np.ones(3, int), np.zeros(2, int)), V, "state.num_computed"),
    ("accept", "num_sampled", np.array([3, 0, 0]), V, None),  # > query_len on a spec row
    ("accept", "num_sampled", np.array([2.0, 0, 0]), T, None),
    ("accept", "is_spec", np.array([1, 0, 0]), T, None),  # int, not bool
    ("accept", "is_spec", np.array([True, False]), V, None),
    ("accept", "idx_mapping", np.array([2, -1, 2]), V, None),  # duplicated slot
    ("postprocess", "idx_mapping", np.array([0, 0]), V, None),
    ("postprocess", "state",  # 8 computed but running column 0: boundary column 1 is ahead
     SlotState(np.array([0, -1, -1]), np.ones(3, int), np.array([8, 0, 0])), V, "state_idx"),
    ("running_column", "num_tokens", np.array([5, 0]), V, None),
    ("running_column", "num_tokens", np.array([5]), V, None),
    ("running_column", "state_idx", np.array([0, -2]), V, None),
    # --- block resolution --------------------------------------------------------------
    ("window_blocks", "run_col", np.array([2, -1]), V, None),  # length != idx_mapping
    ("window_blocks", "run_col", np.array([4, -1, 0]), V, "block table"),  # 4 + S > 4
    ("window_blocks", "num_spec", -1, V, None),
    ("window_blocks", "block_table", BT.reshape(-1), V, None),  # 1-D
    ("gather_columns", "cols", np.array([[0, 5], [0, 0], [3, 4]]), V, "block table"),
    ("gather_columns", "cols", np.zeros((3, 1, 1), np.int64), V, None),  # 3-D
    ("gather_columns", "block_table", BT.astype(np.float32), T, None),
    ("gather_columns", "block_table", -BT, V, None),
    ("gather_columns", "idx_mapping", np.array([0, -1, 3]), V, None),  # >= table rows
    ("resolve_blocks", "mode", "copyfree", V, None),
    ("resolve_blocks", "plan", (IDX, IDX, IDX, SPEC), T, None),
    ("resolve_blocks", "plan",
     PreprocessPlan(np.array([1, -1, -1]), np.zeros(3, int), np.array([1, -1, 0]),
                    np.zeros(3, bool)), V, "plan.run_col"),
    ("resolve_blocks", "query_len", np.array([3, 0, 4]), V, None),  # spec row > 1 + S
    ("resolve_blocks", "idx_mapping", np.array([0, 0, 1]), V, None),  # duplicated slot
    ("resolve_blocks", "is_spec", 1, T, None),
    ("resolve_blocks", "num_spec", 5, V, "block table"),  # window beyond the block table
    # --- copy reference ----------------------------------------------------------------
    ("copy_plan", "dst_col", np.array([-1, 0]), V, None),  # negative on a copying row
    ("copy_plan", "dst_col", np.array([5, 0]), V, "block table"),
    ("copy_plan", "bias", np.array([-1, 0]), V, None),
    ("copy_plan", "src_col", np.array([1]), V, None),
    ("precopy_plan", "plan", postprocess(_state(), IDX, B)[1], T, None),
    ("precopy_plan", "plan",
     PreprocessPlan(np.array([1, -1, -1]), np.zeros(3, int), np.array([2, 0, -1]),
                    np.array([1.0, 0, 0])), T, "plan.crossing"),
    ("postprocess_copy_plan", "plan", preprocess(_state(), IDX, QLEN, B)[1], T, None),
    ("postprocess_copy_plan", "plan",
     PostprocessPlan(np.zeros(2, bool), *(np.zeros(2, int),) * 4), V, "plan.copy"),
    ("apply_temporal_copy", "pool", np.zeros((1, 3, 2)), V, "pool"),  # block 3 >= 3 blocks
    ("apply_temporal_copy", "pool", np.zeros(16), V, None),
    ("apply_temporal_copy", "pool", [[0.0] * 2] * 16, T, None),
    ("apply_temporal_copy", "plan", {"dst": [1]}, T, None),
    ("apply_conv_copy", "layout", "WD", V, None),
    ("apply_conv_copy", "pool", np.zeros((1, 16, 6)), V, None),  # 3-D
    ("apply_conv_copy", "pool", np.zeros((1, 16, 1, 2)), V, "bias"),  # W = 1 <= bias
    ("apply_copy", "config", {"ssm": TemporalSpec((2,))}, T, None),
    ("apply_copy", "pools", [np.zeros((1, 16, 2))], T, None),
    ("apply_copy", "pools",
     {"conv": np.zeros((1, 16, 2, 3)), "ssm": np.zeros((1, 16, 2))}, V, re.escape("pools['conv']")),
    ("apply_copy", "plan", None, T, None),
    # --- block pool --------------------------------------------------------------------
    ("BlockPool", "num_blocks", 1, V, None),
    ("BlockPool", "num_blocks", 8.0, T, None),
    ("BlockPool.hold", "block", 0, V, "block"),  # the null block
    ("BlockPool.hold", "block", 8, V, "block"),  # >= pool size
    ("BlockPool.hold", "block", True, T, "block"),
    ("BlockPool.release", "block", 2, V, "block"),  # free, not held
    ("BlockPool.release", "block", 1.0, T, "block"),
    ("BlockPool.record", "block", 9, V, "block"),
    ("BlockPool.record", "key", [1, 2, 3, 4], T, None),  # unhashable
    ("BlockPool.lookup", "key", {1: 2}, T, None),
    # --- scheduler and simulation -------------------------------------------------------
    ("Scheduler", "config", {"block_size": 4}, T, None),
    ("Scheduler", "num_blocks", 4, V, None),  # fewer than one request needs
    ("Scheduler", "max_num_tokens", 3, V, None),  # < block_size
    ("Scheduler", "max_num_seqs", 0, V, None),
    ("Scheduler", "drafter", 5, T, None),
    ("Scheduler.add_request", "req_id", 0, V, None),  # already used
    ("Scheduler.add_request", "req_id", True, T, None),
    ("Scheduler.add_request", "prompt", [1.5, 2], T, None),
    ("Scheduler.add_request", "prompt", [], V, None),
    ("Scheduler.add_request", "prompt", [1, -2], V, None),
    ("Scheduler.add_request", "output", 3, T, None),
    ("Scheduler.add_request", "output", list(range(1, 32)), V, "max_model_len"),
    ("Scheduler.update", "num_sampled", np.array([1, 0]), V, None),  # wrong length
    ("Scheduler.update", "num_sampled", np.array([1.0]), T, None),
    ("Scheduler.update", "num_sampled", np.array([0]), V, None),  # disagrees with the sampler
    ("Scheduler.update", "batch", "batch", T, None),
    ("pad_batch", "positions", [0, 0], V, None),
    ("pad_batch", "positions", [2], V, None),  # outside the padded batch
    ("pad_batch", "positions", [0.0], T, None),
    ("pad_batch", "positions", 0, T, None),
    ("pad_batch", "batch", None, T, None),
    ("SymbolicRunner", "mode", "precopy", V, None),
    ("SymbolicRunner", "scheduler", _config(), T, None),
    ("SymbolicRunner", "pad", 5, T, None),
]


def _case_id(case):
    fn, arg, bad, _, match = case
    if isinstance(bad, np.ndarray):
        text = f"{bad.dtype}{list(bad.shape)}:{bad.reshape(-1)[:4].tolist()}"
    elif isinstance(bad, (int, float, str, list, type(None))):
        text = repr(bad)
    elif isinstance(bad, SlotState):
        text = f"SlotState({match})"
    else:
        text = type(bad).__name__
    return f"{fn}-{arg}={text[:40]}"


@pytest.mark.parametrize("fn,arg,bad,exc,match", CASES, ids=[_case_id(c) for c in CASES])
def test_bad_argument_is_named(fn, arg, bad, exc, match):
    func, kwargs = GOOD[fn]()
    func(**kwargs)  # the good call works: only the replaced argument can cause the error
    func, kwargs = GOOD[fn]()
    assert arg in kwargs
    kwargs[arg] = bad
    with pytest.raises(exc, match=re.escape(arg) if match is None else match):
        func(**kwargs)


def test_every_public_callable_is_covered():
    import mamba_align.core as core

    covered = {c[0].split(".")[0] for c in CASES}
    entry_points = {
        "CacheConfig", "ConvSpec", "TemporalSpec", "init_slots", "add_requests", "preprocess",
        "accept", "postprocess", "running_column", "window_blocks", "gather_columns",
        "resolve_blocks", "copy_plan", "precopy_plan", "postprocess_copy_plan",
        "apply_temporal_copy", "apply_conv_copy", "apply_copy", "BlockPool", "Scheduler",
        "pad_batch", "SymbolicRunner",
    }
    assert entry_points <= set(core.__all__)
    assert entry_points <= covered


# --- purity: the bookkeeping functions return new arrays and never mutate inputs ----------

def _snapshot(value):
    if isinstance(value, SlotState):
        return tuple(a.copy() for a in (value.state_idx, value.acc, value.num_computed))
    return value.copy() if isinstance(value, np.ndarray) else value


def _same(a, b):
    if isinstance(a, tuple):
        return all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


@pytest.mark.parametrize("fn", ["add_requests", "preprocess", "accept", "postprocess"])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_pure_functions_do_not_mutate(fn, dtype):
    func, kwargs = GOOD[fn]()
    if fn == "postprocess":  # a row that reaches a boundary, so postprocess changes acc
        kwargs["state"] = SlotState(np.array([1, -1, 0]), np.array([2, 1, 1]),
                                    np.array([8, 0, 3]))
    st = kwargs["state"]
    kwargs["state"] = SlotState(*(a.astype(dtype) for a in
                                  (st.state_idx, st.acc, st.num_computed)))
    for k, v in kwargs.items():
        if isinstance(v, np.ndarray) and v.dtype != bool:
            kwargs[k] = v.astype(dtype)
    before = {k: _snapshot(v) for k, v in kwargs.items()}

    result = func(**kwargs)
    new = result[0] if isinstance(result, tuple) else result

    for k, v in kwargs.items():
        assert _same(_snapshot(v), before[k]), f"{fn} mutated its argument {k}"
    assert isinstance(new, SlotState)
    old = kwargs["state"]
    for field in ("state_idx", "acc", "num_computed"):
        out, inp = getattr(new, field), getattr(old, field)
        assert out.dtype == np.int64
        assert not np.shares_memory(out, inp), f"{fn} returned state.{field} aliasing the input"
        for a in kwargs.values():
            if isinstance(a, np.ndarray):
                assert not np.shares_memory(out, a)
    # the call did real work, so an in-place implementation would have been caught above
    changed = [not np.array_equal(getattr(new, f), getattr(old, f))
               for f in ("state_idx", "acc", "num_computed")]
    assert any(changed), f"{fn}: test input does not exercise an update"

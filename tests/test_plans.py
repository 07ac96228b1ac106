"""The operations' declarations (``mamba_align.kernels.OPS``) agree with the plans their
builders return, and plans are safe to cache: every backend's launcher trusts both."""

import dataclasses

import numpy as np
import pytest

from mamba_align import kernels as K
from mamba_align.kernels.jit import scalar_params

IDS = K.ArraySpec.row_major((3,), "int64")
SAMPLE_ARRAYS = {  # a valid call of every op, by parameter name
    "state_idx": K.ArraySpec.row_major((4,), "int32"),
    "acc": K.ArraySpec.row_major((4,), "int32"),
    "num_computed": K.ArraySpec.row_major((4,), "int32"),
    "errors": K.ArraySpec.row_major((2,), "int32"),
    "slots": IDS, "num_computed_new": IDS, "idx_mapping": IDS, "query_len": IDS,
    "is_spec": K.ArraySpec.row_major((3,), "bool"), "num_sampled": IDS,
    "block_table": K.ArraySpec.row_major((4, 6), "int32"),
    "pool": K.ArraySpec.row_major((2, 5, 3, 8), "bfloat16"),
    "src": IDS, "dst": IDS, "bias": IDS,
}
SAMPLE_STATICS = {"block_size": 4, "num_spec": 2, "num_blocks": 5, "mode": "copy-free",
                  "layout": "SD", "layer": 1}
F32 = lambda *shape: K.ArraySpec.row_major(shape, "float32")  # noqa: E731
RECURRENT = {  # T = 6 tokens over 2 rows
    "cu_seqlens": K.ArraySpec.row_major((3,), "int64"),
    "read_block": K.ArraySpec.row_major((2,), "int64"),
    "read_offset": K.ArraySpec.row_major((2,), "int64"),
    "write_block": K.ArraySpec.row_major((2,), "int64"),
    "write_blocks": K.ArraySpec.row_major((2, 3), "int64"),
    "is_spec": K.ArraySpec.row_major((2,), "bool"),
    "x": F32(6, 8), "weight": F32(8, 3), "bias": F32(8),
    "q": F32(6, 1, 4), "k": F32(6, 1, 4), "v": F32(6, 2, 4), "g": F32(6, 2), "beta": F32(6, 2),
    "a": F32(6, 2), "b": F32(6, 2), "A_log": F32(2), "dt_bias": F32(2),
}
BY_OP = {"gated_delta_rule": {"pool": F32(2, 5, 2, 4, 4), "layout": "VK"},
         "gated_delta_rule_fused_gates": {"pool": F32(2, 5, 2, 4, 4), "layout": "VK"},
         "selective_state_update": {"pool": F32(2, 5, 2, 4, 4), "x": F32(6, 2, 4),
                                    "dt": F32(6, 2), "A": F32(2), "B": F32(6, 1, 4),
                                    "C": F32(6, 1, 4), "D": F32(2)},
         "linear": {"x": F32(6, 8), "weight": F32(8, 5)},
         "rms_norm": {"x": F32(6, 8), "weight": F32(8)},
         "rms_norm_gated": {"x": F32(6, 8), "z": F32(6, 8), "weight": F32(8)},
         "silu_mul": {"gate": F32(6, 8), "up": F32(6, 8)}}


def sample_plan(op, **change):
    given = {**SAMPLE_ARRAYS, **(RECURRENT if "cu_seqlens" in op.arrays else {}),
             **BY_OP.get(op.name, {})}
    arrays = {n: change.get(n, given[n]) for n in op.arrays}
    statics = {s.name: change.get(s.name, given.get(s.name, SAMPLE_STATICS.get(s.name, s.default)))
               for s in op.statics}
    return op.plan(**arrays, **statics)


# every op with an algorithm option, with each of its algorithms
SAMPLES = [(op, {}) for op in K.OPS] + [
    (op, {"algorithm": a}) for op in K.OPS if "algorithm" in op.static_names
    for a in ("chunked",)]


@pytest.mark.parametrize("op,change", SAMPLES,
                         ids=[op.name + "".join(f"-{v}" for v in c.values()) for op, c in SAMPLES])
def test_declarations_agree_with_the_plans(op, change):
    plan = sample_plan(op, **change)
    assert plan.returned == op.returns  # the torch custom op's outputs, in order
    if "errors" in op.arrays or "state_idx" in op.arrays:  # ops with rows that can fault
        assert set(op.skipped) == set(op.returns)  # what a skipped row gets in each of them
    else:
        assert not op.skipped
    assert set(plan.aliases) == set(op.mutates) and set(plan.aliases.values()) <= set(op.arrays)
    # the op's arrays and the before stages' scratch (their outputs, read by later launches)
    # are exactly what the launches read
    scratch = [n for stage in plan.before for n in stage.outputs]
    assert len(set(scratch)) == len(scratch) and not set(scratch) & set(op.arrays)
    assert set(plan.inputs).union(*(s.inputs for s in plan.before)) == set(op.arrays) | set(scratch)
    assert set(scratch) <= set(plan.inputs)
    for i, stage in enumerate(plan.before):  # a stage reads what exists before it
        assert set(stage.inputs) <= set(op.arrays).union(*(s.outputs for s in plan.before[:i]))
        assert not stage.aliases and set(stage.outputs) == set(stage.out_specs)
    for p in (plan,) + plan.before:
        assert not p.skip
        _check_abi(p)


def _check_abi(plan):
    # the kernel's parameters: inputs, scalars, outputs, then constexprs, in that order
    names = plan.kernel.arg_names
    k = len(plan.inputs) + len(plan.scalars) + len(plan.outputs)
    assert len(names) == k + len(plan.constexprs)
    assert set(names[k:]) == set(plan.constexprs)
    ins = names[:len(plan.inputs)]  # an in-place input is named <name>_in_ptr
    assert [i.removesuffix("_ptr").removesuffix("_in") for i in ins] == list(plan.inputs)
    scalars = names[len(plan.inputs):len(plan.inputs) + len(plan.scalars)]
    assert scalars == [n for n, _ in plan.scalars]
    outs = names[len(plan.inputs) + len(plan.scalars):k]
    assert [o.removesuffix("_ptr") for o in outs] == list(plan.outputs)
    # what same_binary_jit leaves unspecialized is exactly the runtime scalars
    assert scalar_params(plan.kernel.fn) == [n for n, _ in plan.scalars]


@pytest.mark.parametrize("op", K.OPS, ids=lambda op: op.name)
def test_an_empty_batch_launches_nothing(op):
    empty = K.ArraySpec.row_major((0,), "int64")
    rows = {"slots", "num_computed_new", "idx_mapping", "query_len", "num_sampled", "src",
            "dst", "bias"} & set(op.arrays)
    if "cu_seqlens" in op.arrays:
        rows -= {"bias"}  # the conv's per-channel bias, not a per-row id
    change = {n: empty for n in rows}
    if "cu_seqlens" not in op.arrays:  # a dense op: no rows
        change.update({n: F32(0, 8) for n in {"x", "z", "gate", "up"} & set(op.arrays)})
    if "is_spec" in op.arrays:
        change["is_spec"] = K.ArraySpec.row_major((0,), "bool")
    if "cu_seqlens" in op.arrays:  # no rows, no tokens
        change.update({n: empty for n in ("read_block", "read_offset", "write_block")},
                      cu_seqlens=K.ArraySpec.row_major((1,), "int64"),
                      write_blocks=K.ArraySpec.row_major((0, 3), "int64"), x=F32(0, 8),
                      q=F32(0, 1, 4), k=F32(0, 1, 4), v=F32(0, 2, 4), g=F32(0, 2),
                      beta=F32(0, 2), a=F32(0, 2), b=F32(0, 2))
        if op.name == "selective_state_update":
            change.update(x=F32(0, 2, 4), dt=F32(0, 2), B=F32(0, 1, 4), C=F32(0, 1, 4))
    plan = sample_plan(op, **change)
    assert plan.skip
    assert all(o.shape[0] == 0 for o in plan.out_specs.values())


def test_plans_are_read_only_and_options_are_typed():
    plan = sample_plan(K.POSTPROCESS)
    with pytest.raises(TypeError):
        plan.constexprs["BLOCK"] = 1  # cached and shared: not writable
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.grid = (1,)
    assert dict(sample_plan(K.POSTPROCESS, block_size=1, num_spec=0).scalars)["block_size"] == 1
    for bad in (True, 1.0, "1"):  # the cache must not answer for a value that would fail
        with pytest.raises(TypeError, match="block_size must be int"):
            K.POSTPROCESS.static_values({"block_size": bad})
    with pytest.raises(ValueError, match="block_size"):
        sample_plan(K.POSTPROCESS, block_size=True)  # straight to the builder: still refused
    # NumPy numbers (a loop over np.arange) become the Python numbers of the same value
    got = K.POSTPROCESS.static_values({"block_size": np.int64(4), "num_spec": np.int32(2),
                                       "num_blocks": np.uint8(9)})
    assert got == {"block_size": 4, "num_spec": 2, "num_blocks": 9}
    assert all(type(v) is int for v in got.values())
    eps = K.RMS_NORM.static_values({"eps": np.float32(1e-6)})["eps"]
    assert type(eps) is float and eps == float(np.float32(1e-6))
    assert type(K.RMS_NORM.static_values({"eps": np.float64(1e-6)})["eps"]) is float
    for bad in (np.bool_(True), np.float64(4.0)):
        with pytest.raises(TypeError, match="block_size must be int"):
            K.POSTPROCESS.static_values({"block_size": bad})
    spec = K.ArraySpec([3], "int64", [1])  # lists become tuples: hashable
    assert spec == IDS and hash(spec) == hash(IDS)


@pytest.mark.parametrize("op", [K.POSTPROCESS, K.PREPROCESS_RESOLVE])
def test_more_drafts_than_a_block_less_one_are_refused(op):
    # S <= B - 1 (docs/semantics.md §1): with S = B a step could advance a row two columns,
    # and the raw ops had flagged a valid step as inconsistent instead of refusing S
    assert sample_plan(op, block_size=4, num_spec=3) is not None
    with pytest.raises(ValueError, match=r"num_spec must be <= block_size - 1 = 3, got 4"):
        sample_plan(op, block_size=4, num_spec=4)
    with pytest.raises(ValueError, match=r"num_spec must be <= block_size - 1 = 0, got 1"):
        sample_plan(op, block_size=1, num_spec=1)


def test_a_before_stage_writes_only_its_own_scratch():
    plan = sample_plan(K.GATED_DELTA_RULE, algorithm="chunked")
    stage = plan.before[0]
    assert isinstance(plan.before, tuple)
    in_place = dataclasses.replace(stage, outputs=stage.outputs + ("pool",),
                                   aliases={"pool": "pool"})
    with pytest.raises(ValueError, match="before stage"):
        dataclasses.replace(plan, before=(in_place,))
    with pytest.raises(ValueError, match="before stage"):  # one level only
        dataclasses.replace(plan, before=(dataclasses.replace(stage, before=(stage,)),))
    renamed = dict(stage.out_specs)
    renamed["o"] = renamed.pop("chunk_u")  # scratch named as the plan's own output
    with pytest.raises(ValueError, match="before stage"):
        dataclasses.replace(plan, before=(dataclasses.replace(
            stage, outputs=tuple(renamed), out_specs=renamed),))
    with pytest.raises(ValueError, match="before stage"):  # skipped alone
        dataclasses.replace(plan, before=(dataclasses.replace(stage, skip=True),))
    with pytest.raises(ValueError, match="before stage"):  # two stages, one scratch name
        dataclasses.replace(plan, before=(stage, stage))
    renamed = dict(stage.out_specs)
    renamed["k"] = renamed.pop("chunk_w")  # scratch named as an input a stage reads
    with pytest.raises(ValueError, match="before stage"):
        dataclasses.replace(plan, before=(dataclasses.replace(
            stage, outputs=tuple(renamed), out_specs=renamed),))


@pytest.mark.parametrize("op", [op for op in K.OPS if "state_idx" in op.arrays],
                         ids=lambda op: op.name)
def test_slot_arrays_past_int32_are_refused(op):
    # the duplicate check compares slots in 32 bits: 2**31 slots would wrap
    huge = K.ArraySpec.row_major((2**31,), "int64")
    with pytest.raises(ValueError, match="fewer than 2\\*\\*31 slots"):
        sample_plan(op, state_idx=huge, acc=huge, num_computed=huge)


@pytest.mark.parametrize("op", [K.GATED_DELTA_RULE, K.GATED_DELTA_RULE_FUSED_GATES],
                         ids=lambda op: op.name)
@pytest.mark.parametrize("scale", [-1.0, float("nan"), float("inf"), 1e39, 1e-50, 10**400])
def test_a_negative_or_non_finite_scale_is_refused(op, scale):
    # NaN fails every comparison: "scale < 0" let it through, and "0: K^-1/2" took it;
    # 1e39 is finite in Python but inf in the fp32 the kernel receives, 1e-50 is 0 there
    # (q times 0, not K^-1/2), and 10**400 is no float at all
    with pytest.raises(ValueError, match="scale must be a float >= 0 that fp32 holds"):
        sample_plan(op, scale=scale)

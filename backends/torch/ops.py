"""The torch launcher: every operation of :data:`mamba_align.kernels.OPS` as a function on
tensors and as a ``torch.library`` custom op (``torch.ops.mamba_align.<name>``) with a fake
implementation, so it works eagerly, under CUDA-graph capture and under ``torch.compile``.

Nothing here is specific to an operation: :func:`launch` describes the tensors to the op's
plan builder (which validates dtypes, shapes, strides and layouts, never values: that
would synchronise), allocates the outputs the plan names and launches. Operations that
update arrays in place carry a trailing underscore and mutate them; every function returns
its new outputs by name (``None`` when it has none). Outside ``torch.compile`` the public
functions call :func:`launch` directly: the custom-op dispatcher costs about 25 us of host
time per call (measured on the H200 host), which an eager step need not pay.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, Mapping

import torch
from torch import Tensor
from torch.autograd.graph import increment_version

from ... import kernels as K

_NAMES = {getattr(torch, n): n for n in (
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
    "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2")
    if hasattr(torch, n)}


def dtype_name(d: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the spelling plans and configs use)."""
    return _NAMES.get(d) or str(d).replace("torch.", "")


def spec(name: str, t: Any) -> K.ArraySpec:
    """What a plan needs to know of tensor ``t`` (argument ``name``)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    shape, strides = tuple(t.shape), tuple(t.stride())
    try:  # one spec per layout: an eager step describes some 35 tensors
        return _spec(shape, dtype_name(t.dtype), strides)
    except TypeError:  # symbolic sizes (torch.compile's fake tensors) do not hash
        return K.ArraySpec(shape, dtype_name(t.dtype), strides)


@functools.lru_cache(maxsize=4096)
def _spec(shape: tuple, dtype: str, strides: tuple) -> K.ArraySpec:
    return K.ArraySpec(shape, dtype, strides)


def dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _device(arrays: Mapping[str, Tensor]) -> torch.device:
    it = iter(arrays.items())
    first, t = next(it)
    dev = t.device
    for name, t in it:
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device}, expected {dev} (as {first})")
    return dev


def _plan(op: K.Op, arrays: Mapping[str, Tensor], statics: Mapping[str, Any],
          cached: bool = True) -> K.LaunchPlan:
    # fake tensors under torch.compile may have symbolic sizes, which the cache cannot hash
    build = op.plan if cached else getattr(op.plan, "__wrapped__", op.plan)
    return build(**{n: spec(n, a) for n, a in arrays.items()}, **statics)


def _checked(op: K.Op, arrays: Mapping[str, Tensor], statics: Mapping[str, Any]) -> tuple:
    """``op``'s plan for ``arrays`` and their device, once both are known good."""
    plan = _plan(op, arrays, statics)
    dev = _device(arrays)
    if dev.type == "meta":
        raise ValueError("the tensors are on meta: they hold no data for the kernels")
    if dev.type != "cuda" and not K.interpreted(plan.kernel):
        raise ValueError(f"the tensors are on {dev}: the kernels run compiled on CUDA devices "
                         "(Triton's CPU interpreter is used only when no GPU is present, or "
                         "with TRITON_INTERPRET=1 set before triton is imported)")
    return plan, dev


def launch(op: K.Op, arrays: Mapping[str, Tensor], statics: Mapping[str, Any]) -> Dict[str, Tensor]:
    """Run ``op`` on ``arrays`` (its array parameters by name) with its static options;
    in-place arrays are updated, new outputs returned by name."""
    plan, dev = _checked(op, arrays, statics)
    # a launch that computes nothing returns zeros, as the JAX launcher does
    alloc = torch.zeros if plan.skip else torch.empty
    outs = {n: alloc(o.shape, dtype=dtype(o.dtype), device=dev)
            for n, o in plan.out_specs.items()}
    if not plan.skip:
        args = dict(arrays, **outs)
        for stage in plan.before:  # its scratch outputs are the later launches' inputs
            scratch = {n: torch.empty(o.shape, dtype=dtype(o.dtype), device=dev)
                       for n, o in stage.out_specs.items()}
            _run(stage, dict(args, **scratch), dev)
            args.update(scratch)
        for n, d in plan.views.items():  # copies see pools as same-width integers
            args[n] = arrays[n].view(dtype(d))
        for out, src in plan.aliases.items():  # in place: the input passed twice
            args[out] = args[src]
        _bump_versions([arrays[n] for n in plan.aliases.values()])  # (checks passed)
        _run(plan, args, dev)
    return outs


def _run(plan: K.LaunchPlan, args: Dict[str, Tensor], dev: torch.device) -> None:
    """Launch ``plan``'s kernel on ``args`` (every input and output by name)."""
    if getattr(plan.kernel, "same_binary", False) and dev.type == "cuda":
        _align_inputs(plan, args)  # (an in-place array is never copied: it must be aligned)
    plan.kernel[plan.grid](*plan.args(args), **plan.constexprs, **plan.launch_options)


def _align_inputs(plan: K.LaunchPlan, args: Dict[str, Tensor]) -> None:
    """jax-triton calls every array 16-byte aligned; torch's launcher specializes on the
    real address. For a kernel compiled alike from both (kernels/jit.py), an input that
    starts off a 16-byte boundary is copied to fresh storage with the same strides (what
    the plan was built for); an in-place array must be aligned."""
    for n in plan.inputs:
        t = args[n]
        if t.numel() and t.data_ptr() % 16:
            if n in plan.aliases.values():
                raise ValueError(f"{n} starts {t.data_ptr() % 16} bytes past a 16-byte "
                                 "boundary: an array updated in place must be aligned")
            if _overlapping(t.shape, t.stride()):  # (a broadcast view): its whole span
                extent = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
                span = torch.empty(extent, dtype=t.dtype, device=t.device)
                span.copy_(t.as_strided((extent,), (1,)))
                args[n] = span.as_strided(t.shape, t.stride())
            else:
                args[n] = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                              device=t.device).copy_(t)


def _overlapping(shape, strides) -> bool:
    """Whether two elements of an array of ``shape`` and ``strides`` (non-negative) may
    share an address: torch cannot copy into such a layout element by element."""
    need = 1
    for st, s in sorted((st, s) for s, st in zip(shape, strides) if s > 1):
        if st < need:
            return True
        need = st * s
    return False


_SCHEMA_TYPES = {int: "int", bool: "bool", float: "float", str: "str"}


def _schema(op: K.Op) -> str:
    arrays = []
    for n in op.arrays:
        alias = f"({chr(ord('a') + op.mutates.index(n))}!)" if n in op.mutates else ""
        arrays.append(f"Tensor{alias} {n}")
    # torch's functionalization passes arguments by schema name to helpers that take a
    # `mode` of their own: the schema spells ours `step_mode` (the Python API says `mode`)
    statics = [f"{_SCHEMA_TYPES[s.type]} {'step_mode' if s.name == 'mode' else s.name}"
               for s in op.statics]
    params = ", ".join(arrays + statics)
    # a fixed tuple, not Tensor[]: inductor refuses list outputs of mutating custom ops
    return f"({params}) -> ({', '.join(['Tensor'] * len(op.returns))})"


def _returned(outs: tuple):
    # torch reads a schema's "-> (Tensor)" as "-> Tensor": one output is returned bare
    return outs[0] if len(outs) == 1 else outs


def _register(op: K.Op, name: str):
    """``torch.ops.mamba_align.<name>``: the launcher, and a fake that allocates only."""
    k = len(op.arrays)  # then the statics, positional

    def impl(*args):
        outs = launch(op, dict(zip(op.arrays, args)), dict(zip(op.static_names, args[k:])))
        return _returned(tuple(outs[n] for n in op.returns)) if op.returns else None

    def fake(*args):
        if not op.returns:
            # an op that only updates in place (the copies) is planned at trace time too, so
            # that a compiled step refuses a pool before any of its kernels runs; the row
            # arrays it reads as one row, so that no batch size is guarded
            arrays = {n: a if a.dim() != 1 or n in op.mutates else a.new_empty((1,))
                      for n, a in zip(op.arrays, args[:k])}
            _plan(op, arrays, dict(zip(op.static_names, args[k:])), cached=False)
            return None
        arrays = dict(zip(op.arrays, args[:k]))
        plan = _plan(op, arrays, dict(zip(op.static_names, args[k:])), cached=False)
        return _returned(tuple(torch.empty(plan.out_specs[n].shape,
                                           dtype=dtype(plan.out_specs[n].dtype),
                                           device=_device(arrays)) for n in op.returns))

    custom = torch.library.custom_op(f"mamba_align::{name}", impl, mutates_args=op.mutates,
                                     schema=_schema(op))
    custom.register_fake(fake)
    if not op.mutates:  # torch takes no autograd formula for an op that updates in place

        def backward(ctx, *grads):
            raise RuntimeError(f"{op.name} is not differentiable: no gradient flows through "
                               "the kernels' outputs; detach its inputs, or call it under "
                               "torch.no_grad()")

        custom.register_autograd(backward)
    return custom


def public(op: K.Op):
    """The user-facing torch function of ``op``: array parameters positional (or by
    keyword), static options keyword-only; returns the new outputs by name, ``None`` if
    there are none."""
    name = op.name + ("_" if op.mutates else "")
    custom = _register(op, name)
    _CUSTOM[op.name] = custom
    updated = f"``{'``, ``'.join(op.mutates)}`` updated in place" if op.mutates else ""
    if op.returns:
        doc = (f"Returns a dict of the new outputs: ``{'``, ``'.join(op.returns)}``"
               + (f"; {updated}." if updated else "."))
    else:
        doc = f"Returns ``None``; {updated}."
    return op.function(lambda arrays, statics: call(op, arrays, statics), name, Tensor,
                       Dict[str, Tensor] if op.returns else None, "\n\n    " + doc)


_CUSTOM: Dict[str, Any] = {}  # op name -> its custom op (dynamo cannot hash an Op key)


def refuse_grad(t: Any, name: str, updater: str) -> None:
    """Raise where ``t`` (updated in place by ``updater``) requires grad in grad mode: no
    backward could see the update."""
    if torch.is_grad_enabled() and getattr(t, "requires_grad", False):
        raise RuntimeError(
            f"{updater} updates {name} in place and {name} requires grad: that is not "
            f"differentiable; pass a {name} that does not require grad, or call it under "
            "torch.no_grad()")


def call(op: K.Op, arrays: Mapping[str, Tensor], statics: Mapping[str, Any]):
    """Run ``op``: through its custom op under ``torch.compile``, :func:`launch` otherwise."""
    # A launch's outputs carry no autograd history: where an input wants a gradient, the
    # custom op runs it instead, so that a backward through it raises rather than leaving
    # the input without its share of the gradient, as JAX raises
    grad = torch.is_grad_enabled()
    for n in op.mutates if grad else ():
        refuse_grad(arrays.get(n), n, f"{op.name}_")
    compiling = torch.compiler.is_compiling()
    if compiling or (grad and any(getattr(a, "requires_grad", False) for a in arrays.values())):
        if not compiling and op.mutates:  # torch bumps what it updates before the launch's
            _checked(op, arrays, statics)  # checks: a refused call must change nothing
        res = _CUSTOM[op.name](*(arrays[n] for n in op.arrays),
                               *(statics[n] for n in op.static_names))
        if len(op.returns) == 1:
            res = (res,)
        return dict(zip(op.returns, res)) if op.returns else None
    outs = launch(op, arrays, statics)
    return outs if op.returns else None


def _takes_a_list() -> bool:
    try:  # torch 2.4 takes one tensor at a time
        increment_version([])
        return True
    except (RuntimeError, TypeError):
        return False


_BUMP_LIST = _takes_a_list()


def _bump_versions(updated) -> None:
    """As torch's own in-place ops do: a tensor autograd saved before the update then makes
    backward raise, where it would use the new values. Inference tensors have no counter
    (torch 2.4 raises on them outside inference mode)."""
    updated = [t for t in updated if isinstance(t, Tensor) and not t.is_inference()]
    if _BUMP_LIST:
        increment_version(updated)
    else:
        for t in updated:
            increment_version(t)


add_requests_ = public(K.ADD_REQUESTS)
preprocess_resolve_ = public(K.PREPROCESS_RESOLVE)
postprocess_ = public(K.POSTPROCESS)
copy_temporal_ = public(K.COPY_TEMPORAL)
copy_conv_ = public(K.COPY_CONV)
conv1d_update_ = public(K.CONV1D_UPDATE)
gated_delta_rule_ = public(K.GATED_DELTA_RULE)
gated_delta_rule_fused_gates_ = public(K.GATED_DELTA_RULE_FUSED_GATES)
selective_state_update_ = public(K.SELECTIVE_STATE_UPDATE)
linear = public(K.LINEAR)
rms_norm = public(K.RMS_NORM)
rms_norm_gated = public(K.RMS_NORM_GATED)
silu_mul = public(K.SILU_MUL)


def copy_pools_(pools: Mapping[str, Tensor], kinds: Mapping[str, str],
                copy_plan: Mapping[str, Tensor], errors: Tensor) -> None:
    """Apply a step's physical copy plan (``copy_tsrc`` / ``copy_csrc`` / ``copy_dst`` /
    ``copy_bias``, int ``[rows]``) to every pool named in ``kinds``
    (``CacheConfig.copy_kinds()``), in place; rows with ids it cannot trust copy nothing
    and flag ``BAD_COPY`` in ``errors`` (int32 ``[2]``, in place)."""
    for _, op, arrays, statics in K.pool_copies(kinds, pools, copy_plan):
        call(op, dict(arrays, errors=errors), statics)

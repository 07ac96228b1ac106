"""The three backends behind one NumPy-in / NumPy-out interface, so that each operation has
one test file that checks all three, and the per-slot state helpers the tests share (the
copy oracles: copy_oracles.py; whole torch steps: torch_steps.py).

* ``reference``: the core (NumPy), which raises on bad input;
* ``torch``: the torch launcher (interpreter on CPU, compiled Triton on the GPU);
* ``jax``: the JAX launcher (interpreter through ``pure_callback`` on CPU, jax-triton on
  the GPU).
"""

from __future__ import annotations

from typing import Dict, Tuple

import ml_dtypes
import numpy as np

from mamba_align.core import (
    flag_of,
    new_errors,
    SlotState,
    accept,
    add_requests,
    apply_conv_copy,
    apply_temporal_copy,
    copy_faults,
    postprocess,
    postprocess_copy_plan,
    precopy_plan,
    preprocess,
    resolve_blocks,
)
from mamba_align.core.conv1d_ref import causal_conv1d_update_ref
from mamba_align.core import dense_ref
from mamba_align.core.gdn_ref import gated_delta_rule_ref
from mamba_align.core.selective_state_ref import selective_state_update_ref
from copy_oracles import copy_plan  # noqa: E402  (tests/ is on sys.path)

BACKENDS = ("reference", "torch", "jax")
DEVICE_BACKENDS = ("torch", "jax")  # the kernels: they skip what the core rejects
COPY_PLAN = ("copy_tsrc", "copy_csrc", "copy_dst", "copy_bias")
BLOCKS = ("temporal_read", "conv_read", "conv_read_bias", "temporal_write", "conv_write")
SSU_INPUTS = ("x", "dt", "A", "B", "C", "D", "dt_bias")  # the selective state update's


def slots(state_idx, acc, num_computed) -> SlotState:
    return SlotState(*(np.array(x, dtype=np.int64) for x in (state_idx, acc, num_computed)))


def as_state(state) -> Tuple[list, list, list]:
    return tuple(np.asarray(getattr(state, f)).tolist() for f in ("state_idx", "acc", "num_computed"))


# -- backends -----------------------------------------------------------------------------
class Backend:
    """One operation per method, NumPy in and out (int64 index arrays, pools of any dtype)."""

    name = "?"
    examples_scale = 1.0  # hypothesis examples relative to the core's (interpreter cost)

    def examples(self, n: int) -> int:
        return max(5, int(n * self.examples_scale))

    # ops -> (new state, per-row outputs by name) or a new pool
    # the device backends start each call with a clear error flag and keep what it
    # recorded in ``last_errors`` (int64 ``[2]``); ``num_blocks`` None: past every id of bt.
    # They take and return states as the core sees them: acc >= 1 (0: faulty); the device's
    # mark of a step in flight (acc negated from preprocess to postprocess) is added and
    # removed here (see in_flight)
    last_errors = None

    def add_requests(self, state, slots_, num_computed, block_size) -> SlotState: ...

    def preprocess_resolve(self, state, idx, q, is_spec, bt, block_size, num_spec,
                           mode="pre-copy", num_blocks=None
                           ) -> Tuple[SlotState, Dict[str, np.ndarray]]: ...

    def postprocess(self, state, idx, q, is_spec, num_sampled, bt, block_size,
                    num_spec, num_blocks=None) -> Tuple[SlotState, Dict[str, np.ndarray]]: ...

    # copies -> (new pool, error flag [bits, lowest faulty row])
    def copy_temporal(self, pool, src, dst): ...

    def copy_conv(self, pool, src, dst, bias, layout): ...

    # recurrences -> (outputs, new pool, error flag [bits, lowest faulty row])
    def conv1d_update(self, pool, x, weight, bias, cu, rb, off, wb, spec, *, layer, layout,
                      activation="silu"): ...

    # gates: {"g", "beta"} or {"a", "b", "A_log", "dt_bias"}; opts: scale, use_qk_l2norm, layout
    def gdn(self, pool, q, k, v, gates, cu, rb, wbs, spec, *, layer, **opts): ...

    # ins: the selective state update's SSU_INPUTS by name; opts: dt_softplus
    def ssu(self, pool, ins, cu, rb, wbs, spec, *, layer, **opts): ...

    # a dense op (linear, rms_norm, rms_norm_gated, silu_mul) -> y (float64 in the reference)
    def dense(self, op, *arrays, **statics): ...


class Reference(Backend):
    name = "reference"

    def add_requests(self, state, slots_, num_computed, block_size):
        return add_requests(state, slots_, num_computed, block_size)

    def preprocess_resolve(self, state, idx, q, is_spec, bt, block_size, num_spec,
                           mode="pre-copy", num_blocks=None):
        idx, q = np.asarray(idx), np.asarray(q)
        new, pre = preprocess(state, idx, q, block_size)
        cp = precopy_plan(bt, idx, pre)
        blocks = resolve_blocks(bt, idx, new, pre, q, np.asarray(is_spec) != 0, num_spec, mode)
        out = {"src_col": pre.src_col, "src_bias": pre.src_bias, "run_col": pre.run_col}
        out.update(zip(COPY_PLAN, (cp.tsrc, cp.csrc, cp.dst, cp.bias)))
        out.update({f: getattr(blocks, f) for f in BLOCKS})
        return new, out

    def postprocess(self, state, idx, q, is_spec, num_sampled, bt, block_size, num_spec,
                    num_blocks=None):
        spec = np.asarray(is_spec) != 0  # (num_spec: the core checks spec rows at resolve)
        mid = accept(state, idx, q, num_sampled, spec)
        new, post = postprocess(mid, idx, block_size)
        cp = postprocess_copy_plan(bt, idx, post)
        out = {"cache_col": post.cache_col}
        out.update(zip(COPY_PLAN, (cp.tsrc, cp.csrc, cp.dst, cp.bias)))
        return new, out

    @staticmethod
    def _trusted(pool, fault, *ids):
        # the core raises on faulty rows, the kernels skip them (and an empty pool launches
        # nothing, so it flags nothing)
        fault = fault * (pool.size > 0)
        return fault, [np.where(fault == 0, np.asarray(x), -1) for x in ids]

    def copy_temporal(self, pool, src, dst):
        fault, (src, dst) = self._trusted(pool, copy_faults(src, dst, pool.shape[1]), src, dst)
        out = pool.copy()
        apply_temporal_copy(out, copy_plan(src, src, dst, np.zeros(len(src))))
        return out, flag_of(fault).astype(np.int64)

    def copy_conv(self, pool, src, dst, bias, layout):
        width = pool.shape[2 if layout == "SD" else 3]
        fault, (src, dst) = self._trusted(pool, copy_faults(src, dst, pool.shape[1], bias, width),
                                          src, dst)
        out, bias = pool.copy(), np.where(fault == 0, bias, 0)
        apply_conv_copy(out, copy_plan(src, src, dst, bias), layout)
        return out, flag_of(fault).astype(np.int64)

    def conv1d_update(self, pool, x, weight, bias, cu, rb, off, wb, spec, *, layer, layout,
                      activation="silu"):
        out = pool.copy()
        y, out[layer], fault = causal_conv1d_update_ref(x, weight, bias, pool[layer], cu, rb,
                                                        off, wb, spec, activation=activation,
                                                        layout=layout)
        return y, out, flag_of(fault).astype(np.int64)

    def gdn(self, pool, q, k, v, gates, cu, rb, wbs, spec, *, layer, **opts):
        out = pool.copy()
        opts.pop("algorithm", None)  # one reference for both
        if "scale" in opts and not opts["scale"]:
            opts = dict(opts, scale=None)
        o, out[layer], fault = gated_delta_rule_ref(q, k, v, pool[layer], cu, rb, wbs, spec,
                                                    **gates, **opts)
        return o, out, flag_of(fault).astype(np.int64)

    def ssu(self, pool, ins, cu, rb, wbs, spec, *, layer, **opts):
        out = pool.copy()
        opts.pop("algorithm", None)  # one reference for both
        y, out[layer], fault = selective_state_update_ref(*(ins[n] for n in SSU_INPUTS),
                                                          pool[layer], cu, rb, wbs, spec, **opts)
        return y, out, flag_of(fault).astype(np.int64)

    def dense(self, op, *arrays, **statics):
        if op == "rms_norm_gated":
            x, z, w = arrays
            return dense_ref.rms_norm_ref(x, w, z=z, **statics)
        return getattr(dense_ref, f"{op}_ref")(*arrays, **statics)


class Torch(Backend):
    name = "torch"
    examples_scale = 0.2

    def __init__(self, index_dtype: str = "int64"):
        import torch

        from mamba_align.backends.torch import ops

        self.torch, self.ops = torch, ops
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.index_dtype = getattr(torch, index_dtype)

    def ids(self, a):
        return self.torch.as_tensor(np.asarray(a), dtype=self.index_dtype, device=self.device)

    def flags(self, a):
        a = np.asarray(a)
        return self.torch.as_tensor(a, device=self.device) if a.dtype == np.bool_ else self.ids(a)

    def host(self, t):
        t = t.detach().cpu()
        if t.dtype == self.torch.bfloat16:
            return t.view(self.torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()

    def pool(self, a):
        a = np.ascontiguousarray(a)
        if a.dtype == ml_dtypes.bfloat16:
            return self.torch.from_numpy(a.view(np.int16).copy()).view(self.torch.bfloat16).to(
                self.device)
        return self.torch.from_numpy(a.copy()).to(self.device)

    def _state(self, state):
        errors = self.torch.from_numpy(new_errors()).to(self.device)
        return [self.ids(getattr(state, f)).clone()
                for f in ("state_idx", "acc", "num_computed")] + [errors]

    def _back(self, arrays):
        self.last_errors = self.host(arrays[3]).astype(np.int64)
        return settled(SlotState(*(self.host(a).astype(np.int64) for a in arrays[:3])))

    def add_requests(self, state, slots_, num_computed, block_size):
        st = self._state(state)
        self.ops.add_requests_(*st, self.ids(slots_), self.ids(num_computed),
                               block_size=block_size)
        return self._back(st)

    def preprocess_resolve(self, state, idx, q, is_spec, bt, block_size, num_spec,
                           mode="pre-copy", num_blocks=None):
        st = self._state(state)
        out = self.ops.preprocess_resolve_(*st, self.ids(idx), self.ids(q), self.flags(is_spec),
                                           self.ids(bt), block_size=block_size,
                                           num_spec=num_spec, num_blocks=blocks_of(bt, num_blocks),
                                           mode=mode)
        return self._back(st), {n: self.host(v).astype(np.int64) for n, v in out.items()}

    def postprocess(self, state, idx, q, is_spec, num_sampled, bt, block_size, num_spec,
                    num_blocks=None):
        st = self._state(in_flight(state, idx))
        out = self.ops.postprocess_(*st, self.ids(idx), self.ids(q), self.flags(is_spec),
                                    self.ids(num_sampled), self.ids(bt), block_size=block_size,
                                    num_spec=num_spec, num_blocks=blocks_of(bt, num_blocks))
        return self._back(st), {n: self.host(v).astype(np.int64) for n, v in out.items()}

    def copy_temporal(self, pool, src, dst):
        t, errors = self.pool(pool), self.torch.from_numpy(new_errors()).to(self.device)
        self.ops.copy_temporal_(t, errors, self.ids(src), self.ids(dst))
        return self.host(t), self.host(errors).astype(np.int64)

    def copy_conv(self, pool, src, dst, bias, layout):
        t, errors = self.pool(pool), self.torch.from_numpy(new_errors()).to(self.device)
        self.ops.copy_conv_(t, errors, self.ids(src), self.ids(dst), self.ids(bias),
                            layout=layout)
        return self.host(t), self.host(errors).astype(np.int64)

    def conv1d_update(self, pool, x, weight, bias, cu, rb, off, wb, spec, *, layer, layout,
                      activation="silu"):
        t, errors = self.pool(pool), self.torch.from_numpy(new_errors()).to(self.device)
        y = self.ops.conv1d_update_(t, errors, self.pool(x), self.pool(weight), self.pool(bias),
                                    self.ids(cu), self.ids(rb), self.ids(off), self.ids(wb),
                                    self.flags(spec), layer=layer, layout=layout,
                                    activation=activation)["y"]
        return self.host(y), self.host(t), self.host(errors).astype(np.int64)

    def gdn(self, pool, q, k, v, gates, cu, rb, wbs, spec, *, layer, **opts):
        t, errors = self.pool(pool), self.torch.from_numpy(new_errors()).to(self.device)
        fn = self.ops.gated_delta_rule_fused_gates_ if "a" in gates else self.ops.gated_delta_rule_
        g = [self.pool(gates[n]) for n in (("a", "b", "A_log", "dt_bias") if "a" in gates
                                           else ("g", "beta"))]
        o = fn(t, errors, self.pool(q), self.pool(k), self.pool(v), *g, self.ids(cu),
               self.ids(rb), self.ids(wbs), self.flags(spec), layer=layer, **opts)["o"]
        return self.host(o), self.host(t), self.host(errors).astype(np.int64)

    def ssu(self, pool, ins, cu, rb, wbs, spec, *, layer, **opts):
        t, errors = self.pool(pool), self.torch.from_numpy(new_errors()).to(self.device)
        y = self.ops.selective_state_update_(
            t, errors, *(self.pool(ins[n]) for n in SSU_INPUTS), self.ids(cu), self.ids(rb),
            self.ids(wbs), self.flags(spec), layer=layer, **opts)["y"]
        return self.host(y), self.host(t), self.host(errors).astype(np.int64)

    def dense(self, op, *arrays, **statics):
        return self.host(getattr(self.ops, op)(*map(self.pool, arrays), **statics)["y"])

    def copy_pools(self, pools, kinds, plan):
        t = {n: self.pool(p) for n, p in pools.items()}
        errors = self.torch.from_numpy(new_errors()).to(self.device)
        self.ops.copy_pools_(t, kinds, {n: self.ids(v) for n, v in plan.items()}, errors)
        assert int(errors[0]) == 0, "a step's copy plan names only trusted blocks"
        return {n: self.host(p) for n, p in t.items()}


class Jax(Backend):
    name = "jax"
    examples_scale = 0.2

    def __init__(self, index_dtype: str = "int32"):
        import jax.numpy as jnp

        from mamba_align.backends.jax import ops

        self.jnp, self.ops = jnp, ops
        self.index_dtype = getattr(jnp, index_dtype)

    def ids(self, a):
        return self.jnp.asarray(np.asarray(a), self.index_dtype)

    def flags(self, a):
        a = np.asarray(a)
        return self.jnp.asarray(a) if a.dtype == np.bool_ else self.ids(a)

    def _state(self, state):
        return [self.ids(getattr(state, f)) for f in ("state_idx", "acc", "num_computed")] + [
            self.jnp.asarray(new_errors())]

    def _split(self, out):
        self.last_errors = np.asarray(out.pop("errors")).astype(np.int64)
        st = SlotState(*(np.asarray(out.pop(f)).astype(np.int64)
                         for f in ("state_idx", "acc", "num_computed")))
        return settled(st), {n: np.asarray(v).astype(np.int64) for n, v in out.items()}

    def add_requests(self, state, slots_, num_computed, block_size):
        out = self.ops.add_requests(*self._state(state), self.ids(slots_), self.ids(num_computed),
                                    block_size=block_size)
        return self._split(dict(out))[0]

    def preprocess_resolve(self, state, idx, q, is_spec, bt, block_size, num_spec,
                           mode="pre-copy", num_blocks=None):
        st = self._state(state)
        out = dict(self.ops.preprocess_resolve(*st, self.ids(idx), self.ids(q),
                                               self.flags(is_spec), self.ids(bt),
                                               block_size=block_size, num_spec=num_spec,
                                               num_blocks=blocks_of(bt, num_blocks),
                                               mode=mode))
        out["num_computed"] = st[2]
        return self._split(out)

    def postprocess(self, state, idx, q, is_spec, num_sampled, bt, block_size, num_spec,
                    num_blocks=None):
        st = self._state(in_flight(state, idx))
        out = dict(self.ops.postprocess(*st, self.ids(idx), self.ids(q), self.flags(is_spec),
                                        self.ids(num_sampled), self.ids(bt),
                                        block_size=block_size, num_spec=num_spec,
                                        num_blocks=blocks_of(bt, num_blocks)))
        out["state_idx"] = st[0]
        return self._split(out)

    def copy_temporal(self, pool, src, dst):
        out = self.ops.copy_temporal(self.jnp.asarray(pool), self.jnp.asarray(new_errors()),
                                     self.ids(src), self.ids(dst))
        return np.asarray(out["pool"]), np.asarray(out["errors"]).astype(np.int64)

    def copy_conv(self, pool, src, dst, bias, layout):
        out = self.ops.copy_conv(self.jnp.asarray(pool), self.jnp.asarray(new_errors()),
                                 self.ids(src), self.ids(dst), self.ids(bias), layout=layout)
        return np.asarray(out["pool"]), np.asarray(out["errors"]).astype(np.int64)

    def conv1d_update(self, pool, x, weight, bias, cu, rb, off, wb, spec, *, layer, layout,
                      activation="silu"):
        A = self.jnp.asarray  # noqa: N806
        out = self.ops.conv1d_update(A(pool), A(new_errors()), A(x), A(weight), A(bias),
                                     self.ids(cu), self.ids(rb), self.ids(off), self.ids(wb),
                                     self.flags(spec), layer=layer, layout=layout,
                                     activation=activation)
        return (np.asarray(out["y"]), np.asarray(out["pool"]),
                np.asarray(out["errors"]).astype(np.int64))

    def gdn(self, pool, q, k, v, gates, cu, rb, wbs, spec, *, layer, **opts):
        A = self.jnp.asarray  # noqa: N806
        fn = self.ops.gated_delta_rule_fused_gates if "a" in gates else self.ops.gated_delta_rule
        g = [A(gates[n]) for n in (("a", "b", "A_log", "dt_bias") if "a" in gates
                                   else ("g", "beta"))]
        out = fn(A(pool), A(new_errors()), A(q), A(k), A(v), *g, self.ids(cu), self.ids(rb),
                 self.ids(wbs), self.flags(spec), layer=layer, **opts)
        return (np.asarray(out["o"]), np.asarray(out["pool"]),
                np.asarray(out["errors"]).astype(np.int64))

    def ssu(self, pool, ins, cu, rb, wbs, spec, *, layer, **opts):
        A = self.jnp.asarray  # noqa: N806
        out = self.ops.selective_state_update(
            A(pool), A(new_errors()), *(A(ins[n]) for n in SSU_INPUTS), self.ids(cu),
            self.ids(rb), self.ids(wbs), self.flags(spec), layer=layer, **opts)
        return (np.asarray(out["y"]), np.asarray(out["pool"]),
                np.asarray(out["errors"]).astype(np.int64))

    def dense(self, op, *arrays, **statics):
        return np.asarray(getattr(self.ops, op)(*map(self.jnp.asarray, arrays), **statics)["y"])

    def copy_pools(self, pools, kinds, plan):
        out, errors = self.ops.copy_pools({n: self.jnp.asarray(p) for n, p in pools.items()},
                                          kinds, {n: self.ids(v) for n, v in plan.items()},
                                          self.jnp.asarray(new_errors()))
        assert int(errors[0]) == 0, "a step's copy plan names only trusted blocks"
        return {n: np.asarray(p) for n, p in out.items()}


def in_flight(state: SlotState, idx) -> SlotState:
    """``state`` as the device holds it between preprocess and postprocess: ``acc``
    negated on the slots the rows ``idx`` name (0, a faulty slot, stays 0)."""
    idx = np.asarray(idx)
    acc = state.acc.copy()
    rows = np.unique(idx[(idx >= 0) & (idx < len(acc))])
    acc[rows] = -np.abs(acc[rows])
    return SlotState(state.state_idx, acc, state.num_computed)


def settled(state: SlotState) -> SlotState:
    """The device's ``state`` as the core sees it: the in-flight mark removed."""
    return SlotState(state.state_idx, np.abs(state.acc), state.num_computed)


def blocks_of(bt, num_blocks=None) -> int:
    """``num_blocks`` for a step on ``bt``: as given, else one past its largest id."""
    return int(num_blocks) if num_blocks is not None else int(max(np.max(bt, initial=0), 0)) + 1


def make_backend(name: str, **kw) -> Backend:
    return {"reference": Reference, "torch": Torch, "jax": Jax}[name](**kw)

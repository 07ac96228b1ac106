"""The one entry point through which JAX launches a kernel: :func:`launch`.

It takes a :class:`~mamba_align.kernels.LaunchPlan` (the same plan the torch backend
uses; it carries the scalars and the outputs' shapes and dtypes) and the input arrays by
name, and returns every output by name. In-place outputs (``plan.aliases``) are returned
as the updated input array. Scalars reach the kernel as Python ``int`` or ``np.float32``.

* GPU: ``jax_triton.triton_call`` with ``input_output_aliases`` (its import needs a GPU
  and clears ``TRITON_CACHE_DIR``, so it is imported lazily and the variable restored).
  Under ``jax.jit`` with the aliased arrays donated, XLA updates them in place.
  jax-triton 0.3.x takes ``out_shape`` and counts alias inputs among the array operands;
  0.4.x takes ``out_type`` and counts them among all non-constexpr operands in parameter
  order. The kernel ABI puts every array before the scalars, so the indices agree; only
  the keyword differs. (0.4.x needs triton >= 3.7: that branch is not yet run on a GPU.)
* CPU: ``jax.pure_callback`` into Triton's interpreter on writable NumPy copies (one lock
  around the interpreter). The interpreter keeps its arguments in torch CPU tensors, so
  this path wraps the copies with ``torch.from_numpy`` (no copy); torch is imported there
  only. XLA's CPU runtime runs the callback with subnormal floats flushed to zero, which
  the torch launcher and the references do not; on Linux (glibc) the callback runs the
  kernel in the default floating-point environment (:func:`_ieee_floats`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import platform
import threading
import warnings
from typing import Any, Dict, Iterator, Mapping

import jax
import numpy as np

_LOCK = threading.Lock()
_JT = None
_JT_VERSION = (0, 0)
_WARNED = set()


def on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def _jax_triton():
    """Import jax_triton once, keeping ``TRITON_CACHE_DIR`` as it was."""
    global _JT, _JT_VERSION
    if _JT is None:
        saved = os.environ.get("TRITON_CACHE_DIR")
        import jax_triton

        if saved is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = saved
        version = tuple(int(x) for x in jax_triton.__version__.split(".")[:2])
        if version not in ((0, 3), (0, 4)):
            raise ImportError(
                f"jax-triton {jax_triton.__version__} is not supported: install 0.3.x "
                "(triton 3.6) or 0.4.x (triton >= 3.7)"
            )
        _JT, _JT_VERSION = jax_triton, version
    return _JT


def _pass_register_caps(jt) -> None:
    """Make jax-triton compile a kernel that carries a register cap (``kernel.maxnreg``,
    Triton's ``maxnreg`` option) with it, as torch's launcher does: torch and JAX must run
    one binary (kernels/jit.py). jax-triton 0.3 takes no such option; it builds the compile
    options in ``get_or_create_triton_kernel`` from a fresh backend object per call, and
    keys its kernel cache on the kernel function, which carries the cap. So the cap is
    added to that backend's parsed options, for capped kernels only. A kernel's cap is
    fixed: jax-triton's cache key does not hold it."""
    lib = jt.triton_lib
    if _JT_VERSION != (0, 3):
        raise NotImplementedError(f"jax-triton {jt.__version__} cannot pass a register cap "
                                  "(maxnreg); the kernels with one need jax-triton 0.3.x")
    with _LOCK:
        if not getattr(lib, "_mamba_align_caps", False):
            _wrap_kernel_creation(lib)


def _wrap_kernel_creation(lib) -> None:
    create = lib.get_or_create_triton_kernel

    def get_or_create(backend_init_func, platform, fn, *args, **kwargs):
        cap = getattr(fn, "maxnreg", None)
        if cap:
            def init(device, capability):
                backend = backend_init_func(device, capability)
                parse = backend.parse_options
                backend.parse_options = lambda opts: parse({**opts, "maxnreg": cap})
                return backend
            return create(init, platform, fn, *args, **kwargs)
        return create(backend_init_func, platform, fn, *args, **kwargs)

    lib.get_or_create_triton_kernel = get_or_create
    lib._mamba_align_caps = True


def _scalar(name: str, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"scalar {name} must be a Python int or float, got {type(v).__name__}")
    return np.float32(v) if isinstance(v, float) else int(v)


def launch(plan, arrays: Mapping[str, Any]) -> Dict[str, jax.Array]:
    """Run ``plan`` on JAX arrays (every input by name); returns ``{output name: array}``.
    Its ``before`` stages run first; their scratch outputs join the inputs by name."""
    if plan.before:
        arrays = dict(arrays)
        for stage in plan.before:
            arrays.update(launch(stage, arrays))
    specs = []
    for name in plan.outputs:
        if name in plan.aliases:
            src = arrays[plan.aliases[name]]
            specs.append(jax.ShapeDtypeStruct(src.shape, src.dtype))
        else:
            o = plan.out_specs[name]
            specs.append(jax.ShapeDtypeStruct(o.shape, jax.dtypes.canonicalize_dtype(o.dtype)))
    inputs = [arrays[n] for n in plan.inputs]
    scalar_values = [_scalar(n, v) for n, v in plan.scalars]
    if on_gpu():
        outs = _launch_gpu(plan, inputs, scalar_values, specs)
    else:
        outs = _launch_interpreter(plan, inputs, scalar_values, specs)
    return dict(zip(plan.outputs, outs))


def _launch_gpu(plan, inputs, scalar_values, specs):
    jt = _jax_triton()
    aliases = {plan.inputs.index(src): plan.outputs.index(out) for out, src in plan.aliases.items()}
    if aliases and not any(isinstance(x, jax.core.Tracer) for x in inputs):
        key = plan.name
        if key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(f"{key} called outside jax.jit: its in-place arrays are copied; jit "
                          "the step with the pools donated (donate_argnums) to update them in "
                          "place", stacklevel=3)
    if plan.maxnreg:
        _pass_register_caps(jt)
    shapes = {"out_shape" if _JT_VERSION < (0, 4) else "out_type": specs}
    outs = jt.triton_call(*inputs, *scalar_values, kernel=plan.kernel, grid=plan.grid,
                          num_warps=plan.num_warps, input_output_aliases=aliases, **shapes,
                          **plan.constexprs)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def _torch_view(a: np.ndarray):
    import torch

    if a.dtype.name == "bfloat16":  # ml_dtypes: reinterpret through int16
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


_CPU_FNS: Dict[tuple, Any] = {}  # one jitted callback per launch signature


def _launch_interpreter(plan, inputs, scalar_values, specs):
    # Eager pure_callbacks with a fresh host function recompile on every call (~30 ms); a
    # jitted callback per (kernel, grid, constexprs, scalars, shapes) is compiled once.
    key = (plan.name, plan.grid, tuple(sorted(plan.constexprs.items())), plan.num_warps,
           tuple(sorted(plan.aliases.items())), tuple(scalar_values),
           tuple((s.shape, str(s.dtype)) for s in specs),
           tuple((tuple(x.shape), str(x.dtype)) for x in inputs))
    fn = _CPU_FNS.get(key)
    if fn is None:
        fn = _CPU_FNS[key] = jax.jit(_interpreter_callback(plan, scalar_values, specs))
    outs = fn(*inputs)
    if not any(isinstance(x, jax.core.Tracer) for x in inputs):
        # an eager launch completes before it returns: a script may otherwise end while its
        # host callback is still to run, and a callback run during interpreter shutdown
        # aborts the process ("terminate called without an active exception")
        jax.block_until_ready(outs)
    return outs


def _libm():
    """glibc's libm, or None elsewhere (its ``FE_DFL_ENV`` is the pointer -1 in glibc only)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    name = ctypes.util.find_library("m")
    return ctypes.CDLL(name) if name else None


_LIBM = _libm()


@contextlib.contextmanager
def _ieee_floats() -> Iterator[None]:
    """The default floating-point environment (subnormals kept: no flush to zero, no
    denormals-are-zero) for the block, the caller's restored after it."""
    if _LIBM is None:
        yield
        return
    saved = ctypes.create_string_buffer(1024)  # any platform's fenv_t fits
    if _LIBM.fegetenv(saved) != 0:  # nothing saved: leave the environment as it is
        yield
        return
    _LIBM.fesetenv(ctypes.c_void_p(-1))  # FE_DFL_ENV
    try:
        yield
    finally:
        _LIBM.fesetenv(saved)


def _interpreter_callback(plan, scalar_values, specs):
    alias_of = {plan.outputs.index(out): plan.inputs.index(src) for out, src in plan.aliases.items()}

    def host(*host_inputs):
        bufs = [np.array(x, copy=True) for x in host_inputs]  # writable copies
        outs = [bufs[alias_of[i]] if i in alias_of else np.empty(s.shape, s.dtype)
                for i, s in enumerate(specs)]
        args = [_torch_view(b) for b in bufs] + [float(v) if isinstance(v, np.floating) else v
                                                 for v in scalar_values]
        out_views = {i: args[alias_of[i]] if i in alias_of else _torch_view(o)
                     for i, o in enumerate(outs)}
        args += [out_views[i] for i in range(len(outs))]
        with _LOCK, _ieee_floats():
            plan.kernel[plan.grid](*args, **plan.constexprs, **plan.launch_options)
        return tuple(outs)

    def call(*inputs):
        return list(jax.pure_callback(host, tuple(specs), *inputs, vmap_method="sequential"))

    return call

"""Four changes to Triton's CPU interpreter (CPU runs only): one for the kernels' speed in
it, one for NumPy 2.5, one for batch invariance on every CPU, one for the bits of bfloat16;
and Triton's own helpers rebuilt for it where triton was imported before it was chosen
(:func:`reinterpret_helpers`, any Triton version).

The interpreter swaps ``triton.language``'s builtins for interpreted ones when a launch
starts and restores them when it ends. A call of a ``@triton.jit`` helper from inside a
kernel asks for the swap again although it is in place: that walks every member of
``triton.language`` (about 1 ms a call), swaps no builtin (they are swapped already) and
sets the tensor methods it sets again to equivalent ones, which nothing restores. Under
cProfile it was 38 % of a served model step in the interpreter (benchmarks/README.md).
:func:`install` makes a helper called during a launch skip that when every
``triton.language`` module it sees is swapped; the launch's own swap, and helpers that see
a module that is not swapped, go through Triton's code.

The interpreter holds a scalar argument as a one-element array and gives tensors an
``__index__`` that calls ``int`` on it (``range(0, n, BLOCK)`` over a scalar ``n`` does),
which NumPy 2.5 refuses for arrays of one dimension (deprecated since 1.25). Every swap
:func:`install` lets through sets an ``__index__`` that takes the one element first.

The interpreter computes ``tl.dot`` with ``np.matmul``, that is with NumPy's BLAS, which
may sum a row's products in an order that depends on where the row sits in the tile (seen
on one CPU: benchmarks/README.md). The dense kernels' batch invariance (a row's result
never depends on the other rows, :mod:`.dense`) then held on some CPUs only.
:func:`install` makes a ``tl.dot`` of float16 / float32 / float64 inputs multiply in
float64 (exact for float32 and narrower) and sum each output over ``K`` on its own (no
BLAS), rounded once to the accumulator's dtype before it is added, as before. The
interpreter also ignored ``input_precision``: float32 products asked at TF32 or TF32x3 now
cut their inputs as the compiled products do (the chunked gated delta rule's), so the CPU
tests see that error. Compiled kernels are untouched.

The interpreter narrows float32 to bfloat16 by dropping the low 16 bits (its
round-to-nearest mode, for an explicit ``fp_downcast_rounding="rtne"``, rounds ties up
and ORs a mantissa's carry into the exponent), and gets subnormals wrong both ways (a
bfloat16 subnormal widens to zero or to another value). A compiled kernel rounds to
nearest even (``cvt.rn`` in the PTX) and widens exactly, as torch and the references do.
A bfloat16 pool or output then held other bits on the CPU than on the GPU.
:func:`install` makes float32 to bfloat16 round to nearest even, or toward zero when
``"rtz"`` is asked for, and bfloat16 to float32 exact. A NaN stays a quiet NaN of its
sign, whose bits need not be the GPU's.

Written for Triton 3.6.
"""

from __future__ import annotations

import inspect
import sys
import threading

import numpy as np
import triton
import triton.language as tl
from triton.runtime import interpreter as _interpreter
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction


def _swapped(module) -> bool:
    return not tl.core.is_builtin(module.load)


def _index(self) -> int:
    """A tensor's ``__index__`` in the interpreter: its one element (a scalar argument is a
    one-element array; ``.item()`` refuses any other size)."""
    return int(self.handle.data.item())


def _tf32(x: np.ndarray, nearest: bool = True) -> np.ndarray:
    """float32 ``x`` cut to TF32 (10 mantissa bits), as float64: rounded to nearest with ties
    away from zero (the GPU's ``cvt.rna.tf32.f32``), or truncated (what a TF32 tensor-core
    product does to an fp32 operand)."""
    u = np.asarray(x, np.float32).view(np.uint32)
    r = ((u + np.uint32(0x1000 if nearest else 0)) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(np.isfinite(x), r, x).astype(np.float64)


def _matmul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.sum(x[..., :, :, None] * y[..., None, :, :], axis=-2)


def _row_invariant_dot(dot):
    """The interpreter's ``create_dot`` with floating-point products summed without BLAS:
    ``a @ b`` in float64, each output summed over ``K`` by itself, rounded to ``d``'s dtype,
    plus ``d``. A product at TF32 or TF32x3 precision first cuts its inputs as Triton's
    compiled one does: TF32 hands the fp32 inputs to the tensor cores, which keep 10
    mantissa bits (truncated); TF32x3 splits each input into its nearest TF32 value and the
    remainder (truncated by the tensor cores in turn), adds the two products with a
    remainder (a NaN among them made 0) to the big parts' product, and drops the
    remainders' product. The sums stay float64 (the GPU sums in fp32, in its own order): the
    CPU tests see the error the inputs' cuts make, not the GPU's bits. Integer, bfloat16
    and 8-bit float inputs, which the interpreter holds as integers, go to ``dot`` (the
    kernels widen bfloat16 to float32 before a product)."""
    precision = tl.core.ir.INPUT_PRECISION

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        x, y = a.data, b.data
        if x.dtype.kind != "f" or y.dtype.kind != "f":
            return dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        if input_precision == precision.TF32 and x.dtype == y.dtype == np.float32:
            prod = _matmul(_tf32(x, nearest=False), _tf32(y, nearest=False))
        elif input_precision == precision.TF32x3 and x.dtype == y.dtype == np.float32:
            xb, yb = _tf32(x), _tf32(y)
            with np.errstate(invalid="ignore"):  # inf - inf: a NaN remainder, made 0 below
                xs = _tf32(x - xb.astype(np.float32), nearest=False)
                ys = _tf32(y - yb.astype(np.float32), nearest=False)
                small = _matmul(xs, yb) + _matmul(xb, ys)
                prod = np.where(np.isnan(small), 0.0, small) + _matmul(xb, yb)
        else:
            prod = _matmul(x.astype(np.float64), y.astype(np.float64))
        return _interpreter.TensorHandle(prod.astype(d.data.dtype) + d.data, d.dtype.scalar)

    create_dot.row_invariant = True
    return create_dot


def _bf16_bits(x, nearest: bool = True) -> np.ndarray:
    """float32 ``x`` as bfloat16 bits: rounded to nearest, ties to even (an overflow
    rounds to inf), or toward zero; a NaN stays a quiet NaN of its sign."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 if nearest else u >> 16
    return np.where(np.isnan(x), (u >> 16) | 0x40, bits).astype(np.uint16)


def _rounding_casts(cast, fp_to_fp):
    """The interpreter's ``cast_impl`` and ``create_fp_to_fp`` with float32 to bfloat16
    rounded to nearest even, or toward zero when asked, and bfloat16 to float32 exact
    (subnormals included both ways)."""
    def narrows(src, dst_type):
        return src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16

    def cast_impl(self, src, dst_type):
        if narrows(src, dst_type):
            return _interpreter.TensorHandle(_bf16_bits(src.data), dst_type.scalar)
        if src.dtype.scalar == tl.bfloat16 and dst_type.scalar == tl.float32:  # exact
            wide = (np.asarray(src.data).astype(np.uint32) << 16).view(np.float32)
            return _interpreter.TensorHandle(wide, dst_type.scalar)
        return cast(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if narrows(src, dst_type):
            nearest = rounding_mode != tl.core.ir.ROUNDING_MODE.RTZ
            return _interpreter.TensorHandle(_bf16_bits(src.data, nearest), dst_type.scalar)
        return fp_to_fp(self, src, dst_type, rounding_mode)

    cast_impl.rounds_to_nearest = True
    return cast_impl, create_fp_to_fp


def reinterpret_helpers() -> int:
    """Triton's own ``@triton.jit`` helpers (``tl.cdiv``, ``tl.zeros_like``, ``x.sum()``, ...)
    are built compiled or interpreted as ``TRITON_INTERPRET`` was when ``triton.language``
    was first imported. Where something imported triton before the interpreter was chosen
    (``torch._dynamo``, jax-triton, fla), they are compiled ones, which refuse a call from an
    interpreted kernel; each is replaced by an interpreted function of the same Python code,
    in its module and as a tensor method. Returns how many were replaced (0 if none were
    compiled)."""
    made: dict = {}

    def interpreted(value):
        if id(value) not in made:
            made[id(value)] = InterpretedFunction(value.fn)
        return made[id(value)]

    owners = [m for name, m in list(sys.modules.items())
              if m is not None and (name == "triton.language"
                                    or name.startswith("triton.language."))]
    for owner in owners + [tl.core.tensor]:
        for name, value in list(vars(owner).items()):
            if isinstance(value, JITFunction):
                setattr(owner, name, interpreted(value))
    return len(made)


def install() -> bool:
    """Make helper calls during a launch skip the redundant swap, every swap set
    :func:`_index` as the tensors' ``__index__``, ``tl.dot`` sum each row without BLAS, and
    float32 round to the nearest bfloat16;
    ``False`` if this Triton's interpreter is not the one this was written for (nothing
    changed), or it is already installed."""
    patch = getattr(_interpreter, "_patch_lang", None)
    launcher = getattr(_interpreter, "GridExecutor", None)
    scope = getattr(_interpreter, "_LangPatchScope", None)
    builder = getattr(_interpreter, "InterpreterBuilder", None)
    if (not triton.__version__.startswith("3.6.") or patch is None or scope is None
            or launcher is None or builder is None or not hasattr(builder, "create_dot")
            or not hasattr(_interpreter, "TensorHandle") or not hasattr(builder, "cast_impl")
            or not hasattr(builder, "create_fp_to_fp")
            or getattr(patch, "skips_nested_swaps", False)):
        return False
    launching = threading.local()  # launches running in this thread; the next swap its own
    langs_of = {}  # a function's triton.language modules, as its globals name them

    def patch_lang(fn):
        langs = langs_of.get(fn)
        if langs is None:
            langs = langs_of[fn] = [v for v in fn.__globals__.values()
                                    if inspect.ismodule(v) and v in (tl, tl.core)]
        if getattr(launching, "fresh", False):
            launching.fresh = False  # the launch's own swap
        elif getattr(launching, "depth", 0) and langs and all(_swapped(m) for m in langs):
            return scope()  # a helper inside a launch: nothing to swap, nothing to restore
        swap = patch_lang.original(fn)
        for lang in langs:  # restored with the rest of the swap
            swap.set_attr(lang.tensor, "__index__", _index)
        return swap

    run = launcher.__call__

    def launch(self, *args, **kwargs):
        launching.depth = getattr(launching, "depth", 0) + 1
        launching.fresh = True
        try:
            return run(self, *args, **kwargs)
        finally:
            launching.depth -= 1
            launching.fresh = False

    builder.create_dot = _row_invariant_dot(builder.create_dot)
    builder.cast_impl, builder.create_fp_to_fp = _rounding_casts(builder.cast_impl,
                                                                  builder.create_fp_to_fp)
    patch_lang.skips_nested_swaps = True
    patch_lang.original = patch
    _interpreter._patch_lang = patch_lang
    launcher.__call__ = launch
    return True

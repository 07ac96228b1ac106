"""The four changes the package makes to Triton's CPU interpreter (kernels/interpret.py): a
``@triton.jit`` helper called during a launch skips re-swapping ``triton.language``, which
the launch has swapped already; launches themselves go through Triton's own code. A
tensor's ``__index__`` takes its one element, which NumPy 2.5 requires. A floating-point
``tl.dot`` sums each output by itself (the row invariance: tests/test_dense.py). float32
rounds to the nearest bfloat16, ties to even, and bfloat16 widens exactly, as compiled
kernels and torch do. That the
kernels compute the same bits with them is the rest of the suite (every kernel against its
reference, in the interpreter)."""

import os
import warnings

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

from mamba_align.kernels.interpret import install

pytestmark = [
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                       reason="the interpreter only (compiled kernels never use it)"),
    pytest.mark.skipif(not triton.__version__.startswith("3.6."),
                       reason="written for Triton 3.6's interpreter (install() declines others)"),
]


@triton.jit
def _plus_one(x):
    return x + 1


@triton.jit
def _twice_plus_one(ptr):
    x = tl.load(ptr)
    tl.store(ptr, _plus_one(_plus_one(x)))


@triton.jit
def _calls_a_helper_wrongly(ptr):
    tl.store(ptr, _plus_one())


@triton.jit
def _count_to(ptr, n):
    total = 0
    for _ in range(0, n, 2):  # a scalar argument as a loop bound: its __index__
        total += 1
    tl.store(ptr, total)


@triton.jit
def _steps(n):
    total = 0
    for _ in range(0, n, 3):  # the same in a helper (as kernels/rows.py's loops are)
        total += 1
    return total


@triton.jit
def _count_in_a_helper(ptr, n):
    tl.store(ptr, _steps(n))


@pytest.fixture
def swaps(monkeypatch):
    """The names of the functions Triton's own swap ran for."""
    seen, real = [], interpreter._patch_lang.original
    monkeypatch.setattr(interpreter._patch_lang, "original",
                        lambda fn: seen.append(fn.__name__) or real(fn))
    return seen


def test_installed_once_by_the_package():
    assert getattr(interpreter._patch_lang, "skips_nested_swaps", False)
    assert getattr(interpreter.InterpreterBuilder.create_dot, "row_invariant", False)
    dot = interpreter.InterpreterBuilder.create_dot
    assert getattr(interpreter.InterpreterBuilder.cast_impl, "rounds_to_nearest", False)
    assert install() is False  # already in place: nothing changes
    assert interpreter.InterpreterBuilder.create_dot is dot  # not wrapped twice


@triton.jit
def _to_bf16(x_ptr, y_ptr, n, ROUNDING: tl.constexpr):
    i = tl.arange(0, 64)
    x = tl.load(x_ptr + i, mask=i < n)
    if ROUNDING == "rtz":
        y = x.to(tl.bfloat16, fp_downcast_rounding="rtz")
    elif ROUNDING == "rtne":
        y = x.to(tl.bfloat16, fp_downcast_rounding="rtne")
    else:
        y = x.to(tl.bfloat16)
    tl.store(y_ptr + i, y, mask=i < n)


def _float32(*bits):
    return np.array(bits, np.uint32).view(np.float32)


# ties both ways, just above and below a tie, a mantissa that carries into the exponent
# (odd and even exponents), the largest float32 (rounds to inf), subnormals, signs
_BF16_CASES = np.concatenate([
    _float32(0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x3F7FFFFF, 0x3FFFFFFF,
             0x407FFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x00018000, 0x807FFFFF,
             0x7F800000, 0xFF800000, 0x00000000, 0x80000000),
    np.random.default_rng(0).normal(size=40).astype(np.float32)])


@pytest.mark.parametrize("rounding", ["default", "rtne"])
def test_float32_rounds_to_the_nearest_bfloat16_ties_to_even(rounding):
    y = torch.zeros(len(_BF16_CASES), dtype=torch.bfloat16)
    _to_bf16[(1,)](torch.from_numpy(_BF16_CASES), y, len(_BF16_CASES), rounding)
    want = torch.from_numpy(_BF16_CASES).to(torch.bfloat16)  # round to nearest even
    assert torch.equal(y.view(torch.int16), want.view(torch.int16))


@triton.jit
def _from_bf16(x_ptr, y_ptr, n):
    i = tl.arange(0, 64)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n).to(tl.float32), mask=i < n)


def test_bfloat16_widens_to_float32_exactly():
    # every bfloat16 bit pattern a subnormal, a normal or a special value can have
    bits = np.array([0x0001, 0x0040, 0x007F, 0x8001, 0x0080, 0x3F80, 0x7F7F, 0xFF7F, 0x7F80,
                     0xFF80, 0x0000, 0x8000, 0x4049, 0xC2F7], np.uint16)
    x = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    y = torch.zeros(len(x))
    _from_bf16[(1,)](x, y, len(x))
    assert torch.equal(y.view(torch.int32), x.to(torch.float32).view(torch.int32))


def test_float32_toward_zero_and_nan_to_bfloat16():
    x = torch.from_numpy(_BF16_CASES)
    y = torch.zeros(len(x), dtype=torch.bfloat16)
    _to_bf16[(1,)](x, y, len(x), "rtz")
    finite = torch.isfinite(x)
    dropped = (x.view(torch.int32) >> 16).to(torch.int16)  # the low 16 bits dropped
    assert torch.equal(y.view(torch.int16)[finite], dropped[finite])
    nan = torch.from_numpy(_float32(0x7FC00001, 0xFF800001, 0x7F812345))
    y = torch.zeros(3, dtype=torch.bfloat16)
    _to_bf16[(1,)](nan, y, 3, "default")
    assert torch.isnan(y).all()
    assert (y.view(torch.int16) < 0).tolist() == [False, True, False]  # the sign kept


@triton.jit
def _batched_dot(a_ptr, b_ptr, c_ptr):
    i = tl.arange(0, 2)[:, None, None] * 256
    m = tl.arange(0, 16)[None, :, None] * 16
    n = tl.arange(0, 16)[None, None, :]
    a = tl.load(a_ptr + i + m + n)
    b = tl.load(b_ptr + i + m + n)
    acc = tl.full((2, 16, 16), 1.0, tl.float32)
    tl.store(c_ptr + i + m + n, tl.dot(a, b, acc, input_precision="ieee"))


def test_a_batched_dot_adds_the_products_to_its_accumulator():
    rng = np.random.default_rng(0)
    a, b = (rng.normal(size=(2, 16, 16)).astype(np.float32) for _ in range(2))
    c = torch.zeros(2, 16, 16)
    _batched_dot[(1,)](torch.from_numpy(a), torch.from_numpy(b), c)
    want = a.astype(np.float64) @ b.astype(np.float64) + 1.0
    np.testing.assert_allclose(c.numpy(), want, rtol=1e-6, atol=1e-6)


@triton.jit
def _dot_at(a_ptr, b_ptr, c_ptr, PRECISION: tl.constexpr):
    o = tl.arange(0, 16)[:, None] * 16 + tl.arange(0, 16)[None, :]
    c = tl.dot(tl.load(a_ptr + o), tl.load(b_ptr + o), input_precision=PRECISION)
    tl.store(c_ptr + o, c)


def tf32(x):  # nearest, ties away from zero: the bits below the 10-bit mantissa dropped
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("precision", ["ieee", "tf32", "tf32x3"])
def test_a_float32_dot_rounds_its_inputs_as_its_precision_asks(precision):
    # the GPU's tensor cores: TF32 rounds each input to 10 mantissa bits; TF32x3 adds the
    # products with each input's TF32 remainder; IEEE multiplies exactly
    rng = np.random.default_rng(1)
    a, b = (rng.normal(size=(16, 16)).astype(np.float32) for _ in range(2))
    a[0, 0], b[0, 0] = 1 + 2**-11, 1  # a tie: rounds away from zero in TF32
    c = torch.zeros(16, 16)
    _dot_at[(1,)](torch.from_numpy(a), torch.from_numpy(b), c, precision)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if precision == "ieee":
        want = a64 @ b64
    elif precision == "tf32":
        want = tf32(a) @ tf32(b)
    else:
        ra, rb = tf32(a - tf32(a)), tf32(b - tf32(b))
        want = tf32(a) @ tf32(b) + ra @ tf32(b) + tf32(a) @ rb
    np.testing.assert_array_equal(c.numpy(), want.astype(np.float32))
    exact = a64 @ b64
    err = np.abs(c.numpy() - exact).max()
    assert (err > 1e-4) if precision == "tf32" else (err < 1e-5), err


def test_a_launch_swaps_once_and_its_helper_calls_skip_the_swap(swaps):
    x = torch.zeros(1)
    _twice_plus_one[(1,)](x)
    assert x.item() == 2.0
    assert swaps == ["_twice_plus_one"]  # Triton alone: the kernel, then each helper call
    assert tl.core.is_builtin(tl.load)  # restored after the launch


def test_a_launch_swaps_even_when_the_builtins_are_already_swapped(swaps):
    # as when another thread is inside a launch: this launch still runs Triton's own swap
    outer = interpreter._patch_lang(_plus_one.fn)
    try:
        x = torch.zeros(1)
        _twice_plus_one[(1,)](x)
        assert x.item() == 2.0 and swaps == ["_plus_one", "_twice_plus_one"]
    finally:
        outer.restore()
    assert tl.core.is_builtin(tl.load)


def test_an_exception_in_a_launch_leaves_no_launch_counted(swaps):
    with pytest.raises(interpreter.InterpreterError):
        _calls_a_helper_wrongly[(1,)](torch.zeros(1))
    assert tl.core.is_builtin(tl.load)
    scope = interpreter._patch_lang(_plus_one.fn)  # not during a launch: Triton's own swap
    scope.restore()
    assert swaps[-1] == "_plus_one"


def test_outside_a_launch_the_swap_is_triton_own(swaps):
    scope = interpreter._patch_lang(_plus_one.fn)
    try:
        assert swaps == ["_plus_one"] and not tl.core.is_builtin(tl.load)
    finally:
        scope.restore()
    assert tl.core.is_builtin(tl.load)


def test_a_scalar_argument_bounds_a_loop_without_numpy_scalar_conversion():
    # Triton's own __index__ converts a one-element array to int: deprecated since NumPy
    # 1.25 (a DeprecationWarning, made an error here), a TypeError from NumPy 2.5
    x = torch.zeros(1, dtype=torch.int32)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Conversion of an array", category=DeprecationWarning)
        _count_to[(1,)](x, 7)
        assert x.item() == 4
        _count_in_a_helper[(1,)](x, 7)
        assert x.item() == 3
    assert not hasattr(tl.tensor, "__index__")  # restored with the rest of the swap

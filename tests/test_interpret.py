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


# float32 inputs times the identity, and what each precision makes of them, worked out by
# hand: TF32 keeps 10 mantissa bits (the tensor cores truncate); TF32x3 takes the nearest
# TF32 value (ties away from zero) and the remainder truncated to TF32 in turn
INPUTS = [1 + 2**-11, -(1 + 2**-11 + 2**-12), 1 + 2**-11 + 2**-23, 3.0]
BY_PRECISION = {
    "ieee": INPUTS,
    "tf32": [1.0, -1.0, 1.0, 3.0],
    # 1 + 2^-11 + 2^-23: big 1 + 2^-10, remainder -(2^-11 - 2^-23) cut to -(2^-11 - 2^-22)
    "tf32x3": [1 + 2**-11, -(1 + 2**-11 + 2**-12), 1 + 2**-11 + 2**-22, 3.0],
}


@pytest.mark.parametrize("precision", ["ieee", "tf32", "tf32x3"])
def test_a_float32_dot_cuts_its_inputs_as_its_precision_asks(precision):
    a = np.zeros((16, 16), np.float32)
    a[0, :4] = INPUTS
    c = torch.zeros(16, 16)
    _dot_at[(1,)](torch.from_numpy(a), torch.from_numpy(np.eye(16, dtype=np.float32)), c,
                  precision)
    assert c[0, :4].tolist() == BY_PRECISION[precision]
    assert (c[1:] == 0).all() and (c[0, 4:] == 0).all()


def test_an_infinite_input_stays_infinite_at_tf32x3():
    # inf - inf makes the remainder NaN; the compiled product drops a NaN from the
    # remainders' products, so inf times 1 is inf
    a = np.zeros((16, 16), np.float32)
    a[0, 0] = np.inf
    c = torch.zeros(16, 16)
    _dot_at[(1,)](torch.from_numpy(a), torch.from_numpy(np.eye(16, dtype=np.float32)), c,
                  "tf32x3")
    assert c[0, 0] == float("inf")


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

"""The dense operations (kernels/dense.py) three ways: the float64 reference, torch and
JAX. fp32 within 1e-5 relative of the reference (bf16: 2e-2); torch and JAX run the same
kernel: bit-identical; a row gives the same bits in any batch."""

import ml_dtypes
import numpy as np
import pytest
import torch
from support import make_backend

from mamba_align.kernels import dense as kdense

BF16 = ml_dtypes.bfloat16
# M past one row tile, K past one depth step, N past one column tile (masking everywhere)
M, K, N, D = 20, 40, 70, 48


def arrays(op, rng, dtype, rows=M):
    r = lambda *s: rng.normal(size=s).astype(dtype)  # noqa: E731
    if op == "linear":
        return r(rows, K), (r(K, N) / np.sqrt(K)).astype(dtype)
    if op == "rms_norm":
        return r(rows, D), r(D)
    if op == "rms_norm_gated":
        return r(rows, D), r(rows, D), r(D)
    return r(rows, D), r(rows, D)  # silu_mul


OPS = ("linear", "rms_norm", "rms_norm_gated", "silu_mul")


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_matches_the_reference(device_backend, op, dtype):
    rng = np.random.default_rng(0)
    args = arrays(op, rng, dtype)
    got = device_backend.dense(op, *args)
    want = make_backend("reference").dense(op, *args)
    tol = 1e-5 if dtype == np.float32 else 2e-2
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    assert got.dtype == args[0].dtype and got.shape == want.shape


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_torch_and_jax_give_the_same_bits(op, dtype):
    args = arrays(op, np.random.default_rng(1), dtype)
    a, b = (make_backend(name).dense(op, *args) for name in ("torch", "jax"))
    np.testing.assert_array_equal(a, b)


def test_a_projection_row_gives_the_same_bits_at_every_place_in_its_tile(device_backend):
    # at each of a row tile's places among random neighbours, and alone (a BLAS-backed
    # product in the interpreter failed this on some CPUs: kernels/interpret.py)
    rng = np.random.default_rng(3)
    x, w = arrays("linear", rng, np.float32, rows=1)
    alone = device_backend.dense("linear", x, w)[0]
    for place in range(kdense.BLOCK_M):
        batch = rng.normal(size=(kdense.BLOCK_M, K)).astype(np.float32)
        batch[place] = x[0]
        got = device_backend.dense("linear", batch, w)[place]
        np.testing.assert_array_equal(got, alone, err_msg=f"row at place {place}")


@pytest.mark.parametrize("op", OPS)
def test_a_row_gives_the_same_bits_in_any_batch(device_backend, op):
    # row 17 alone, and among 37 rows (another row tile, other neighbours in its tile)
    args = arrays(op, np.random.default_rng(2), np.float32, rows=37)
    full = device_backend.dense(op, *args)
    one = [a[17:18] if a.ndim == 2 and a.shape[0] == 37 else a for a in args]
    np.testing.assert_array_equal(device_backend.dense(op, *one)[0], full[17])


def test_rows_of_one_element(backend):
    # D = 1: on the GPU the launcher turns dim = 1 into a constant (the kernel must compile)
    x, w = np.array([[2.0], [-3.0]], np.float32), np.array([1.5], np.float32)
    np.testing.assert_allclose(backend.dense("rms_norm", x, w), [[1.5], [-1.5]], rtol=1e-5)


def test_an_empty_batch_gives_an_empty_output(device_backend):
    x, w = arrays("linear", np.random.default_rng(3), np.float32, rows=0)
    assert device_backend.dense("linear", x, w).shape == (0, N)


@pytest.mark.parametrize("change,error", [
    (lambda x, w: (x, w.astype(BF16)), "weight must have x's dtype"),
    (lambda x, w: (x, w[:-1]), "weight must have shape"),
    (lambda x, w: (x.astype(np.int32), w), "x must have dtype"),
])
def test_bad_linear_arguments_raise(device_backend, change, error):
    x, w = change(*arrays("linear", np.random.default_rng(4), np.float32))
    with pytest.raises((TypeError, ValueError), match=error):
        device_backend.dense("linear", x, w)


def test_bad_norm_arguments_raise(device_backend):
    x, w = arrays("rms_norm", np.random.default_rng(5), np.float32)
    for eps in (0.0, 1e-50, 1e39, float("nan")):  # 1e-50 is 0 in fp32, 1e39 past its range
        with pytest.raises(ValueError, match="eps must be a float > 0"):
            device_backend.dense("rms_norm", x, w, eps=eps)
    with pytest.raises(ValueError, match="weight must have shape"):
        device_backend.dense("rms_norm", x, w[:-1])
    big = np.zeros((1, kdense.MAX_NORM_DIM + 1), np.float32)
    with pytest.raises(ValueError, match="a norm's rows must have"):
        device_backend.dense("rms_norm", big, np.zeros(big.shape[1], np.float32))


def test_torch_compile_and_jax_jit_give_the_eager_bits():
    # a norm then a projection under torch.compile (two row counts: the second is
    # symbolic) and under jax.jit
    import jax
    import torch

    from mamba_align.backends.jax import ops as jops
    from mamba_align.backends.torch import ops as tops
    rng = np.random.default_rng(6)
    x, nw = arrays("rms_norm", rng, np.float32)
    w = (rng.normal(size=(D, N)) / np.sqrt(D)).astype(np.float32)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # compiled kernels need CUDA tensors
    T = lambda a: torch.as_tensor(a, device=dev)  # noqa: E731, N806

    def block(ops, x, nw, w):
        return ops.linear(ops.rms_norm(x, nw, eps=1e-5)["y"], w)["y"]

    compiled = torch.compile(lambda *a: block(tops, *a), fullgraph=True)
    for rows in (M, 7):
        args = (T(x[:rows]), T(nw), T(w))
        assert torch.equal(block(tops, *args), compiled(*args))
    A = jax.numpy.asarray  # noqa: N806
    args = (A(x), A(nw), A(w))
    np.testing.assert_array_equal(np.asarray(block(jops, *args)),
                                  np.asarray(jax.jit(lambda *a: block(jops, *a))(*args)))


def test_a_torch_view_off_a_16_byte_boundary_gives_the_aligned_bits():
    # jax-triton calls every pointer aligned; the torch launcher copies a misaligned input
    # so that the kernel compiled for it is the same (on the GPU; the CPU has no alignment)
    import torch

    from mamba_align.backends.torch import ops as tops
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x, w = (torch.as_tensor(a, device=dev) for a in arrays("rms_norm", np.random.default_rng(7),
                                                           np.float32))
    buf = torch.zeros(D + 1, device=dev)
    buf[1:] = w
    off = buf[1:]  # 4 bytes past the allocation's start
    assert off.data_ptr() % 16
    assert torch.equal(tops.rms_norm(x, off)["y"], tops.rms_norm(x, w)["y"])
    assert torch.equal(off, w)  # the input itself untouched


def test_subnormals_are_kept_by_both_launchers():
    # XLA's CPU runtime runs host callbacks with subnormals flushed to zero; the JAX
    # launcher's interpreter runs in the default environment, as torch's does. sigmoid(-88)
    # and a row of 1e-40 are subnormal on the way to normal or subnormal results.
    cases = [("silu_mul", np.full((2, 16), -88.0, np.float32), np.ones((2, 16), np.float32)),
             ("rms_norm", np.full((2, 8), 1e-40, np.float32), np.ones(8, np.float32)),
             ("linear", np.full((2, 32), 1e-40, np.float32), np.ones((32, 16), np.float32))]
    from mamba_align.backends.jax import bridge
    if bridge._LIBM is None and not torch.cuda.is_available():
        pytest.skip("the JAX callback's environment is set through glibc only")
    ref = make_backend("reference")
    for op, a, b in cases:
        got = [make_backend(name).dense(op, a, b) for name in ("torch", "jax")]
        assert got[0].tobytes() == got[1].tobytes(), op
        if not torch.cuda.is_available():  # the interpreter: IEEE floats
            want = ref.dense(op, a, b)
            assert (got[1] != 0).all(), op
            np.testing.assert_allclose(got[1], want, rtol=1e-5, atol=0)

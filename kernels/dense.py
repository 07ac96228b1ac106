"""Batch-invariant dense operations for models served on the library's kernels: a linear
projection, RMSNorm (plain and gated) and the SiLU-gated product of an MLP; the references
are in :mod:`mamba_align.core.dense_ref`.

A row's result never depends on the other rows of the launch or on the framework that
launched it: tiles are constants (never chosen from the batch), sums run in fp32 in a fixed
order (the K loop of a projection in ``BLOCK_K`` steps; a norm's row in one tile), a
projection multiplies in fp32 with ``input_precision="ieee"`` (no TF32; bf16 / fp16
inputs are widened first, which is exact, and which Triton's interpreter needs), and the
kernels are compiled alike from torch and JAX (:func:`same_binary_jit`). Rows of a
projection go in tiles of ``BLOCK_M``: a row's sum is the same in any tile position, so
padding rows change nothing.
"""

from __future__ import annotations

import functools
from typing import Optional

import triton
import triton.language as tl

from .jit import same_binary_jit
from .plan import (FLOAT_DTYPES, ArraySpec, LaunchPlan, Op, Output, Static, cdiv, check_array,
                   fp32_value, next_pow2)

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 32  # projection tiles: fixed (batch invariance)
MAX_NORM_DIM = 8192  # a norm's row is one tile


@same_binary_jit
def linear_kernel(
    x_ptr,  # [M, K]
    weight_ptr,  # [K, N]
    num_rows,  # M
    num_cols,  # N
    depth,  # K
    x_stride,
    w_stride,
    y_ptr,  # [M, N]
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    tiles_n = tl.cdiv(num_cols, BLOCK_N)
    m = (pid // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    n = (pid % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    kk = tl.arange(0, BLOCK_K).to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, depth, BLOCK_K):  # in order: the same sum for every row
        k = k0 + kk
        a = tl.load(x_ptr + m[:, None] * x_stride + k[None, :],
                    mask=(m[:, None] < num_rows) & (k[None, :] < depth), other=0)
        b = tl.load(weight_ptr + k[:, None] * w_stride + n[None, :],
                    mask=(k[:, None] < depth) & (n[None, :] < num_cols), other=0)
        # fp32 products of the inputs (exact for bf16 / fp16), fp32 sums: IEEE, no TF32
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    tl.store(y_ptr + m[:, None] * num_cols + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(m[:, None] < num_rows) & (n[None, :] < num_cols))


@triton.jit
def _rms_norm(x_ptr, z_ptr, weight_ptr, dim, x_stride, z_stride, eps, y_ptr,
              BLOCK_D: tl.constexpr, GATED: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    mask = d < dim
    x = tl.load(x_ptr + row * x_stride + d, mask=mask, other=0).to(tl.float32)
    w = tl.load(weight_ptr + d, mask=mask, other=0).to(tl.float32)
    # (dim * 1.0: a dim of 1 reaches the kernel as a constant, not a tensor)
    inv = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(tl.sum(x * x, axis=0), dim * 1.0) + eps))
    y = x * inv * w
    if GATED:  # Qwen3-Next's gated norm: norm(x) * weight * silu(z)
        z = tl.load(z_ptr + row * z_stride + d, mask=mask, other=0).to(tl.float32)
        y = y * (z * tl.sigmoid(z))
    tl.store(y_ptr + row * dim + d, y.to(y_ptr.dtype.element_ty), mask=mask)


# one kernel per op, its parameters named as the op's arrays (the launch ABI)
@same_binary_jit
def rms_norm_kernel(
    x_ptr,  # [M, D]
    weight_ptr,  # [D]
    dim,
    x_stride,
    eps,
    y_ptr,  # [M, D]
    BLOCK_D: tl.constexpr,
):
    _rms_norm(x_ptr, x_ptr, weight_ptr, dim, x_stride, x_stride, eps, y_ptr, BLOCK_D, False)


@same_binary_jit
def rms_norm_gated_kernel(
    x_ptr,  # [M, D]
    z_ptr,  # [M, D]
    weight_ptr,  # [D]
    dim,
    x_stride,
    z_stride,
    eps,
    y_ptr,  # [M, D]
    BLOCK_D: tl.constexpr,
):
    _rms_norm(x_ptr, z_ptr, weight_ptr, dim, x_stride, z_stride, eps, y_ptr, BLOCK_D, True)


@same_binary_jit
def silu_mul_kernel(
    gate_ptr,  # [M, D]
    up_ptr,  # [M, D]
    dim,
    num_tiles,  # tiles of BLOCK_D per row
    gate_stride,
    up_stride,
    y_ptr,  # [M, D]
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    row = pid // num_tiles
    d = (pid % num_tiles) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = d < dim
    g = tl.load(gate_ptr + row * gate_stride + d, mask=mask, other=0).to(tl.float32)
    u = tl.load(up_ptr + row * up_stride + d, mask=mask, other=0).to(tl.float32)
    tl.store(y_ptr + row * dim + d, (g * tl.sigmoid(g) * u).to(y_ptr.dtype.element_ty),
             mask=mask)


SILU_BLOCK = 1024


def _check_rows(name: str, x: ArraySpec) -> ArraySpec:
    return check_array(name, x, (None, None), FLOAT_DTYPES)


@functools.lru_cache(maxsize=256, typed=True)
def plan_linear(x: ArraySpec, weight: ArraySpec) -> LaunchPlan:
    _check_rows("x", x)
    M, K = x.shape
    check_array("weight", weight, (K, None), FLOAT_DTYPES)
    if weight.dtype != x.dtype:
        raise TypeError(f"weight must have x's dtype {x.dtype}, got {weight.dtype}")
    N = weight.shape[1]
    return LaunchPlan(
        kernel=linear_kernel,
        grid=(max(1, cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)),),
        inputs=("x", "weight"),
        scalars=(("num_rows", M), ("num_cols", N), ("depth", K), ("x_stride", x.strides[0]),
                 ("w_stride", weight.strides[0])),
        outputs=("y",),
        out_specs={"y": Output((M, N), x.dtype)},
        constexprs={"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K},
        skip=M == 0 or N == 0,
    )


def _plan_norm(x: ArraySpec, z: Optional[ArraySpec], weight: ArraySpec, eps: float,
               gated: bool) -> LaunchPlan:
    """The plan of :data:`RMS_NORM` (``z`` None) or :data:`RMS_NORM_GATED`."""
    _check_rows("x", x)
    M, D = x.shape
    if not 1 <= D <= MAX_NORM_DIM:
        raise ValueError(f"a norm's rows must have 1 to {MAX_NORM_DIM} elements, got {D}")
    if gated:
        check_array("z", z, (M, D), FLOAT_DTYPES)
    check_array("weight", weight, (D,), FLOAT_DTYPES)
    if (isinstance(eps, bool) or not isinstance(eps, float)
            or not 0 < fp32_value(eps) < float("inf")):
        raise ValueError(f"eps must be a float > 0 that fp32 holds, got {eps!r}")
    scalars = ((("dim", D), ("x_stride", x.strides[0]))
               + ((("z_stride", z.strides[0]),) if gated else ()) + (("eps", eps),))
    return LaunchPlan(
        kernel=rms_norm_gated_kernel if gated else rms_norm_kernel,
        grid=(max(1, M),),
        inputs=("x", "z", "weight") if gated else ("x", "weight"),
        scalars=scalars,
        outputs=("y",),
        out_specs={"y": Output((M, D), x.dtype)},
        constexprs={"BLOCK_D": next_pow2(D)},
        num_warps=4 if D <= 2048 else 8,
        skip=M == 0,
    )


@functools.lru_cache(maxsize=256, typed=True)
def plan_rms_norm(x: ArraySpec, weight: ArraySpec, *, eps: float) -> LaunchPlan:
    return _plan_norm(x, None, weight, eps, gated=False)


@functools.lru_cache(maxsize=256, typed=True)
def plan_rms_norm_gated(x: ArraySpec, z: ArraySpec, weight: ArraySpec, *,
                        eps: float) -> LaunchPlan:
    return _plan_norm(x, z, weight, eps, gated=True)


@functools.lru_cache(maxsize=256, typed=True)
def plan_silu_mul(gate: ArraySpec, up: ArraySpec) -> LaunchPlan:
    _check_rows("gate", gate)
    M, D = gate.shape
    check_array("up", up, (M, D), FLOAT_DTYPES)
    block = min(SILU_BLOCK, next_pow2(max(D, 16)))
    tiles = cdiv(D, block)
    return LaunchPlan(
        kernel=silu_mul_kernel,
        grid=(max(1, M * tiles),),
        inputs=("gate", "up"),
        scalars=(("dim", D), ("num_tiles", tiles), ("gate_stride", gate.strides[0]),
                 ("up_stride", up.strides[0])),
        outputs=("y",),
        out_specs={"y": Output((M, D), gate.dtype)},
        constexprs={"BLOCK_D": block},
        skip=M == 0 or D == 0,
    )


_EPS = (Static("eps", float, 1e-6),)

LINEAR = Op(
    name="linear", arrays=("x", "weight"), statics=(), plan=plan_linear, mutates=(),
    returns=("y",),
    doc="A projection ``y = x @ weight``: ``x [M, K]`` and ``weight [K, N]`` of one float "
        "dtype (fp32 / fp16 / bf16), ``y [M, N]`` in that dtype; IEEE fp32 products summed "
        "in fp32 over ``K`` in a fixed order.\n",
)

RMS_NORM = Op(
    name="rms_norm", arrays=("x", "weight"), statics=_EPS, plan=plan_rms_norm, mutates=(),
    returns=("y",),
    doc="RMSNorm of every row: ``y = x / sqrt(mean(x^2) + eps) * weight``; ``x [M, D]``, "
        "``weight [D]`` (fp32 / fp16 / bf16, each its own), ``y [M, D]`` in ``x``'s dtype, fp32 "
        "inside.\n",
)

RMS_NORM_GATED = Op(
    name="rms_norm_gated", arrays=("x", "z", "weight"), statics=_EPS,
    plan=plan_rms_norm_gated, mutates=(), returns=("y",),
    doc="Gated RMSNorm (Qwen3-Next): ``y = rms_norm(x) * weight * silu(z)``; ``x``, ``z`` "
        "``[M, D]``, ``weight [D]``, ``y [M, D]`` in ``x``'s dtype, fp32 inside.\n",
)

SILU_MUL = Op(
    name="silu_mul", arrays=("gate", "up"), statics=(), plan=plan_silu_mul, mutates=(),
    returns=("y",),
    doc="An MLP's gated product ``y = silu(gate) * up``: ``[M, D]`` each, ``y`` in "
        "``gate``'s dtype, fp32 inside.\n",
)

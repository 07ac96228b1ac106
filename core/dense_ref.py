"""Float64 references of the dense operations (:mod:`mamba_align.kernels.dense`): a linear
projection, RMSNorm (plain and gated, Qwen3-Next style) and the SiLU-gated product of an
MLP. Each takes arrays of any float dtype and returns float64.
"""

from __future__ import annotations

from typing import Optional

import numpy as np


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def linear_ref(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """``x @ weight``: ``x [M, K]``, ``weight [K, N]`` -> ``[M, N]``."""
    return _f64(x) @ _f64(weight)


def silu(x: np.ndarray) -> np.ndarray:
    """``x * sigmoid(x)``."""
    x = _f64(x)
    return x / (1 + np.exp(-x))


def rms_norm_ref(x: np.ndarray, weight: np.ndarray, eps: float = 1e-6,
                 z: Optional[np.ndarray] = None) -> np.ndarray:
    """RMSNorm over the last axis: ``x / sqrt(mean(x^2) + eps) * weight``; with a gate ``z``
    (same shape as ``x``) also ``* silu(z)``. ``x [M, D]``, ``weight [D]``."""
    x = _f64(x)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * _f64(weight)
    return y if z is None else y * silu(z)


def silu_mul_ref(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """``silu(gate) * up`` (an MLP's gated product), elementwise."""
    return silu(gate) * _f64(up)

"""Inputs of the gated delta rule's tests (test_gdn.py, test_gdn_chunked.py): random
arrays for a launch of ``T`` tokens, the head-size cases both run, and their comparison."""

from __future__ import annotations

import numpy as np

L, NB = 2, 12  # layers and blocks of the state pool

CASES = [  # H, HV, K, V, layout, fused, l2norm, scale
    (1, 1, 16, 16, "VK", False, False, 0.0),
    (2, 4, 12, 20, "VK", True, True, 0.0),  # GVA, odd sizes (masking), in-kernel gates
    (1, 2, 8, 40, "KV", False, True, 0.5),  # [K, V] states, two value tiles
]


def gdn_inputs(rng, T, H, HV, K, V, dtype=np.float32, pool_dtype=np.float32, layout="VK",
               fused=False, g_range=(0.01, 1.0)):
    """``(pool [L, NB, HV, ...], q, k, v, gates)`` for ``T`` tokens: the gates as ``g``
    (``-g`` drawn from ``g_range``) and ``beta``, or with ``fused`` as ``a``, ``b``,
    ``A_log``, ``dt_bias``."""
    q, k = (rng.normal(size=(T, H, K)).astype(dtype) for _ in range(2))
    v = rng.normal(size=(T, HV, V)).astype(dtype)
    state = (HV, K, V) if layout == "KV" else (HV, V, K)
    pool = (0.5 * rng.normal(size=(L, NB) + state)).astype(pool_dtype)
    if fused:
        gates = {"a": rng.normal(size=(T, HV)), "b": rng.normal(size=(T, HV)),
                 "A_log": rng.normal(size=HV), "dt_bias": rng.normal(size=HV)}
    else:
        gates = {"g": -rng.uniform(*g_range, (T, HV)), "beta": rng.uniform(0, 1, (T, HV))}
    return pool, q, k, v, {n: x.astype(dtype) for n, x in gates.items()}


def close(a, b, tol):
    """``a`` within ``tol`` of ``b`` relatively, and absolutely near zero."""
    np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol)


def chunked_plan(T, rows, H, HV, K, V, layout="VK"):
    """The chunked plan of fp32 arrays for ``T`` tokens over ``rows`` rows (statics fixed)."""
    from mamba_align.kernels import ArraySpec, plan_gated_delta_rule
    spec, f32, ids = ArraySpec.row_major, "float32", ArraySpec.row_major((rows,), "int64")
    state = (V, K) if layout == "VK" else (K, V)
    return plan_gated_delta_rule(spec((L, NB, HV) + state, f32), spec((2,), "int32"),
                                 spec((T, H, K), f32), spec((T, H, K), f32),
                                 spec((T, HV, V), f32), spec((T, HV), f32), spec((T, HV), f32),
                                 spec((rows + 1,), "int64"), ids, spec((rows, 3), "int64"), ids,
                                 layer=1, scale=0.0, use_qk_l2norm=False, layout=layout,
                                 algorithm="chunked")

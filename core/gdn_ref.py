"""Float64 reference of the gated delta rule with separate read and write blocks
(docs/semantics.md §4, "Gated delta rule"): what :mod:`mamba_align.kernels.gdn` computes,
token by token, in plain NumPy.

Rows are variable-length (``cu_seqlens``); each has a read block (its initial state, -1:
zero), write blocks ``[1 + S]`` and is a spec row (the state after token ``j + 1`` goes to
write block ``j``) or not (the final state to write block 0). A row the kernel cannot trust
(a block it uses outside ``[-1, NB)``, a spec row of more than ``1 + S`` tokens) is a faulty
row: ``o = 0``, nothing written, its fault bits returned. A row whose own ``cu_seqlens``
entries run backwards or leave ``[0, T_total]`` is faulty too (``BAD_CU_SEQLENS``; its
``o`` is not written: its tokens are unknown). A row's read block must not be another row's
write block (the kernels do not order rows). Outputs on tokens that two rows share
(possible only when a row is ``BAD_CU_SEQLENS``) are unspecified; here the last good
row's win.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from .faults import recurrent_faults, seqlen_faults

LAYOUTS = ("VK", "KV")  # the state of one value head: [V, K] (K-last) or [K, V]


def softplus(x: np.ndarray) -> np.ndarray:
    """``log(1 + exp(x))``, and ``x`` itself above 20 (as the kernels do)."""
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def gates(A_log: np.ndarray, a: np.ndarray, dt_bias: np.ndarray,
          b: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The in-kernel gates (Qwen3-Next): ``g = -exp(A_log) * softplus(a + dt_bias)``,
    ``beta = sigmoid(b)``; ``A_log``, ``dt_bias`` ``[HV]``, ``a``, ``b`` ``[T, HV]``;
    float64 ``[T, HV]`` each."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    g = -np.exp(A_log.astype(np.float64)) * softplus(a64 + dt_bias.astype(np.float64))
    return g, 1 / (1 + np.exp(-b64))


def gated_delta_rule_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, pool: np.ndarray,
                         cu_seqlens: np.ndarray, read_block: np.ndarray,
                         write_blocks: np.ndarray, is_spec: np.ndarray, *,
                         g: Optional[np.ndarray] = None, beta: Optional[np.ndarray] = None,
                         A_log: Optional[np.ndarray] = None, a: Optional[np.ndarray] = None,
                         dt_bias: Optional[np.ndarray] = None, b: Optional[np.ndarray] = None,
                         scale: Optional[float] = None, use_qk_l2norm: bool = False,
                         layout: str = "VK") -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One gated-delta-rule launch.

    ``q``, ``k``: ``[T_total, H, K]``; ``v``: ``[T_total, HV, V]`` (``HV % H == 0``); gates
    either ``g`` (log decay) and ``beta``, ``[T_total, HV]`` each, or ``A_log``, ``dt_bias``
    ``[HV]`` and ``a``, ``b`` ``[T_total, HV]`` (:func:`gates`); ``pool``: one layer's state
    pool ``[NB, HV, V, K]`` (``layout="VK"``) or ``[NB, HV, K, V]`` (``"KV"``);
    ``cu_seqlens`` int ``[N + 1]``; ``read_block`` int ``[N]``; ``write_blocks`` int
    ``[N, 1 + S]`` (-1: no write); ``is_spec`` ``[N]``. Returns ``(o, new_pool, fault)``:
    ``o`` ``[T_total, HV, V]`` in ``q``'s dtype, the pool with every good row's states
    written (cast to the pool's dtype), the fault bits per row (int64 ``[N]``)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if (g is None) != (beta is None) or (g is None) == (A_log is None):
        raise ValueError("give the gates either as g and beta or as A_log, a, dt_bias and b")
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    if HV % H:
        raise ValueError(f"value heads HV={HV} must be a multiple of qk heads H={H}")
    if g is None:
        g, beta = gates(A_log, a, dt_bias, b)
    g, beta = np.asarray(g, np.float64), np.asarray(beta, np.float64)
    scale = K ** -0.5 if scale is None else float(scale)
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    if use_qk_l2norm:
        q64 = q64 / np.sqrt((q64 * q64).sum(-1, keepdims=True) + 1e-6)
        k64 = k64 / np.sqrt((k64 * k64).sum(-1, keepdims=True) + 1e-6)
    q64 = q64 * scale
    vk = pool if layout == "VK" else np.swapaxes(pool, 2, 3)  # [NB, HV, V, K] view
    cu = np.asarray(cu_seqlens, np.int64)
    read_block, write_blocks = np.asarray(read_block, np.int64), np.asarray(write_blocks, np.int64)
    is_spec = np.asarray(is_spec).astype(bool)
    num_spec = write_blocks.shape[1] - 1
    fault = (recurrent_faults(vk.shape[0], num_spec, np.diff(cu), read_block, write_blocks, is_spec)
             | seqlen_faults(cu, T))
    initial = vk.astype(np.float64)  # every row reads before any row writes
    out = pool.copy()
    out_vk = out if layout == "VK" else np.swapaxes(out, 2, 3)
    o = np.zeros((T, HV, V), np.float64)
    group = HV // H
    for r in range(len(cu) - 1):
        t0, t1 = int(cu[r]), int(cu[r + 1])
        if fault[r] or t1 <= t0:
            continue
        rb = int(read_block[r])
        h = initial[rb].copy() if rb >= 0 else np.zeros((HV, V, K))
        for t in range(t0, t1):
            kt, qt = k64[t, np.arange(HV) // group], q64[t, np.arange(HV) // group]  # [HV, K]
            h = h * np.exp(g[t])[:, None, None]
            u = beta[t][:, None] * (v64[t] - np.einsum("hvk,hk->hv", h, kt))
            h = h + u[:, :, None] * kt[:, None, :]
            o[t] = np.einsum("hvk,hk->hv", h, qt)
            j = t - t0
            if is_spec[r] and write_blocks[r, j] >= 0:
                out_vk[int(write_blocks[r, j])] = h.astype(out.dtype)
        if not is_spec[r] and write_blocks[r, 0] >= 0:
            out_vk[int(write_blocks[r, 0])] = h.astype(out.dtype)
    return o.astype(q.dtype), out, fault

"""Float64 reference of Mamba2's selective state update with separate read and write blocks
(docs/semantics.md §4, "Mamba2 selective state update"): what
:mod:`mamba_align.kernels.selective_state` computes, token by token, in plain NumPy.

Rows, read and write blocks, spec and non-spec rows and faulty rows follow the gated delta
rule's rules (:mod:`mamba_align.core.gdn_ref`): a faulty row gets ``y = 0`` and writes
nothing, a ``BAD_CU_SEQLENS`` row's ``y`` is not written, a row's read block must not be
another row's write block.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

from .faults import recurrent_faults, seqlen_faults
from .gdn_ref import softplus


def selective_state_update_ref(x: np.ndarray, dt: np.ndarray, A: np.ndarray, B: np.ndarray,
                               C: np.ndarray, D: np.ndarray, dt_bias: np.ndarray,
                               pool: np.ndarray, cu_seqlens: np.ndarray,
                               read_block: np.ndarray, write_blocks: np.ndarray,
                               is_spec: np.ndarray, *, dt_softplus: bool = True
                               ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One selective-state-update launch.

    ``x``: ``[T_total, H, P]`` (heads, head dim); ``dt``: ``[T_total, H]``; ``A``, ``D``,
    ``dt_bias``: ``[H]``; ``B``, ``C``: ``[T_total, G, N]`` (groups, state size; ``H % G ==
    0``, head ``h`` uses group ``h // (H / G)``); ``pool``: one layer's state pool ``[NB, H,
    P, N]``; ``cu_seqlens`` int ``[N_rows + 1]``; ``read_block`` int ``[N_rows]``;
    ``write_blocks`` int ``[N_rows, 1 + S]`` (-1: no write); ``is_spec`` ``[N_rows]``.

    Per token and head: ``d = dt + dt_bias`` (then ``softplus(d)``, linear above 20, when
    ``dt_softplus``); ``h = h * exp(d * A) + (d * x) ⊗ B``; ``y = h @ C + D * x``.

    Returns ``(y, new_pool, fault)``: ``y`` ``[T_total, H, P]`` in ``x``'s dtype, the pool
    with every good row's states written (cast to the pool's dtype), the fault bits per
    row (int64 ``[N_rows]``)."""
    T, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    if H % G:
        raise ValueError(f"heads H={H} must be a multiple of groups G={G}")
    d = dt.astype(np.float64) + dt_bias.astype(np.float64)
    if dt_softplus:
        d = softplus(d)
    x64, B64, C64 = (a.astype(np.float64) for a in (x, B, C))
    A64, D64 = A.astype(np.float64), D.astype(np.float64)
    group = np.arange(H) // (H // G)
    cu = np.asarray(cu_seqlens, np.int64)
    read_block, write_blocks = np.asarray(read_block, np.int64), np.asarray(write_blocks, np.int64)
    is_spec = np.asarray(is_spec).astype(bool)
    fault = (recurrent_faults(pool.shape[0], write_blocks.shape[1] - 1, np.diff(cu), read_block,
                              write_blocks, is_spec) | seqlen_faults(cu, T))
    initial = pool.astype(np.float64)  # every row reads before any row writes
    out = pool.copy()
    y = np.zeros((T, H, P), np.float64)
    for r in range(len(cu) - 1):
        t0, t1 = int(cu[r]), int(cu[r + 1])
        if fault[r] or t1 <= t0:
            continue
        rb = int(read_block[r])
        h = initial[rb].copy() if rb >= 0 else np.zeros((H, P, N))
        for t in range(t0, t1):
            bt, ct = B64[t, group], C64[t, group]  # [H, N]
            h = (h * np.exp(d[t] * A64)[:, None, None]
                 + (d[t][:, None] * x64[t])[:, :, None] * bt[:, None, :])
            y[t] = np.einsum("hpn,hn->hp", h, ct) + D64[:, None] * x64[t]
            j = t - t0
            if is_spec[r] and write_blocks[r, j] >= 0:
                out[int(write_blocks[r, j])] = h.astype(out.dtype)
        if not is_spec[r] and write_blocks[r, 0] >= 0:
            out[int(write_blocks[r, 0])] = h.astype(out.dtype)
    return y.astype(x.dtype), out, fault

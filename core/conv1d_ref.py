"""Float64 reference of the causal conv1d update with separate read and write blocks
(docs/semantics.md §4, "Causal conv1d update"): what :mod:`mamba_align.kernels.conv1d`
computes, row by row, in plain NumPy.

Rows are variable-length (``cu_seqlens``); each has a read block and an offset into it
(the history it starts from), a write block for its new window, and is a spec row (every
token a candidate) or not (one candidate, at the end). A row the kernel cannot trust (a
block outside ``[-1, NB)``, an offset outside ``[0, W-K+1]`` where it reads, a spec row
longer than ``W-K+2`` tokens) is a faulty row: it gets ``y = 0``, writes nothing, and its
fault bits come back in ``fault``. A row whose own ``cu_seqlens`` entries run backwards or
leave ``[0, T_total]`` is faulty too (``BAD_CU_SEQLENS``; its ``y`` is not written: its
tokens are unknown). A row's read block must not be another row's write block (the
kernels do not order rows). Outputs on tokens that two rows share (possible only when a
row is ``BAD_CU_SEQLENS``) are unspecified; here the last good row's win.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from .faults import Fault, seqlen_faults

ACTIVATIONS = ("none", "silu")


def conv_faults(num_blocks: int, width: int, kernel_size: int, seq_len: np.ndarray,
                read_block: np.ndarray, read_offset: np.ndarray, write_block: np.ndarray,
                is_spec: np.ndarray) -> np.ndarray:
    """Fault bits per row (int64 ``[rows]``, 0 = a good row) of a conv1d update launch over
    pools of ``num_blocks`` blocks of ``width`` rows, conv kernel ``kernel_size``."""
    rb, off, wb = (np.asarray(a, np.int64) for a in (read_block, read_offset, write_block))
    spec = np.asarray(is_spec).astype(bool)
    seq_len = np.asarray(seq_len, np.int64)
    bad_block = ((rb < -1) | (rb >= num_blocks)) | ((wb < -1) | (wb >= num_blocks))
    bad_offset = (rb >= 0) & ((off < 0) | (off > width - kernel_size + 1))
    too_long = spec & (seq_len > width - kernel_size + 2)
    return (np.where(bad_block, int(Fault.BAD_BLOCK), 0)
            | np.where(bad_offset, int(Fault.BAD_OFFSET), 0)
            | np.where(too_long, int(Fault.BAD_QUERY_LEN), 0)).astype(np.int64)


def causal_conv1d_update_ref(x: np.ndarray, weight: np.ndarray, bias: Optional[np.ndarray],
                             pool: np.ndarray, cu_seqlens: np.ndarray, read_block: np.ndarray,
                             read_offset: np.ndarray, write_block: np.ndarray,
                             is_spec: np.ndarray, *, activation: str = "silu",
                             layout: str = "SD") -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One conv1d update launch.

    ``x``: ``[T_total, D]`` (any float dtype); ``weight``: ``[D, K]``; ``bias``: ``[D]`` or
    None; ``pool``: one layer's conv pool, ``[NB, W, D]`` (``layout="SD"``) or ``[NB, D,
    W]`` (``"DS"``), ``W = K - 1 + S``; ``cu_seqlens``: int ``[N + 1]``; per row (int
    ``[N]``): ``read_block`` (-1: zero history), ``read_offset`` (``conv_read_bias``),
    ``write_block`` (-1: no write), ``is_spec``. Returns ``(y, new_pool, fault)``: ``y``
    ``[T_total, D]`` in ``x``'s dtype, the pool with every good row's window written (cast
    to the pool's dtype; rows past ``K - 2 + c`` of a written window keep their content),
    and the fault bits per row (int64 ``[N]``)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if layout not in ("SD", "DS"):
        raise ValueError(f"layout must be 'SD' or 'DS', got {layout!r}")
    sd = pool if layout == "SD" else np.swapaxes(pool, 1, 2)  # [NB, W, D] view
    num_blocks, width, dim = sd.shape
    dim_w, ksize = weight.shape
    if dim_w != dim or x.shape[1] != dim:
        raise ValueError(f"x {x.shape}, weight {weight.shape} and pool {pool.shape} disagree on D")
    cu = np.asarray(cu_seqlens, np.int64)
    read_block, read_offset, write_block = (np.asarray(a, np.int64)
                                            for a in (read_block, read_offset, write_block))
    is_spec = np.asarray(is_spec).astype(bool)
    fault = conv_faults(num_blocks, width, ksize, np.diff(cu), read_block, read_offset,
                        write_block, is_spec) | seqlen_faults(cu, x.shape[0])
    w = weight.astype(np.float64)
    cb = np.zeros(dim) if bias is None else bias.astype(np.float64)
    y = np.zeros(x.shape, np.float64)
    initial = sd.astype(np.float64)  # every row reads before any row writes
    out = pool.copy()
    out_sd = out if layout == "SD" else np.swapaxes(out, 1, 2)
    for r in range(len(cu) - 1):
        t0, t1 = int(cu[r]), int(cu[r + 1])
        n = t1 - t0
        if fault[r] or n <= 0:
            continue
        rb, off = int(read_block[r]), int(read_offset[r])
        hist = initial[rb, off:off + ksize - 1] if rb >= 0 else np.zeros((ksize - 1, dim))
        full = np.concatenate([hist, x[t0:t1].astype(np.float64)])  # [K - 1 + T, D]
        for t in range(n):
            acc = cb + (w.T * full[t:t + ksize]).sum(axis=0)
            y[t0 + t] = acc / (1 + np.exp(-acc)) if activation == "silu" else acc
        wb = int(write_block[r])
        if wb >= 0:
            c = n if is_spec[r] else 1
            out_sd[wb, :ksize - 2 + c] = full[n - c + 1:n - c + 1 + ksize - 2 + c].astype(out.dtype)
    return y.astype(x.dtype), out, fault

"""Random pools and copy plans, and element-by-element oracles of the copy rules
(docs/semantics.md §2 ``copy_block``), shared by the copy tests and the test backends."""

from __future__ import annotations

import numpy as np

from mamba_align.core import CopyPlan


def random_pool(rng, shape, dtype):
    """Random bits (NaN payloads included): equality must be on bytes, not on values."""
    itemsize = np.dtype(dtype).itemsize
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape).copy()


def same_bytes(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def copy_plan(tsrc, csrc, dst, bias) -> CopyPlan:
    return CopyPlan(*(np.array(x, dtype=np.int64) for x in (tsrc, csrc, dst, bias)))


def random_copy_plan(rng, rows: int, nb: int, max_bias: int) -> CopyPlan:
    """Rows with distinct destinations: plain copies (at least one, so that a plan always
    moves data), self-copies / in-place shifts, sources < 0 and skipped (-1) rows."""
    blocks = rng.permutation(np.arange(1, nb))
    dst = blocks[:rows].copy()
    spare = blocks[rows:]
    kind = rng.integers(0, 4, rows)  # 0 copy, 1 in place, 2 src -1, 3 skipped row
    kind[rng.integers(rows)] = 0
    tsrc = np.where(kind == 1, dst, rng.choice(spare, rows))
    csrc = np.where(kind == 1, dst, rng.choice(spare, rows))
    tsrc[kind >= 2] = -1
    csrc[kind >= 2] = -1
    dst[kind == 3] = -1
    return copy_plan(tsrc, csrc, dst, rng.integers(0, max_bias + 1, rows))


def loop_temporal(pool, p: CopyPlan):
    """docs/semantics.md §2, block by block: ``pool[:, dst] = pool[:, tsrc]``."""
    out, before = pool.copy(), pool.copy()
    for r in range(len(p.dst)):
        if p.tsrc[r] >= 0 and p.dst[r] >= 0:
            out[:, p.dst[r]] = before[:, p.tsrc[r]]
    return out


def loop_conv(pool, p: CopyPlan, layout: str):
    """docs/semantics.md §2, element by element, reading the source as it was before."""
    out, before = pool.copy(), pool.copy()
    w = pool.shape[2] if layout == "SD" else pool.shape[3]
    for r in range(len(p.dst)):
        if p.csrc[r] < 0 or p.dst[r] < 0:
            continue
        for i in range(w - p.bias[r]):
            if layout == "SD":
                out[:, p.dst[r], i] = before[:, p.csrc[r], i + p.bias[r]]
            else:
                out[:, p.dst[r], :, i] = before[:, p.csrc[r], :, i + p.bias[r]]
    return out

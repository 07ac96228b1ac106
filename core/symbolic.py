"""A symbolic state model: pools whose entries are *labels of token prefixes*.

Instead of numbers, every state holds an integer label naming the exact token prefix it
summarises (label 0 = the empty prefix, i.e. the zero state). The symbolic forward pass
follows docs/semantics.md §4 to the row: it reads the initial temporal state and the conv history
from the resolved read blocks, extends the labels token by token, and writes candidates and
the new conv window to the write blocks. Copies run through the real reference
(:mod:`.copy_ref`) on these label pools. A wrong read block, a lost snapshot or a bad copy
therefore shows up as a wrong label, which :mod:`.simulate` compares against the labels of
the true token prefixes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np

from .config import CacheConfig, ConvSpec, TemporalSpec
from .resolve import KernelBlocks

#: Value of a pool entry never written.
UNWRITTEN = -1
#: Labels are int32: the same dtype in NumPy, torch and JAX (no x64 needed).
LABEL_DTYPE = "int32"


class Labels:
    """Interns prefixes: ``extend(parent, token)`` returns the same label for the same pair."""

    def __init__(self) -> None:
        self._ids: Dict[Tuple[int, int], int] = {}

    def extend(self, parent: int, token: int) -> int:
        return self._ids.setdefault((int(parent), int(token)), len(self._ids) + 1)

    def chain(self, tokens: Sequence[int], start: int = 0) -> List[int]:
        """Labels after each token, starting from label ``start``."""
        out, label = [], start
        for t in tokens:
            label = self.extend(label, t)
            out.append(label)
        return out


def symbolic_config(config: CacheConfig) -> CacheConfig:
    """The same ``B``, ``S`` and state kinds with one layer, ``D = 1`` and one-element
    temporal blocks: each conv row and each temporal state is one label (int32)."""
    states = {
        name: ConvSpec(spec.kernel_size, 1, spec.layout, LABEL_DTYPE)
        if isinstance(spec, ConvSpec)
        else TemporalSpec((1,), LABEL_DTYPE)
        for name, spec in config.states.items()
    }
    return CacheConfig(config.block_size, config.num_spec, 1, states)


def symbolic_pools(config: CacheConfig, num_blocks: int) -> Dict[str, np.ndarray]:
    """int32 label pools for ``symbolic_config(config)``, filled with :data:`UNWRITTEN`."""
    sym = symbolic_config(config)
    return {
        name: np.full(sym.pool_shape(name, num_blocks), UNWRITTEN, np.int32)
        for name in sym.states
    }


def conv_rows(pool: np.ndarray, layout: str, block: int) -> np.ndarray:
    """The ``W`` row labels of one conv block (a view)."""
    return pool[0, block, :, 0] if layout == "SD" else pool[0, block, 0, :]


@dataclass(frozen=True)
class RowReads:
    """What one row's forward pass read: temporal label per pool, conv history per pool."""

    temporal: Dict[str, int]
    conv: Dict[str, Tuple[int, ...]]


def symbolic_forward(
    pools: Mapping[str, np.ndarray],
    config: CacheConfig,
    blocks: KernelBlocks,
    tokens: Sequence[Sequence[int]],
    prefix_labels: Sequence[int],
    is_spec: np.ndarray,
    labels: Labels,
) -> List[RowReads]:
    """Run docs/semantics.md §4 on label pools for every row.

    ``tokens[b]`` are row ``b``'s input tokens (``T`` of them); ``prefix_labels[b]`` labels
    the true prefix before them. The conv inputs ``x`` are labelled from that prefix and the
    tokens (they come from other layers, not from this state); the temporal states chain
    from the label actually read. Each row reads everything before writing anything.
    Returns the reads per row.
    """
    reads: List[RowReads] = []
    for b, toks in enumerate(tokens):
        t_read, c_read, c_off = (int(blocks.temporal_read[b]), int(blocks.conv_read[b]),
                                 int(blocks.conv_read_bias[b]))
        r = RowReads({}, {})
        reads.append(r)
        if not toks:
            continue
        # Read phase: the temporal label and the conv history per pool.
        for name, spec in config.states.items():
            pool = pools[name]
            if isinstance(spec, TemporalSpec):
                r.temporal[name] = 0 if t_read < 0 else int(pool[0, t_read, 0])
            else:
                k = spec.kernel_size
                hist = (np.zeros(k - 1, np.int64) if c_read < 0
                        else conv_rows(pool, spec.layout, c_read)[c_off : c_off + k - 1].copy())
                r.conv[name] = tuple(int(x) for x in hist)
        xs = labels.chain(toks, start=int(prefix_labels[b]))  # conv inputs
        t = len(toks)
        cands = t if is_spec[b] else 1
        # Write phase.
        for name, spec in config.states.items():
            pool = pools[name]
            if isinstance(spec, TemporalSpec):
                states = labels.chain(toks, start=r.temporal[name])  # after each token
                outs = states if is_spec[b] else states[-1:]
                for j, lab in enumerate(outs):
                    dst = int(blocks.temporal_write[b, j])
                    if dst >= 0:
                        pool[0, dst, 0] = lab
            else:
                dst = int(blocks.conv_write[b])
                if dst < 0:
                    continue
                k = spec.kernel_size
                full = list(r.conv[name]) + xs
                new = full[t - cands + 1 : t - cands + 1 + k - 2 + cands]
                conv_rows(pool, spec.layout, dst)[: len(new)] = new
    return reads

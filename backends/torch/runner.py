"""The per-step integration a PyTorch serving runner needs: device-resident bookkeeping and
the launches of one step, with no host synchronisation (CUDA-graph capturable).

Typical step::

    runner.add_requests(new_slots, new_num_computed)      # admissions / prefix hits
    slots = runner.preprocess(pools, idx_mapping, query_len, is_spec, block_table)
    ... conv / recurrent kernels read slots.temporal_read etc. and write the window ...
    cache_col = runner.postprocess(pools, idx_mapping, query_len, is_spec, num_sampled,
                                   block_table)           # after sampling
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from ...core.config import CacheConfig
from ...core.slots import check_mode
from . import ops  # noqa: F401  (registers torch.ops.mamba_align)
from .checks import pool_tensor


@dataclass(frozen=True)
class TorchSlots:
    """Resolved kernel slots for one step (int64 tensors on the device); see
    :class:`mamba_align.core.KernelSlots`. ``src_col``/``src_off``/``state_idx`` are the
    preprocess outputs per row."""

    temporal_read: torch.Tensor  # [rows]
    conv_read: torch.Tensor  # [rows]
    conv_read_off: torch.Tensor  # [rows]
    temporal_write: torch.Tensor  # [rows, 1 + S]
    conv_write: torch.Tensor  # [rows]
    src_col: torch.Tensor
    src_off: torch.Tensor
    state_idx: torch.Tensor


class StateRunner:
    """Device bookkeeping for ``num_slots`` request slots and the step launches.

    ``mode`` is ``"pre-copy"`` (copy the state into the new running block before the
    forward) or ``"copy-free"`` (kernels read crossing rows from the old column).
    ``index_dtype`` is the dtype of the per-slot arrays (int32 or int64).
    """

    def __init__(self, config: CacheConfig, num_slots: int, device, mode: str = "pre-copy",
                 index_dtype: torch.dtype = torch.int32) -> None:
        if not isinstance(config, CacheConfig):
            raise TypeError(f"config must be a CacheConfig, got {type(config).__name__}")
        check_mode(mode)
        if index_dtype not in (torch.int32, torch.int64):
            raise TypeError(f"index_dtype must be torch.int32 or torch.int64, got {index_dtype}")
        if not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots must be an int >= 1, got {num_slots!r}")
        self.config = config
        self.mode = mode
        self.state_idx = torch.full((num_slots,), -1, dtype=index_dtype, device=device)
        self.device = self.state_idx.device  # resolved: "cuda" -> cuda:0
        self.acc = torch.ones(num_slots, dtype=index_dtype, device=self.device)
        self.num_computed = torch.zeros(num_slots, dtype=index_dtype, device=self.device)
        self.kinds = config.copy_kinds()

    def check_pools(self, pools: Mapping[str, torch.Tensor]) -> None:
        """Pools must cover ``config.states`` with ``[L, NB, *block_shape]`` on our device."""
        for name, spec in self.config.states.items():
            if name not in pools:
                raise KeyError(f"pools has no entry {name!r}")
            pool = pools[name]
            pool_tensor(f"pools[{name!r}]", pool, spec.block_shape(self.config.num_spec))
            if pool.shape[0] != self.config.num_layers:
                raise ValueError(f"pools[{name!r}] has {pool.shape[0]} layers, config says "
                                 f"{self.config.num_layers}")
            if pool.device != self.device:
                raise ValueError(f"pools[{name!r}] is on {pool.device}, expected {self.device}")

    def add_requests(self, slots: torch.Tensor, num_computed: torch.Tensor) -> None:
        """Seed request slots (``[n]`` int) with their computed tokens (0 = fresh, a
        multiple of ``B`` after a prefix-cache hit)."""
        ops.call("add_requests_", self.state_idx, self.acc, self.num_computed, slots,
                                            num_computed, self.config.block_size)

    def preprocess(self, pools: Mapping[str, torch.Tensor], idx_mapping: torch.Tensor,
                   query_len: torch.Tensor, is_spec: torch.Tensor,
                   block_table: torch.Tensor) -> TorchSlots:
        """Bookkeeping, the pre-copy (pre-copy mode) and slot resolution for one step."""
        self.check_pools(pools)
        cfg = self.config
        (src_col, src_off, new_col, tsrc, csrc, dst, shift,
         t_read, c_read, c_off, t_write, c_write) = ops.call(
            "preprocess_resolve_", self.state_idx, self.acc, self.num_computed, idx_mapping,
            query_len, is_spec, block_table, cfg.block_size, cfg.num_spec,
            self.mode == "copy-free")
        if self.mode == "pre-copy":
            ops.copy_block_plan_(pools, self.kinds, tsrc, csrc, dst, shift)
        return TorchSlots(t_read, c_read, c_off, t_write, c_write, src_col, src_off, new_col)

    def postprocess(self, pools: Mapping[str, torch.Tensor], idx_mapping: torch.Tensor,
                    query_len: torch.Tensor, is_spec: torch.Tensor, num_sampled: torch.Tensor,
                    block_table: torch.Tensor) -> torch.Tensor:
        """Accept ``num_sampled`` ([rows]) and save boundary snapshots. Returns int64
        ``[rows]``: the column whose block may enter the prefix cache, -1 if none."""
        self.check_pools(pools)
        cache_col, tsrc, csrc, dst, shift = ops.call(
            "postprocess_", 
            self.state_idx, self.acc, self.num_computed, idx_mapping, query_len, is_spec,
            num_sampled, block_table, self.config.block_size)
        ops.copy_block_plan_(pools, self.kinds, tsrc, csrc, dst, shift)
        return cache_col

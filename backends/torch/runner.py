"""The per-step integration a PyTorch serving runner needs: device-resident bookkeeping and
the launches of one step, with no host synchronisation (CUDA-graph capturable).

Typical step::

    runner.add_requests(new_slots, new_num_computed)      # admissions / prefix hits
    blocks = runner.preprocess(pools, idx_mapping, query_len, is_spec, block_table)
    ... conv / recurrent kernels read blocks.temporal_read etc. and write the window ...
    cache_col = runner.postprocess(pools, idx_mapping, query_len, is_spec, num_sampled,
                                   block_table)           # after sampling
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Union

import torch

from ...core.checks import index_dtype as index_dtype_name
from ...core.checks import instance, positive_int
from ...core.config import CacheConfig
from ...core.faults import CHECKED, decode_errors, faulty_slots, new_errors, raise_errors
from ...core.resolve import Mode, check_mode
from ... import kernels as K
from . import ops


@dataclass(frozen=True)
class TorchBlocks:
    """The blocks the recurrent kernels read and write in one step (int64 tensors on the
    device; see :class:`mamba_align.core.KernelBlocks`), and the rows' preprocess results
    ``src_col`` / ``src_bias`` / ``run_col``."""

    temporal_read: torch.Tensor  # [rows]
    conv_read: torch.Tensor  # [rows]
    conv_read_bias: torch.Tensor  # [rows]
    temporal_write: torch.Tensor  # [rows, 1 + S]
    conv_write: torch.Tensor  # [rows]
    src_col: torch.Tensor  # [rows]
    src_bias: torch.Tensor  # [rows]
    run_col: torch.Tensor  # [rows]


_FIELDS = ("temporal_read", "conv_read", "conv_read_bias", "temporal_write", "conv_write",
           "src_col", "src_bias", "run_col")


class StateRunner:
    """Device bookkeeping for ``num_slots`` request slots and the step launches.

    ``mode`` is :class:`~mamba_align.core.Mode` ``PRE_COPY`` / ``"pre-copy"`` (copy the
    state into the new running block before the forward) or ``COPY_FREE`` /
    ``"copy-free"`` (kernels read crossing rows from the old column). ``index_dtype`` is
    the dtype of the per-slot arrays (int32 or int64). ``validate=True`` is the checked
    mode: every step method first runs its bookkeeping kernel on copies of the per-slot
    arrays, reads the faults back (one synchronisation) and raises ``ValueError`` with
    their messages before anything changes; meant for development and tests, not for
    CUDA graphs.

    ``pools`` (every step method) maps each state name of ``config`` to its ``[L, NB,
    *block_shape]`` tensor of the spec's dtype on the runner's device; other entries are
    ignored. They are checked before anything is launched.

    Bad values in the step's arrays do not raise (that would synchronise): the kernels
    serve a row they cannot trust as a skipped row, leave its slot faulty until
    :meth:`add_requests` seeds it again, and record the fault in :attr:`error_flag`, a
    sticky int32 ``[2]`` device buffer that :meth:`errors` reads (docs/semantics.md §1).
    """

    def __init__(self, config: CacheConfig, num_slots: int, device,
                 mode: Union[Mode, str] = Mode.PRE_COPY,
                 index_dtype: torch.dtype = torch.int32, validate: bool = False) -> None:
        instance("config", config, CacheConfig)
        instance("validate", validate, bool)
        self.validate = validate
        self.mode = check_mode(mode)
        if not isinstance(index_dtype, torch.dtype):
            raise TypeError(f"index_dtype must be a torch.dtype, got {index_dtype!r}")
        index_dtype_name("index_dtype", ops.dtype_name(index_dtype))
        positive_int("num_slots", num_slots)
        self.config = config
        self.state_idx = torch.full((num_slots,), -1, dtype=index_dtype, device=device)
        self.device = self.state_idx.device  # resolved: "cuda" -> cuda:0
        self.acc = torch.ones(num_slots, dtype=index_dtype, device=self.device)
        self.num_computed = torch.zeros(num_slots, dtype=index_dtype, device=self.device)
        self.error_flag = torch.from_numpy(new_errors()).to(self.device)
        self.kinds = config.copy_kinds()

    def errors(self) -> List[str]:
        """The faults recorded since the last :meth:`clear_errors` (synchronises), as the
        messages of :func:`mamba_align.core.decode_errors`; ``[]`` when none."""
        return decode_errors(self.error_flag.cpu().numpy())

    def raise_errors(self) -> None:
        """Raise ``ValueError`` naming every recorded fault (synchronises)."""
        raise_errors(self.error_flag.cpu().numpy())

    def faulty_slots(self) -> List[int]:
        """:func:`mamba_align.core.faulty_slots` of this runner's slots (synchronises;
        between steps)."""
        return faulty_slots(self.acc.cpu().numpy())

    def clear_errors(self) -> None:
        """Clear the error flag (in place: a captured CUDA graph keeps using it)."""
        self.error_flag.copy_(torch.from_numpy(new_errors()))

    def check_pools(self, pools: Mapping[str, torch.Tensor]) -> int:
        """The config's check of every pool (``CacheConfig.check_pools``), and the device;
        returns the blocks every pool has."""
        return self.config.check_pools(pools, self._describe)

    def _describe(self, label: str, pool) -> tuple:
        if not isinstance(pool, torch.Tensor):
            raise TypeError(f"{label} must be a torch.Tensor, got {type(pool).__name__}")
        if pool.device != self.device:
            raise ValueError(f"{label} is on {pool.device}, expected {self.device}")
        ops.refuse_grad(pool, label, "the step")  # (the copies would, after the bookkeeping)
        return tuple(pool.shape), ops.dtype_name(pool.dtype)

    def _plan_copies(self, pools: Mapping[str, torch.Tensor], idx_mapping: torch.Tensor) -> None:
        """The step's pool copies planned before its bookkeeping launches (in both modes:
        a copy-free step copies in ``postprocess``): a pool they cannot take (strides,
        grid) raises with the state unchanged. Under ``torch.compile`` the copies' fake
        implementations plan them at trace time instead, before any kernel runs."""
        if torch.compiler.is_compiling():
            return
        rows = K.check_array("idx_mapping", ops.spec("idx_mapping", idx_mapping), (None,)).shape[0]
        K.plan_pool_copies(self.kinds, {n: ops.spec(n, pools[n]) for n in self.kinds}, rows,
                           ops.spec("errors", self.error_flag))

    def _bookkeeping(self, launch):
        """``launch(state_idx, acc, num_computed, errors)`` on the runner's arrays; in the
        checked mode first on copies, raising before anything changes if it faults."""
        if self.validate:
            trial = [t.clone() for t in (self.state_idx, self.acc, self.num_computed)]
            flag = torch.from_numpy(new_errors()).to(self.device)
            launch(*trial, flag)
            raise_errors(flag.cpu().numpy(), CHECKED)
        return launch(self.state_idx, self.acc, self.num_computed, self.error_flag)

    def add_requests(self, slots: torch.Tensor, num_computed: torch.Tensor) -> None:
        """Seed request slots (``[n]`` int, -1 = skip) with their computed tokens (0 =
        fresh, a multiple of ``B`` after a prefix-cache hit; after a fault, 0 or a cached
        boundary: docs/semantics.md §1)."""
        self._bookkeeping(lambda *state: ops.add_requests_(
            *state, slots, num_computed, block_size=self.config.block_size))

    def preprocess(self, pools: Mapping[str, torch.Tensor], idx_mapping: torch.Tensor,
                   query_len: torch.Tensor, is_spec: torch.Tensor,
                   block_table: torch.Tensor) -> TorchBlocks:
        """Bookkeeping, the pre-copy (pre-copy mode) and the resolution of the kernels'
        blocks for one step. ``idx_mapping`` / ``query_len`` int ``[rows]``, ``is_spec``
        bool/int ``[rows]``, ``block_table`` int ``[>= num_slots, max_cols]``."""
        num_blocks = self.check_pools(pools)
        self._plan_copies(pools, idx_mapping)
        cfg = self.config
        out = self._bookkeeping(lambda *state: ops.preprocess_resolve_(
            *state, idx_mapping, query_len, is_spec, block_table, block_size=cfg.block_size,
            num_spec=cfg.num_spec, num_blocks=num_blocks, mode=self.mode.value))
        if self.mode is Mode.PRE_COPY:
            ops.copy_pools_(pools, self.kinds, out, self.error_flag)
        return TorchBlocks(*(out[f] for f in _FIELDS))

    def postprocess(self, pools: Mapping[str, torch.Tensor], idx_mapping: torch.Tensor,
                    query_len: torch.Tensor, is_spec: torch.Tensor, num_sampled: torch.Tensor,
                    block_table: torch.Tensor) -> torch.Tensor:
        """Accept ``num_sampled`` (int ``[rows]``) and save boundary snapshots (other
        arguments as in :meth:`preprocess`: the same ``query_len`` and ``is_spec`` it was
        given, which are not checked, docs/semantics.md §1). Returns int64 ``[rows]``: the
        column whose block may enter the prefix cache, -1 if none."""
        num_blocks = self.check_pools(pools)
        self._plan_copies(pools, idx_mapping)
        cfg = self.config
        out = self._bookkeeping(lambda *state: ops.postprocess_(
            *state, idx_mapping, query_len, is_spec, num_sampled, block_table,
            block_size=cfg.block_size, num_spec=cfg.num_spec, num_blocks=num_blocks))
        ops.copy_pools_(pools, self.kinds, out, self.error_flag)
        return out["cache_col"]

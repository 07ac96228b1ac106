"""Framework-agnostic core of mamba_align: configuration, per-step bookkeeping, slot
resolution, the copy reference, a reference scheduler and a symbolic simulation.

Imports NumPy only; this is the reference every kernel and backend is tested against.
"""

from .block_pool import BlockPool
from .bookkeeping import (
    PostprocessPlan,
    PreprocessPlan,
    SlotState,
    accept,
    add_requests,
    check_slots,
    init_slots,
    postprocess,
    preprocess,
    running_column,
)
from .faults import (NO_ROW, Fault, decode_errors, error_row, faulty_slots, flag_of,
                     new_errors, raise_errors)
from .screen import screen_add_requests, screen_postprocess, screen_preprocess
from .config import DTYPES, LAYOUTS, CacheConfig, ConvSpec, StateSpec, TemporalSpec
from .copy_ref import (
    CopyPlan,
    apply_conv_copy,
    apply_copy,
    apply_temporal_copy,
    copy_faults,
    copy_plan,
    postprocess_copy_plan,
    precopy_plan,
)
from .scheduler import Request, Scheduler, exact_drafter, random_drafter
from .step_batch import CachedBlock, StepBatch, StepResult, pad_batch
from .simulate import RowRecord, StepRecord, SymbolicRunner
from .resolve import MODES, KernelBlocks, Mode, check_mode, gather_columns, resolve_blocks, window_blocks
from .symbolic import Labels, symbolic_config, symbolic_forward, symbolic_pools

__all__ = [name for name in dir() if not name.startswith("_")]

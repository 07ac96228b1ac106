"""mamba_align: align-mode prefix caching of recurrent state (Mamba / Gated DeltaNet) in
hybrid LLMs, with one set of Triton kernels launched from PyTorch and from JAX.

This top-level module imports no framework: ``mamba_align.core`` is NumPy only; the
kernels and the torch / JAX backends live in ``mamba_align.kernels`` and
``mamba_align.backends``.
"""

from . import core
from .core import (
    CacheConfig,
    ConvSpec,
    Scheduler,
    SlotState,
    SymbolicRunner,
    TemporalSpec,
    accept,
    add_requests,
    init_slots,
    postprocess,
    preprocess,
    resolve_blocks,
)

__version__ = "0.1.0"

__all__ = [
    "core",
    "CacheConfig",
    "ConvSpec",
    "TemporalSpec",
    "SlotState",
    "init_slots",
    "add_requests",
    "preprocess",
    "accept",
    "postprocess",
    "resolve_blocks",
    "Scheduler",
    "SymbolicRunner",
    "__version__",
]

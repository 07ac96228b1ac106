"""JAX backend: the same Triton kernels and launch plans as the torch backend, launched
through jax-triton on the GPU and Triton's interpreter (via ``jax.pure_callback``) on the
CPU, with pure, jittable step functions over a pytree of per-slot bookkeeping."""

from . import ops
from .bridge import launch
from .runner import (JaxBlocks, SlotArrays, add_requests, clear_errors, errors, faulty_slots,
                     init_state, postprocess, preprocess)

__all__ = ["ops", "launch", "SlotArrays", "JaxBlocks", "init_state", "add_requests",
           "preprocess", "postprocess", "errors", "clear_errors", "faulty_slots"]

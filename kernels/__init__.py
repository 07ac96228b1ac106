"""Triton kernels and their launch plans. Imports triton only (never a framework).

Without a GPU the kernels run in Triton's interpreter: ``TRITON_INTERPRET=1`` is set here
before any ``@triton.jit`` function is defined, unless the caller already chose.
"""

import os
import shutil

if "TRITON_INTERPRET" not in os.environ and not (
    os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi")
):
    os.environ["TRITON_INTERPRET"] = "1"

from .plan import LaunchPlan, check_step_scalars, pool_scalars, table_scalars  # noqa: E402
from .bookkeeping import plan_add_requests, plan_postprocess, plan_preprocess  # noqa: E402
from .copy import plan_copy_conv, plan_copy_temporal, pool_align  # noqa: E402
from .resolve import plan_preprocess_resolve, plan_resolve  # noqa: E402

__all__ = [
    "LaunchPlan",
    "check_step_scalars",
    "pool_scalars",
    "table_scalars",
    "plan_add_requests",
    "plan_preprocess",
    "plan_postprocess",
    "plan_resolve",
    "plan_preprocess_resolve",
    "plan_copy_temporal",
    "plan_copy_conv",
    "pool_align",
]

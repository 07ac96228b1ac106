"""Triton kernels and their launch plans. Imports triton only (never a framework).

Without a GPU the kernels run in Triton's interpreter: ``TRITON_INTERPRET=1`` is set here
before any of the package's ``@triton.jit`` functions is defined, unless the caller already
chose (Triton's own helpers, built compiled if triton was imported first, are rebuilt
interpreted: kernels/interpret.py).
"""

import os
import shutil

if "TRITON_INTERPRET" not in os.environ and not (
    os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi")
):
    os.environ["TRITON_INTERPRET"] = "1"

from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

if os.environ.get("TRITON_INTERPRET") == "1":
    from .interpret import install as _install, reinterpret_helpers as _reinterpret

    _reinterpret()  # triton imported before the choice (by torch._dynamo, jax-triton, ...)
    _install()  # no redundant swaps; a NumPy 2.5-proof __index__; a row-invariant tl.dot;
    # bfloat16 rounded to nearest even

from .plan import (ArraySpec, LaunchPlan, Op, Output, Static, check_array,  # noqa: E402
                   check_pool, check_step_scalars, pool_scalars, table_scalars)
from .bookkeeping import (ADD_REQUESTS, POSTPROCESS, plan_add_requests,  # noqa: E402
                          plan_postprocess)
from .copy import (COPY_CONV, COPY_TEMPORAL, plan_copy_conv, plan_copy_temporal,  # noqa: E402
                   plan_pool_copies, pool_align, pool_copies)
from .resolve import PREPROCESS_RESOLVE, plan_preprocess_resolve  # noqa: E402
from .conv1d import CONV1D_UPDATE, plan_conv1d_update  # noqa: E402
from .gdn import (GATED_DELTA_RULE, GATED_DELTA_RULE_FUSED_GATES,  # noqa: E402
                  plan_gated_delta_rule, plan_gated_delta_rule_fused_gates)
from .selective_state import (SELECTIVE_STATE_UPDATE,  # noqa: E402
                              plan_selective_state_update)
from .dense import (LINEAR, RMS_NORM, RMS_NORM_GATED, SILU_MUL, plan_linear,  # noqa: E402
                    plan_rms_norm, plan_rms_norm_gated, plan_silu_mul)

def interpreted(kernel) -> bool:
    """Whether ``kernel`` runs in Triton's CPU interpreter (else compiled, CUDA only). A
    backend asks here rather than importing triton itself: the first triton import must
    come after the choice above."""
    return isinstance(kernel, InterpretedFunction)


#: Every operation both backends expose (one generic launcher each).
OPS = (ADD_REQUESTS, PREPROCESS_RESOLVE, POSTPROCESS, COPY_TEMPORAL, COPY_CONV, CONV1D_UPDATE,
       GATED_DELTA_RULE, GATED_DELTA_RULE_FUSED_GATES, SELECTIVE_STATE_UPDATE, LINEAR, RMS_NORM,
       RMS_NORM_GATED, SILU_MUL)


def clear_plan_caches() -> None:
    """Forget every op's cached plans: for code that changes a kernel module's tuning
    constant (a benchmark variant, a test) and must not reuse plans built before it."""
    for op in OPS:
        if hasattr(op.plan, "cache_clear"):
            op.plan.cache_clear()


__all__ = [
    "ArraySpec", "LaunchPlan", "Op", "Output", "Static", "OPS", "clear_plan_caches",
    "check_array", "check_pool", "check_step_scalars", "pool_scalars", "table_scalars",
    "ADD_REQUESTS", "PREPROCESS_RESOLVE", "POSTPROCESS", "COPY_TEMPORAL", "COPY_CONV",
    "CONV1D_UPDATE", "plan_conv1d_update", "GATED_DELTA_RULE", "GATED_DELTA_RULE_FUSED_GATES",
    "plan_gated_delta_rule", "plan_gated_delta_rule_fused_gates",
    "SELECTIVE_STATE_UPDATE", "plan_selective_state_update",
    "LINEAR", "RMS_NORM", "RMS_NORM_GATED", "SILU_MUL", "plan_linear", "plan_rms_norm",
    "plan_rms_norm_gated", "plan_silu_mul",
    "plan_add_requests", "plan_preprocess_resolve", "plan_postprocess",
    "plan_copy_temporal", "plan_copy_conv", "plan_pool_copies", "pool_align", "pool_copies",
    "interpreted",
]

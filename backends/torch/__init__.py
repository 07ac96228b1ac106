"""PyTorch backend: the kernels as functions on tensors and ``torch.ops.mamba_align.*``
custom ops, and a :class:`StateRunner` holding the device-resident bookkeeping of a serving
runner."""

from .ops import (add_requests_, conv1d_update_, copy_conv_, copy_pools_, copy_temporal_,
                  gated_delta_rule_, gated_delta_rule_fused_gates_, postprocess_,
                  preprocess_resolve_, selective_state_update_)
from .runner import StateRunner, TorchBlocks

__all__ = ["StateRunner", "TorchBlocks", "add_requests_", "preprocess_resolve_",
           "postprocess_", "copy_temporal_", "copy_conv_", "copy_pools_", "conv1d_update_",
           "gated_delta_rule_", "gated_delta_rule_fused_gates_", "selective_state_update_"]

"""PyTorch backend: the kernels as ``torch.ops.mamba_align.*`` custom ops and a
:class:`StateRunner` holding the device-resident bookkeeping of a serving runner."""

from .ops import add_requests_, copy_conv_, copy_temporal_, postprocess_, preprocess_, resolve
from .runner import StateRunner, TorchSlots

__all__ = ["StateRunner", "TorchSlots", "add_requests_", "preprocess_", "resolve",
           "postprocess_", "copy_temporal_", "copy_conv_"]

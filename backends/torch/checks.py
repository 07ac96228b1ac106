"""Validation of torch arguments: dtype, rank, shape, device and layout, never values
(reading values would synchronise with the GPU). The kernels instead skip out-of-range slot
and block ids, so they never write outside a pool or the bookkeeping arrays."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

INDEX_DTYPES = (torch.int32, torch.int64)
# Pools are copied as same-width integers: a copy is then a bit copy for any dtype.
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def index_tensor(
    name: str,
    t: torch.Tensor,
    device: torch.device,
    shape: Sequence[Optional[int]],
    dtypes=INDEX_DTYPES,
) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        names = "/".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype {names}, got {str(t.dtype).replace('torch.', '')}")
    if t.dim() != len(shape) or any(w is not None and g != w for g, w in zip(t.shape, shape)):
        want = "[" + ", ".join("*" if w is None else str(w) for w in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    if t.dim() == 1 and t.numel() > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous")
    if t.dim() == 2 and t.numel() and t.stride(1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1)")
    return t


def flag_tensor(name: str, t, rows: int, device: torch.device) -> torch.Tensor:
    """``is_spec``: a bool/int8/int32/int64 tensor ``[rows]`` (nonzero = true)."""
    return index_tensor(name, t, device, (rows,),
                        (torch.bool, torch.int8, torch.int32, torch.int64))


def pool_tensor(name: str, pool: torch.Tensor, block_shape: Sequence[int]) -> torch.Tensor:
    """Check ``[L, NB, *block_shape]`` with a contiguous inner block and layer / block
    strides that keep blocks apart; return it viewed as same-width integers."""
    if not isinstance(pool, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(pool).__name__}")
    if tuple(pool.shape[2:]) != tuple(block_shape) or pool.dim() != 2 + len(block_shape):
        raise ValueError(f"{name} must have shape [L, NB, {', '.join(map(str, block_shape))}], "
                         f"got {list(pool.shape)}")
    if pool.element_size() not in _BITS:
        raise TypeError(f"{name} has unsupported element size {pool.element_size()}")
    numel = 1
    for size, stride in zip(reversed(block_shape), reversed(pool.stride()[2:])):
        if size > 1 and stride != numel:
            raise ValueError(f"{name} must have a contiguous inner block, strides {pool.stride()}")
        numel *= size
    # (layer, block) -> offset must be one-to-one and blocks must not overlap: order the two
    # outer dims by stride; the inner must clear a block, the outer its whole inner span
    dims = sorted(((pool.stride(i), pool.shape[i]) for i in (0, 1) if pool.shape[i] > 1))
    span = numel
    for stride, size in dims:
        if stride < span:
            raise ValueError(f"{name} strides {pool.stride()[:2]} make blocks of {numel} "
                             "elements overlap")
        span = stride * size
    return pool.view(_BITS[pool.element_size()])


def same_device(*tensors: torch.Tensor) -> torch.device:
    dev = tensors[0].device
    for t in tensors[1:]:
        if t.device != dev:
            raise ValueError(f"all tensors must be on one device, got {dev} and {t.device}")
    return dev

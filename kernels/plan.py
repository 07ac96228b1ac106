"""The launch plan every backend maps its arrays onto.

A plan names the kernel's parameters in ABI order (input arrays, runtime scalars, output
arrays), carries the grid, the constexprs (always passed by keyword) and the warp count,
and says which outputs alias which inputs (in-place arrays are passed twice: the kernel
reads and writes them through the output pointer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Tuple

#: Grid axes 1 and 2 are limited to 65 535 programs; only axis 0 may grow with the batch.
MAX_GRID_YZ = 65_535
MAX_GRID_X = 2**31 - 1


@dataclass(frozen=True)
class LaunchPlan:
    kernel: Any  # the @triton.jit function
    grid: Tuple[int, ...]
    inputs: Tuple[str, ...]
    scalars: Tuple[str, ...]
    outputs: Tuple[str, ...]
    constexprs: Mapping[str, Any] = field(default_factory=dict)
    num_warps: int = 4
    aliases: Mapping[str, str] = field(default_factory=dict)  # output name -> input name

    def __post_init__(self) -> None:
        if not self.grid or self.grid[0] > MAX_GRID_X or any(g > MAX_GRID_YZ for g in self.grid[1:]):
            raise ValueError(f"grid {self.grid} exceeds the hardware limits")

    def args(self, arrays: Mapping[str, Any], scalars: Mapping[str, Any]) -> Tuple[Any, ...]:
        """Positional arguments in ABI order: ``arrays`` by name (an in-place output is the
        same object as its aliased input), then ``scalars``, then the outputs."""
        missing = [n for n in self.inputs + self.outputs if n not in arrays]
        missing += [n for n in self.scalars if n not in scalars]
        if missing:
            raise KeyError(f"launch of {self.name} is missing {missing}")
        return (
            tuple(arrays[n] for n in self.inputs)
            + tuple(scalars[n] for n in self.scalars)
            + tuple(arrays[n] for n in self.outputs)
        )

    @property
    def name(self) -> str:
        return getattr(self.kernel, "__name__", None) or getattr(
            getattr(self.kernel, "fn", None), "__name__", "kernel"
        )


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def check_step_scalars(block_size: int, num_spec: int = 0) -> None:
    """``block_size >= 1`` and ``num_spec >= 0``: static, so checked on the host."""
    for name, v, low in (("block_size", block_size, 1), ("num_spec", num_spec, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{name} must be an int >= {low}, got {v!r}")


def table_scalars(shape: Tuple[int, int], row_stride: int, num_slots: int) -> dict:
    """Kernel scalars of a block table ``[rows, max_cols]`` used with ``num_slots`` slots."""
    if shape[0] < num_slots:
        raise ValueError(f"block_table has {shape[0]} rows, fewer than the {num_slots} slots")
    return {"bt_stride": int(row_stride), "max_cols": int(shape[1]), "num_slots": int(num_slots)}


def pool_scalars(shape: Tuple[int, ...], strides: Tuple[int, ...], layout: str = "temporal") -> dict:
    """Kernel scalars of a pool ``[L, NB, *block]`` with element strides ``strides``:
    layers, layer / block strides, blocks, and ``block_numel`` (temporal) or ``width`` /
    ``dim`` (conv, ``layout`` "SD" = ``[W, D]`` or "DS" = ``[D, W]``)."""
    out = {"num_layers": int(shape[0]), "layer_stride": int(strides[0]),
           "block_stride": int(strides[1]), "num_blocks": int(shape[1])}
    if layout == "temporal":
        numel = 1
        for s in shape[2:]:
            numel *= int(s)
        out["block_numel"] = numel
    else:
        out["width"], out["dim"] = ((int(shape[2]), int(shape[3])) if layout == "SD"
                                    else (int(shape[3]), int(shape[2])))
    return out

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

"""The launch plan every backend maps its arrays onto, and the operations built on plans.

A backend describes its arrays as :class:`ArraySpec` (shape, dtype name, element
strides) and calls an :class:`Op`'s plan builder with them and the op's static options.
The builder validates everything that can be checked without reading values and returns a
:class:`LaunchPlan`: the kernel's parameters in ABI order (input arrays, runtime scalars
with their values, output arrays), the grid, constexprs and warp count, every output's
shape and dtype, which outputs alias which inputs (in-place arrays are passed twice: the
kernel reads and writes them through the output pointer), which inputs are reinterpreted
as same-width integers, and whether there is nothing to launch (an empty batch). An
operation of two launches states the first as the plan's ``before`` stage, whose outputs
are scratch arrays the second reads. A backend then needs one generic launcher and nothing
per operation.
"""

from __future__ import annotations

import inspect
import numbers
import re
import struct
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

#: Grid axes 1 and 2 are limited to 65 535 programs; only axis 0 may grow with the batch.
MAX_GRID_YZ = 65_535
MAX_GRID_X = 2**31 - 1

INDEX_DTYPES = ("int32", "int64")
FLAG_DTYPES = ("bool", "int8", "int32", "int64")
FLOAT_DTYPES = ("float32", "float16", "bfloat16")  # the recurrences' inputs

Scalar = Union[int, float]


@dataclass(frozen=True)
class ArraySpec:
    """What a plan needs to know of an array: its shape, dtype name (as NumPy, torch and
    JAX spell it: ``"float32"``, ``"bfloat16"``, ``"int64"``, ``"bool"``, ...) and strides
    in elements."""

    shape: Tuple[int, ...]
    dtype: str
    strides: Tuple[int, ...]

    def __post_init__(self) -> None:
        # tuples, so that plans can be cached on specs; the sizes are kept as given (never
        # int()): under torch.compile they may be symbolic, and int() would pin them
        object.__setattr__(self, "shape", tuple(self.shape))
        object.__setattr__(self, "strides", tuple(self.strides))
        object.__setattr__(self, "dtype", str(self.dtype))

    @classmethod
    def row_major(cls, shape: Sequence[int], dtype: str) -> "ArraySpec":
        """A contiguous row-major array (every JAX array)."""
        strides, acc = [], 1
        for size in reversed(shape):
            strides.append(acc)
            acc *= int(size)
        return cls(tuple(int(s) for s in shape), dtype, tuple(reversed(strides)))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class Output:
    """Shape and dtype name of an output the backend allocates."""

    shape: Tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class LaunchPlan:
    kernel: Any  # the @triton.jit function
    grid: Tuple[int, ...]
    inputs: Tuple[str, ...]
    scalars: Tuple[Tuple[str, Scalar], ...]  # (name, value) in parameter order
    outputs: Tuple[str, ...]
    out_specs: Mapping[str, Output] = field(default_factory=dict)  # every non-aliased output
    constexprs: Mapping[str, Any] = field(default_factory=dict)
    num_warps: int = 4
    aliases: Mapping[str, str] = field(default_factory=dict)  # output name -> input name
    views: Mapping[str, str] = field(default_factory=dict)  # input -> same-width dtype
    skip: bool = False  # nothing to compute: outputs allocated, in-place arrays untouched
    #: plans launched first, in order, on the same arrays; their outputs (scratch, never
    #: returned) join the arrays by name, as inputs of the later plans and of this one
    before: Tuple["LaunchPlan", ...] = ()

    def __post_init__(self) -> None:
        for f in ("out_specs", "constexprs", "aliases", "views"):  # plans are cached, shared
            object.__setattr__(self, f, MappingProxyType(dict(getattr(self, f))))
        object.__setattr__(self, "before", tuple(self.before))
        read = {n for p in self.before for n in p.inputs}
        scratch = [n for p in self.before for n in p.outputs]
        if (any(p.aliases or p.views or p.before or p.skip != self.skip for p in self.before)
                or len(set(scratch)) < len(scratch)
                or set(scratch) & (read | set(self.outputs))):
            raise ValueError(f"{self.name}: a before stage reads its inputs and writes scratch "
                             "of its own (names no stage reads and nothing else writes), and "
                             "runs when the plan does")
        if not self.grid or self.grid[0] > MAX_GRID_X or any(g > MAX_GRID_YZ for g in self.grid[1:]):
            raise ValueError(f"grid {self.grid} exceeds the hardware limits")
        missing = [n for n in self.outputs if n not in self.aliases and n not in self.out_specs]
        if missing:
            raise ValueError(f"{self.name}: outputs {missing} have neither a spec nor an alias")

    @property
    def scalar_values(self) -> Tuple[Scalar, ...]:
        return tuple(v for _, v in self.scalars)

    def args(self, arrays: Mapping[str, Any]) -> Tuple[Any, ...]:
        """Positional arguments in ABI order: ``arrays`` by name (an in-place output is the
        same object as its aliased input), then the scalars, then the outputs."""
        missing = [n for n in self.inputs + self.outputs if n not in arrays]
        if missing:
            raise KeyError(f"launch of {self.name} is missing {missing}")
        return (tuple(arrays[n] for n in self.inputs) + self.scalar_values
                + tuple(arrays[n] for n in self.outputs))

    @property
    def maxnreg(self) -> Optional[int]:
        """The kernel's register cap per thread (Triton's ``maxnreg`` option), if it has one:
        a property of the kernel, so that both launchers compile the same binary."""
        return getattr(self.kernel, "maxnreg", None)

    @property
    def launch_options(self) -> Dict[str, int]:
        """Triton's launch options of this plan: ``num_warps``, and ``maxnreg`` if set."""
        return {"num_warps": self.num_warps, **({"maxnreg": self.maxnreg} if self.maxnreg else {})}

    @property
    def returned(self) -> Tuple[str, ...]:
        """The outputs that are new arrays (not updated in place)."""
        return tuple(n for n in self.outputs if n not in self.aliases)

    @property
    def name(self) -> str:
        return getattr(self.kernel, "__name__", None) or getattr(
            getattr(self.kernel, "fn", None), "__name__", "kernel"
        )


@dataclass(frozen=True)
class Static:
    """A keyword-only static option of an :class:`Op` (part of the plan, not an array)."""

    name: str
    type: type  # int, bool, float or str
    default: Any = None  # None: required


@dataclass(frozen=True)
class Op:
    """One operation as both backends expose it.

    ``arrays`` are the array parameters in order, ``statics`` the keyword-only options;
    ``plan(**arrays_as_ArraySpec, **statics)`` validates and returns the
    :class:`LaunchPlan`. ``mutates`` names the arrays updated in place (torch mutates them;
    JAX returns them updated), ``returns`` the new outputs (``LaunchPlan.returned``).
    ``doc`` is the user-facing description (shapes, dtypes). ``skipped``: what a skipped
    (or faulty) row gets in each per-row output, for a backend that must withhold results.
    """

    name: str
    arrays: Tuple[str, ...]
    statics: Tuple[Static, ...]
    plan: Callable[..., LaunchPlan]
    mutates: Tuple[str, ...]
    returns: Tuple[str, ...]  # the plan's new (not in-place) outputs, in order
    doc: str
    skipped: Mapping[str, int] = field(default_factory=dict)

    @property
    def static_names(self) -> Tuple[str, ...]:
        return tuple(s.name for s in self.statics)

    def function(self, run: Callable[[dict, dict], Any], name: str, array_type: Any,
                 returns: Any, doc: str = "") -> Callable[..., Any]:
        """A backend's public function for this op: binds a call's arguments
        (:meth:`bind`) and hands ``(arrays, statics)`` to ``run``; named, signed and
        documented like the op."""
        def fn(*args, **kwargs):
            return run(*self.bind(args, kwargs, name))

        fn.__name__ = fn.__qualname__ = name
        fn.__signature__ = sig = self.signature(array_type, returns)
        # (typing.get_type_hints and IDEs read these, not the signature)
        fn.__annotations__ = {**{p.name: p.annotation for p in sig.parameters.values()},
                              "return": returns}
        fn.__doc__ = self.doc + doc
        return fn

    def signature(self, array_type: Any, returns: Any) -> inspect.Signature:
        """A backend function's signature: arrays positional-or-keyword (annotated
        ``array_type``), static options keyword-only."""
        P = inspect.Parameter
        return inspect.Signature(
            [P(n, P.POSITIONAL_OR_KEYWORD, annotation=array_type) for n in self.arrays]
            + [P(s.name, P.KEYWORD_ONLY, annotation=s.type,
                 default=P.empty if s.default is None else s.default) for s in self.statics],
            return_annotation=returns)

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any],
             name: Optional[str] = None) -> Tuple[dict, dict]:
        """A call's ``(arrays by name, static options)`` (the fast path: every array
        positional); errors name the function ``name`` (default: the op's)."""
        name = name or self.name
        if len(args) == len(self.arrays):
            return dict(zip(self.arrays, args)), self.static_values(kwargs, name)
        try:
            bound = self.signature(None, None).bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{name}(): {e}") from None
        arrays = {n: bound.arguments[n] for n in self.arrays if n in bound.arguments}
        rest = {k: v for k, v in bound.arguments.items() if k not in arrays}
        return arrays, self.static_values(rest, name)

    def static_values(self, given: Mapping[str, Any], name: Optional[str] = None) -> dict:
        """The static options with defaults filled in; unknown or missing ones raise (naming
        the function ``name``, default: the op's)."""
        name = name or self.name
        unknown = set(given) - {s.name for s in self.statics}
        if unknown & set(self.arrays):  # (every array given by position as well)
            raise TypeError(f"{name}() got multiple values for "
                            f"{', '.join(sorted(unknown & set(self.arrays)))}")
        if unknown:
            raise TypeError(f"{name}() got unexpected options {sorted(unknown)}")
        out = {}
        for s in self.statics:
            if s.name in given:
                v = out[s.name] = given[s.name]
                # a NumPy number (``for layer in np.arange(L)``), or an int for a float:
                # the Python number of the same value
                number = {int: numbers.Integral, float: numbers.Real}.get(s.type)
                # (under torch.compile pass Python numbers: dynamo sees NumPy ones as arrays)
                if number and isinstance(v, number) and not isinstance(v, bool) \
                        and type(v) is not s.type:
                    v = out[s.name] = s.type(v)
                if not isinstance(v, s.type) or (s.type is int and isinstance(v, bool)):
                    raise TypeError(f"{name}() option {s.name} must be {s.type.__name__}, "
                                    f"got {v!r}")
            elif s.default is not None:
                out[s.name] = s.default
            else:
                raise TypeError(f"{name}() missing the keyword option {s.name!r}")
        return out


# -- validation shared by every plan builder (never values: that would synchronise) ---------
def dtype_bits(dtype: str) -> int:
    """Bits per element of a dtype name (``bool`` counts 8)."""
    if dtype == "bool":
        return 8
    m = re.search(r"(\d+)", dtype)
    if not m:
        raise TypeError(f"unknown dtype {dtype!r}")
    return int(m.group(1))


def _fmt(shape: Sequence[Optional[int]]) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def check_array(name: str, spec: ArraySpec, shape: Sequence[Optional[int]],
                dtypes: Sequence[str] = INDEX_DTYPES) -> ArraySpec:
    """Dtype among ``dtypes``, rank and shape (``None`` = any size), unit last stride."""
    if not isinstance(spec, ArraySpec):
        raise TypeError(f"{name} must be an array, got {type(spec).__name__}")
    if spec.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {'/'.join(dtypes)}, got {spec.dtype}")
    if spec.ndim != len(shape) or any(w is not None and g != w for g, w in zip(spec.shape, shape)):
        raise ValueError(f"{name} must have shape {_fmt(shape)}, got {list(spec.shape)}")
    if spec.ndim and spec.shape[-1] > 1 and spec.numel and spec.strides[-1] != 1:
        what = "be contiguous" if spec.ndim == 1 else "have a contiguous last dimension"
        raise ValueError(f"{name} must {what} (stride 1), got strides {list(spec.strides)}")
    return spec


def check_pool(name: str, spec: ArraySpec, block_shape: Sequence[int]) -> ArraySpec:
    """``[L, NB, *block_shape]`` with a contiguous inner block, layer / block strides that
    keep blocks apart, and a numeric dtype of 1, 2, 4 or 8 bytes."""
    if not isinstance(spec, ArraySpec):
        raise TypeError(f"{name} must be an array, got {type(spec).__name__}")
    if spec.ndim != 2 + len(block_shape) or tuple(spec.shape[2:]) != tuple(block_shape):
        raise ValueError(f"{name} must have shape [L, NB, {', '.join(map(str, block_shape))}], "
                         f"got {list(spec.shape)}")
    if spec.dtype == "bool" or spec.dtype.startswith("complex") or \
            dtype_bits(spec.dtype) not in (8, 16, 32, 64):
        raise TypeError(f"{name} has unsupported dtype {spec.dtype} (a float or int dtype of "
                        "1, 2, 4 or 8 bytes)")
    if spec.numel == 0:
        return spec  # nothing to address (and torch gives empty tensors any strides)
    numel = 1
    for size, stride in zip(reversed(block_shape), reversed(spec.strides[2:])):
        if size > 1 and stride != numel:
            raise ValueError(f"{name} must have a contiguous inner block, strides "
                             f"{list(spec.strides)}")
        numel *= size
    # (layer, block) -> offset must be one-to-one and blocks must not overlap: order the two
    # outer dims by stride; the inner must clear a block, the outer its whole inner span
    dims = sorted((spec.strides[i], spec.shape[i]) for i in (0, 1) if spec.shape[i] > 1)
    span = numel
    for stride, size in dims:
        if stride < span:
            raise ValueError(f"{name} strides {list(spec.strides[:2])} make blocks of {numel} "
                             "elements overlap")
        span = stride * size
    return spec


def bits_dtype(dtype: str) -> str:
    """The same-width integer dtype a copy kernel sees a pool as (a copy is a bit copy)."""
    return f"int{dtype_bits(dtype)}"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def fp32_value(v: float) -> float:
    """``v`` (a number) rounded to fp32, what a kernel receives for a float scalar:
    ``+-inf`` out of its range, 0 below its smallest value."""
    try:
        return struct.unpack("=f", struct.pack("=f", float(v)))[0]
    except OverflowError:  # (an int too large for a float, or a float past fp32's range)
        return float("inf") if v > 0 else float("-inf")


def check_step_scalars(block_size: int, num_spec: int = 0, num_blocks: int = 1) -> None:
    """``block_size >= 1``, ``0 <= num_spec <= block_size - 1`` and ``num_blocks >= 1``:
    static, so checked on the host (a larger ``num_spec`` could advance a row two columns
    in one step, docs/semantics.md §1)."""
    for name, v, low in (("block_size", block_size, 1), ("num_spec", num_spec, 0),
                         ("num_blocks", num_blocks, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
    if num_spec > block_size - 1:
        raise ValueError(f"num_spec must be <= block_size - 1 = {block_size - 1}, got "
                         f"{num_spec}: a step could then advance a row two columns")


def table_scalars(block_table: ArraySpec, num_slots: int) -> Tuple[Tuple[str, int], ...]:
    """Checks ``block_table`` (int ``[rows >= num_slots, max_cols]``); its kernel scalars."""
    check_array("block_table", block_table, (None, None))
    if block_table.shape[0] < num_slots:
        raise ValueError(f"block_table has {block_table.shape[0]} rows, fewer than the "
                         f"{num_slots} slots")
    return (("bt_stride", block_table.strides[0]), ("max_cols", block_table.shape[1]))


def check_layer(layer: int, num_layers: int) -> int:
    """The layer of an ``[L, NB, ...]`` pool a recurrent kernel runs on: an int in
    ``[0, L)``."""
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < num_layers:
        raise ValueError(f"layer must be an int in [0, {num_layers}), got {layer!r}")
    return layer


def check_seqlens(cu_seqlens: "ArraySpec") -> int:
    """``cu_seqlens``: int ``[N + 1]``, the token offsets of ``N >= 0`` rows; returns
    ``N``. Its values are checked on the device (``BAD_CU_SEQLENS``)."""
    check_array("cu_seqlens", cu_seqlens, (None,))
    if cu_seqlens.shape[0] < 1:
        raise ValueError("cu_seqlens must have N + 1 entries (N >= 0 rows), got none")
    return cu_seqlens.shape[0] - 1


def pool_scalars(spec: ArraySpec, layout: str = "temporal") -> dict:
    """Kernel scalars of a pool ``[L, NB, *block]``: layers, layer / block strides, blocks,
    and ``block_numel`` (temporal) or ``width`` / ``dim`` (conv, ``layout`` "SD" =
    ``[W, D]`` or "DS" = ``[D, W]``)."""
    shape, strides = spec.shape, spec.strides
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


def largest_align(values, cap: int) -> int:
    """The largest power of two ``<= cap`` dividing every one of ``values``: an alignment
    in elements that a kernel may promise the compiler for offsets built from them."""
    align = cap
    while align > 1 and any(v % align for v in values):
        align //= 2
    return align


def io_align(a: ArraySpec, strides) -> int:
    """The alignment in elements, up to 16 bytes, of a row of ``a`` reached through
    ``strides`` (the launchers hand every array's data over 16-byte aligned)."""
    return largest_align(strides, 16 // {"float32": 4, "float16": 2, "bfloat16": 2}[a.dtype])

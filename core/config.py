"""Cache configuration: block size, speculative blocks and the state kinds of a layer.

A state pool of kind ``k`` is one array ``[L, NB, *block_shape]`` (layers x physical
blocks x block shape). Two kinds exist:

* :class:`ConvSpec` — the causal-conv window, ``W = K - 1 + S`` rows of width ``D``;
  row-major ``"SD"`` (``[W, D]``) or transposed ``"DS"`` (``[D, W]``).
* :class:`TemporalSpec` — the recurrent (SSM) state, any fixed block shape, e.g. the
  Gated DeltaNet state ``[HV, V, K]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Tuple, Union

from .checks import positive_int

#: Element types a pool may hold. Copies are bit copies, so any of them works everywhere;
#: the integer ones hold labels (the symbolic model of :mod:`.symbolic`), not states.
DTYPES = ("float32", "bfloat16", "float16")
LABEL_DTYPES = ("int32",)
LAYOUTS = ("SD", "DS")


#: What :meth:`CacheConfig.check_pools` returns without states: no pool bounds the block ids.
NO_POOLS = 2**31 - 1


def _check_dtype(owner: str, dtype: str) -> None:
    if dtype not in DTYPES + LABEL_DTYPES:
        raise ValueError(f"{owner}.dtype must be one of {DTYPES + LABEL_DTYPES}, got {dtype!r}")


@dataclass(frozen=True)
class ConvSpec:
    """Causal-conv state: kernel size ``K >= 2``, channel count ``D >= 1``, layout, dtype."""

    kernel_size: int
    dim: int
    layout: str = "SD"
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        # stored as Python ints (a NumPy integer is taken as its value: the ops' statics)
        object.__setattr__(self, "kernel_size",
                           positive_int("ConvSpec.kernel_size", self.kernel_size, minimum=2))
        object.__setattr__(self, "dim", positive_int("ConvSpec.dim", self.dim))
        if self.layout not in LAYOUTS:
            raise ValueError(f"ConvSpec.layout must be one of {LAYOUTS}, got {self.layout!r}")
        _check_dtype("ConvSpec", self.dtype)

    def width(self, num_spec: int) -> int:
        """Rows of the window: ``W = K - 1 + S``."""
        return self.kernel_size - 1 + num_spec

    def block_shape(self, num_spec: int) -> Tuple[int, ...]:
        """``(W, D)`` for SD, ``(D, W)`` for DS."""
        w = self.width(num_spec)
        return (w, self.dim) if self.layout == "SD" else (self.dim, w)


@dataclass(frozen=True)
class TemporalSpec:
    """Recurrent state with a fixed block shape (e.g. GDN ``(HV, V, K)``) and dtype."""

    shape: Tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not isinstance(self.shape, tuple) or not self.shape:
            raise TypeError(f"TemporalSpec.shape must be a non-empty tuple, got {self.shape!r}")
        object.__setattr__(self, "shape", tuple(positive_int(f"TemporalSpec.shape[{i}]", s)
                                                for i, s in enumerate(self.shape)))
        _check_dtype("TemporalSpec", self.dtype)

    def block_shape(self, num_spec: int) -> Tuple[int, ...]:
        """The block shape; independent of ``num_spec``."""
        return self.shape


StateSpec = Union[ConvSpec, TemporalSpec]


@dataclass(frozen=True)
class CacheConfig:
    """Block size ``B``, speculative blocks ``S`` (``0 <= S <= B-1``), layers and state kinds.

    ``states`` maps a pool name (e.g. ``"conv"``, ``"ssm"``) to its spec. With ``S >= B``
    one step could jump two columns, which the block allocator cannot support.
    """

    block_size: int
    num_spec: int = 0
    num_layers: int = 1
    states: Mapping[str, StateSpec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # stored as Python ints: a NumPy integer is taken as its value, as the ops take it
        for name, minimum in (("block_size", 1), ("num_spec", 0), ("num_layers", 1)):
            object.__setattr__(self, name, positive_int(f"CacheConfig.{name}",
                                                        getattr(self, name), minimum))
        if self.num_spec > self.block_size - 1:
            raise ValueError(
                f"CacheConfig.num_spec must be <= block_size - 1 = {self.block_size - 1}, "
                f"got {self.num_spec} (one step could jump two columns)"
            )
        if not isinstance(self.states, Mapping):
            raise TypeError("CacheConfig.states must map pool names to ConvSpec/TemporalSpec")
        for name, spec in self.states.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"CacheConfig.states keys must be non-empty str, got {name!r}")
            if not isinstance(spec, (ConvSpec, TemporalSpec)):
                raise TypeError(
                    f"CacheConfig.states[{name!r}] must be a ConvSpec or TemporalSpec, "
                    f"got {type(spec).__name__}"
                )

    def __hash__(self) -> int:
        # hashable, so a config can be a static argument of jax.jit; computed once, since
        # jit hashes its static arguments on every call
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.block_size, self.num_spec, self.num_layers,
                      tuple(sorted(self.states.items()))))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> Dict[str, Any]:
        # the cached hash stays behind: string hashes differ from process to process
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def copy_kinds(self) -> Dict[str, str]:
        """How each pool is copied: ``"temporal"`` (whole block) or the conv layout
        (``"SD"``/``"DS"``, shifted by the bias). Backends dispatch their copies on this."""
        return {name: spec.layout if isinstance(spec, ConvSpec) else "temporal"
                for name, spec in self.states.items()}

    @property
    def window(self) -> int:
        """Blocks in a request's window: ``1 + S``."""
        return 1 + self.num_spec

    def pool_shape(self, name: str, num_blocks: int) -> Tuple[int, ...]:
        """Shape ``(L, NB, *block_shape)`` of pool ``name`` with ``num_blocks`` blocks."""
        if name not in self.states:
            raise KeyError(f"no state named {name!r}; known: {sorted(self.states)}")
        positive_int("num_blocks", num_blocks)
        return (self.num_layers, num_blocks) + self.states[name].block_shape(self.num_spec)

    def check_pools(self, pools: Mapping[str, Any],
                    describe: Callable[[str, Any], Tuple[Tuple[int, ...], str]]) -> int:
        """Check pools against the config before any launch, for every backend.

        ``pools`` maps pool names to arrays; ``describe(label, array)`` returns an array's
        ``(shape, dtype name)`` or raises ``TypeError`` for what is not an array of its
        framework. Every name of ``states`` must be there with shape ``[num_layers, NB >= 1,
        *block_shape]`` (which also fixes the conv layout) and the spec's dtype. Entries
        that are not states are ignored: a caller may keep other arrays in the mapping.
        Returns the blocks every pool has (the smallest ``NB``; :data:`NO_POOLS` without
        states): block ids at or past it are faults on the device path."""
        if not isinstance(pools, Mapping):
            raise TypeError(f"pools must map state names to arrays, got {type(pools).__name__}")
        num_blocks = NO_POOLS
        for name, spec in self.states.items():
            if name not in pools:
                raise KeyError(f"pools has no entry {name!r} (config states: "
                               f"{sorted(self.states)})")
            shape, dtype = describe(f"pools[{name!r}]", pools[name])
            want = spec.block_shape(self.num_spec)
            shape = tuple(int(s) for s in shape)
            if len(shape) != 2 + len(want) or shape[2:] != want or shape[0] != self.num_layers \
                    or shape[1] < 1:
                layout = f" ({spec.layout})" if isinstance(spec, ConvSpec) else ""
                raise ValueError(f"pools[{name!r}] must be [L={self.num_layers}, NB, "
                                 f"{', '.join(map(str, want))}]{layout}, got {list(shape)}")
            if dtype != spec.dtype:
                raise TypeError(f"pools[{name!r}] has dtype {dtype}, the config's spec says "
                                f"{spec.dtype}")
            num_blocks = min(num_blocks, shape[1])
        return num_blocks

    def columns_needed(self, num_tokens: int) -> int:
        """Block-table columns a request with ``num_tokens`` tokens (drafts included) needs."""
        positive_int("num_tokens", num_tokens, minimum=0)
        return -(-num_tokens // self.block_size) + self.num_spec

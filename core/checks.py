"""Argument validation shared by the public core functions.

Every check raises ``TypeError`` (wrong kind or dtype) or ``ValueError`` (wrong shape or
range) with a message that names the argument and what was expected.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np


def positive_int(name: str, value: Any, minimum: int = 1) -> int:
    """Return ``value`` as ``int`` after checking it is an integer ``>= minimum``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def index_array(
    name: str,
    value: Any,
    *,
    ndim: int = 1,
    shape: Optional[Sequence[Optional[int]]] = None,
    low: Optional[int] = None,
    high: Optional[int] = None,
) -> np.ndarray:
    """Return ``value`` as a fresh int64 array after checking dtype, rank, shape and range.

    ``shape`` entries of ``None`` match any size; ``low``/``high`` bound every element
    (``low <= x < high``).
    """
    if isinstance(value, (list, tuple)):
        # No forced dtype: a list of floats or bools must fail the dtype check below
        # instead of being truncated / cast silently.
        try:
            value = np.asarray(value) if len(value) else np.zeros(0, np.int64)
        except ValueError as e:
            raise ValueError(f"{name} must be a rectangular integer array: {e}") from None
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{name} must be a NumPy integer array, got {type(value).__name__}")
    if value.dtype == np.bool_ or not np.issubdtype(value.dtype, np.integer):
        raise TypeError(f"{name} must have an integer dtype (int32/int64), got {value.dtype}")
    if value.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(value.shape)}")
    if shape is not None:
        for axis, (got, want) in enumerate(zip(value.shape, shape)):
            if want is not None and got != want:
                raise ValueError(
                    f"{name} must have shape {_fmt_shape(shape)}, got {tuple(value.shape)} "
                    f"(axis {axis})"
                )
    out = value.astype(np.int64, copy=True)
    if out.size:
        if low is not None and out.min() < low:
            bad = int(np.flatnonzero(out.reshape(-1) < low)[0])
            raise ValueError(
                f"{name} must be >= {low}; element {bad} is {int(out.reshape(-1)[bad])}"
            )
        if high is not None and out.max() >= high:
            bad = int(np.flatnonzero(out.reshape(-1) >= high)[0])
            raise ValueError(
                f"{name} must be < {high}; element {bad} is {int(out.reshape(-1)[bad])}"
            )
    return out


def bool_array(name: str, value: Any, length: int) -> np.ndarray:
    """Return ``value`` as a bool array of shape ``[length]``; a Python bool broadcasts."""
    if isinstance(value, (bool, np.bool_)):
        return np.full(length, bool(value))
    if isinstance(value, (list, tuple)):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{name} must be a bool or a NumPy bool array, got {type(value).__name__}")
    if value.dtype != np.bool_:
        raise TypeError(f"{name} must have dtype bool, got {value.dtype}")
    if value.shape != (length,):
        raise ValueError(f"{name} must have shape ({length},), got {tuple(value.shape)}")
    return value.copy()


INDEX_DTYPES = ("int32", "int64")


def index_dtype(name: str, dtype_name: str) -> str:
    """A runner's per-slot dtype must be int32 or int64 (by name, for every framework)."""
    if dtype_name not in INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {dtype_name}")
    return dtype_name


def instance(name: str, value: Any, cls: type) -> Any:
    """Return ``value`` after checking it is an instance of ``cls``."""
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be a {cls.__name__}, got {type(value).__name__}")
    return value


def optional_callable(name: str, value: Any) -> Any:
    """Return ``value`` after checking it is ``None`` or callable."""
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None, got {type(value).__name__}")
    return value


def hashable(name: str, value: Any) -> Any:
    """Return ``value`` after checking it can be a dict key."""
    try:
        hash(value)
    except TypeError:
        raise TypeError(f"{name} must be hashable, got {type(value).__name__}") from None
    return value


def token_ids(name: str, value: Any) -> tuple:
    """Return ``value`` (any iterable of int token ids) as a tuple of ``int``."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of int token ids, got {type(value).__name__}")
    try:
        items = tuple(value)
    except TypeError:
        raise TypeError(
            f"{name} must be a sequence of int token ids, got {type(value).__name__}"
        ) from None
    for i, t in enumerate(items):
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"{name}[{i}] must be an int token id, got {type(t).__name__}")
    return tuple(int(t) for t in items)


def unique_mapped(name: str, idx_mapping: np.ndarray) -> None:
    """Reject an ``idx_mapping`` that maps two batch rows to the same request slot."""
    mapped = idx_mapping[idx_mapping >= 0]
    if mapped.size != np.unique(mapped).size:
        values, counts = np.unique(mapped, return_counts=True)
        raise ValueError(f"{name} maps several batch rows to slot {int(values[counts > 1][0])}")


def _fmt_shape(shape: Sequence[Optional[int]]) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"

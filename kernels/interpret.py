"""One change to Triton's CPU interpreter, for the kernels' speed in it (CPU runs only).

The interpreter swaps ``triton.language``'s builtins for interpreted ones when a launch
starts and restores them when it ends. A call of a ``@triton.jit`` helper from inside a
kernel asks for the swap again although it is in place: that walks every member of
``triton.language`` (about 1 ms a call) and changes nothing, since the swapped members
are no longer builtins. It was 38 % of a served model step in the interpreter
(benchmarks/README.md). :func:`install` makes such a call skip the walk when every
``triton.language`` module the helper sees is already swapped; launches, and helpers that
see a module the launch did not swap, go through Triton's own code.
"""

from __future__ import annotations

import inspect

import triton.language as tl
from triton.runtime import interpreter as _interpreter


def _swapped(module) -> bool:
    return not tl.core.is_builtin(module.load)


def install() -> bool:
    """Make nested helper calls skip the redundant swap; ``False`` if this Triton's
    interpreter is not the one this was written for (nothing changed), or it is already
    installed."""
    original = getattr(_interpreter, "_patch_lang", None)
    scope = getattr(_interpreter, "_LangPatchScope", None)
    if original is None or scope is None or getattr(original, "skips_nested_swaps", False):
        return False

    langs_of = {}  # a function's triton.language modules (its globals hold the same ones)

    def patch_lang(fn):
        langs = langs_of.get(fn)
        if langs is None:
            langs = langs_of[fn] = [v for v in fn.__globals__.values()
                                    if inspect.ismodule(v) and v in (tl, tl.core)]
        if langs and all(_swapped(m) for m in langs):
            return scope()  # inside a launch: nothing to swap, nothing to restore
        return original(fn)

    patch_lang.skips_nested_swaps = True
    _interpreter._patch_lang = patch_lang
    return True

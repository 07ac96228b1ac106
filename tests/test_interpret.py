"""The one change the package makes to Triton's CPU interpreter (kernels/interpret.py): a
``@triton.jit`` helper called inside a launch skips re-swapping ``triton.language``, which
the launch has swapped already; anything the launch did not swap is still swapped by
Triton. That the kernels compute the same bits with it is the rest of the suite (every
kernel against its reference, in the interpreter)."""

import os
import types

import pytest
import triton.language as tl
from triton.runtime import interpreter

from mamba_align.kernels import rows
from mamba_align.kernels.interpret import install

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="the interpreter only (compiled kernels never use it)")


def test_installed_once_by_the_package():
    assert getattr(interpreter._patch_lang, "skips_nested_swaps", False)
    assert install() is False  # already in place: nothing changes


def test_a_nested_call_skips_only_what_the_launch_swapped():
    helper = rows.flag_row.fn  # a helper of the kernels: its module sees triton.language
    assert tl.core.is_builtin(tl.load)
    launch = interpreter._patch_lang(helper)  # as a launch does: the builtins swapped
    try:
        assert not tl.core.is_builtin(tl.load)
        nested = interpreter._patch_lang(helper)
        assert nested._changes == []  # nothing swapped again, nothing to restore
        # a helper that sees triton.language.core, which this launch did not swap
        other = types.FunctionType((lambda: None).__code__, {"core": tl.core})
        assert tl.core.is_builtin(tl.core.load)
        swapped = interpreter._patch_lang(other)
        assert not tl.core.is_builtin(tl.core.load)
        swapped.restore()
    finally:
        launch.restore()
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.core.load)

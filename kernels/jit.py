"""``same_binary_jit``: ``triton.jit`` for kernels whose floating-point results must not depend
on the launcher.

Triton picks a tensor's register layout from what it can prove about addresses, and a
reduction (``tl.sum``) adds in the order that layout gives. torch's launcher tells the
compiler which integer arguments are multiples of 16; jax-triton 0.3 tells it nothing
about integers (both treat an integer equal to 1 as a constant). Array pointers stay
specialized: jax-triton calls every one 16-byte aligned (JAX buffers are), torch those
whose address is, so a torch view starting off a 16-byte boundary would compile a binary of
its own: the torch launcher copies such an input to fresh storage (and refuses such an
in-place array) for these kernels. The same kernel then compiled to different layouts from torch and JAX
and summed a dot product in a different order (a 1-ulp difference in the gated delta
rule's output). Marking every scalar argument "not specialized on alignment" makes torch
compile what jax-triton compiles; the kernels state the alignment they need themselves
(``tl.multiple_of`` behind an ``ALIGN`` constexpr the plan computes).
"""

from __future__ import annotations

import inspect

import triton


def same_binary_jit(fn):
    """``triton.jit(fn)`` with no alignment specialization of its scalar parameters: every
    parameter whose name does not end in ``_ptr`` and that is not a ``tl.constexpr``."""
    kernel = triton.jit(do_not_specialize_on_alignment=scalar_params(fn))(fn)
    kernel.same_binary = True  # torch's launcher then keeps its pointers aligned, too
    return kernel


def scalar_params(fn) -> list:
    """The runtime scalar parameters of a kernel function, by the ABI's naming (arrays end
    in ``_ptr``; annotations may be strings under ``from __future__ import annotations``)."""
    return [name for name, p in inspect.signature(fn).parameters.items()
            if not name.endswith("_ptr") and "constexpr" not in str(p.annotation)]

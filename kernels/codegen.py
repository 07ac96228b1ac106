"""A launch plan's kernel compiled for a CUDA target on the CPU (no GPU needed): what the
codegen tests and ``benchmarks/ptxas_regs.py`` inspect. Triton's CUDA backend runs anywhere,
but not in a process that chose Triton's interpreter (``TRITON_INTERPRET=1``): call it from
one that did not.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from .plan import LaunchPlan


def compile_ptx(plan: LaunchPlan, signature: Mapping[str, str], divisible: Iterable[str] = (),
                capability: int = 90, maxnreg: Optional[int] = None) -> str:
    """The PTX of ``plan``'s kernel for ``sm_<capability>``. ``signature``: the Triton type
    of every runtime parameter (``"*fp32"``, ``"i32"``, ...); the plan's constexprs fill in
    the rest. ``divisible``: the parameters the launcher states 16-byte aligned (jax-triton:
    every pointer; torch: also integers that are multiples of 16). ``maxnreg``: Triton's
    register cap (a ``.maxnreg`` directive in the PTX); None: the kernel's own, as the
    launchers compile it (:attr:`LaunchPlan.maxnreg`); 0: none."""
    names = plan.kernel.arg_names
    divisible = set(divisible)
    src = ASTSource(fn=plan.kernel,
                    signature={n: "constexpr" if n in plan.constexprs else signature[n]
                               for n in names},
                    constexprs=dict(plan.constexprs),
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in divisible})
    options = dict(plan.launch_options)
    if maxnreg is not None:
        options.pop("maxnreg", None)
        options.update({"maxnreg": maxnreg} if maxnreg else {})
    return triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options).asm["ptx"]

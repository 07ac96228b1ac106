"""The copy kernels compile to the same memory instructions whoever launches them.

torch's Triton launcher marks integer arguments divisible by 16; jax-triton 0.3 marks only
pointers. Before the kernels stated their alignment themselves (``ALIGN`` from
``pool_align``), the JAX-launched copies used 4-byte (temporal) and 2-byte (conv) accesses
and ran 3-25 % slower on the H200. This test compiles both specializations to PTX for
sm_90 (no GPU needed: Triton's CUDA backend runs on the CPU) in a subprocess, because this
test session may have chosen Triton's interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, os, re, sys
from collections import Counter
os.environ["TRITON_INTERPRET"] = "0"
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import mamba_align.kernels as K

def accesses(plan, sig, divisible):
    names = plan.kernel.arg_names
    src = ASTSource(fn=plan.kernel, signature={n: sig.get(n, "constexpr") for n in names},
                    constexprs=dict(plan.constexprs),
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in divisible})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": plan.num_warps}).asm["ptx"]
    return dict(Counter(re.findall(r"(?:ld|st)\.global[\w:.]*", ptx)))

ptrs = ["pool_in_ptr", "src_ptr", "dst_ptr", "bias_ptr", "pool_ptr"]
out = {}
ids = K.ArraySpec.row_major((8,), "int32")
plan = K.plan_copy_temporal(K.ArraySpec.row_major((4, 9, 32, 128, 128), "float32"), ids, ids)
sig = {"pool_in_ptr": "*i32", "src_ptr": "*i32", "dst_ptr": "*i32", "num_rows": "i32",
       "layer_stride": "i32", "block_stride": "i32", "block_numel": "i32",
       "num_blocks": "i32", "pool_ptr": "*i32"}
ints = ["layer_stride", "block_stride", "block_numel"]
out["temporal"] = [accesses(plan, sig, ptrs[:3] + ptrs[4:]),
                   accesses(plan, sig, ptrs[:3] + ptrs[4:] + ints)]
plan = K.plan_copy_conv(K.ArraySpec.row_major((4, 9, 3, 8192), "bfloat16"), ids, ids, ids,
                        layout="SD")
sig = {"pool_in_ptr": "*i16", "src_ptr": "*i32", "dst_ptr": "*i32", "bias_ptr": "*i32",
       "num_layers": "i32", "layer_stride": "i32", "block_stride": "i32", "width": "i32",
       "dim": "i32", "num_blocks": "i32", "pool_ptr": "*i16"}
ints = ["layer_stride", "block_stride", "dim"]
out["conv"] = [accesses(plan, sig, ptrs), accesses(plan, sig, ptrs + ints)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def ptx_accesses():
    env = dict(os.environ, TRITON_INTERPRET="0")
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=600)
    if r.returncode:
        pytest.fail(f"compiling the copy kernels for sm_90 failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("pool", ["temporal", "conv"])
def test_copy_kernels_vectorize_whatever_the_launcher(ptx_accesses, pool):
    jax_like, torch_like = ptx_accesses[pool]
    assert jax_like == torch_like
    data = {k: v for k, v in jax_like.items() if ".v4." in k}
    # every load and store of pool data is a 16-byte vector access
    assert any(k.startswith("ld.") for k in data) and any(k.startswith("st.") for k in data)
    assert not any(k.endswith((".b16", ".b8")) or (k.startswith("st.") and ".v4." not in k)
                   for k in jax_like), jax_like


BOOKKEEPING_SCRIPT = r"""
import json, os, re
os.environ["TRITON_INTERPRET"] = "0"
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import mamba_align.kernels as K

i32 = lambda *shape: K.ArraySpec.row_major(shape, "int32")
flag = K.ArraySpec.row_major((8,), "bool")
plans = {
    "add_requests": K.plan_add_requests(i32(16), i32(16), i32(16), i32(2), i32(8), i32(8),
                                        block_size=4),
    "preprocess_resolve": K.plan_preprocess_resolve(
        i32(16), i32(16), i32(16), i32(2), i32(8), i32(8), flag, i32(16, 6), block_size=4,
        num_spec=2, num_blocks=64, mode="copy-free"),
    "postprocess": K.plan_postprocess(i32(16), i32(16), i32(16), i32(2), i32(8), i32(8), flag,
                                      i32(8), i32(16, 6), block_size=4, num_spec=2,
                                      num_blocks=64),
}
out = {}
for name, plan in plans.items():
    names = plan.kernel.arg_names
    sig = {n: ("*i1" if n.startswith("is_spec") else "*i32") if n.endswith("_ptr")
           else "constexpr" if n in plan.constexprs else "i32" for n in names}
    src = ASTSource(fn=plan.kernel, signature=sig, constexprs=dict(plan.constexprs))
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": plan.num_warps}).asm["ptx"]
    out[name] = sorted(set(re.findall(r"atom\.global[\w.]*", ptx)))
print(json.dumps(out))
"""


def test_bookkeeping_kernels_compile_for_the_gpu_with_the_flag_atomics():
    """The fault checks compile for sm_90 (no GPU needed), and each kernel updates the
    error flag with atomic OR and MIN."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    r = subprocess.run([sys.executable, "-c", BOOKKEEPING_SCRIPT], env=env, capture_output=True,
                       text=True, timeout=600)
    if r.returncode:
        pytest.fail(f"compiling the bookkeeping kernels for sm_90 failed:\n{r.stderr[-3000:]}")
    atomics = json.loads(r.stdout.strip().splitlines()[-1])
    for name, ops in atomics.items():
        assert any(".or." in o for o in ops) and any(".min." in o for o in ops), (name, ops)

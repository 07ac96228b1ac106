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
import re
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, os, re, sys
from collections import Counter
os.environ["TRITON_INTERPRET"] = "0"
import mamba_align.kernels as K
from mamba_align.kernels.codegen import compile_ptx

def accesses(plan, sig, divisible):
    ptx = compile_ptx(plan, sig, divisible)
    return dict(Counter(re.findall(r"(?:ld|st)\.global[\w:.]*", ptx)))

ptrs = ["pool_in_ptr", "errors_in_ptr", "src_ptr", "dst_ptr", "bias_ptr", "pool_ptr",
        "errors_ptr"]
out = {}
ids, flag = K.ArraySpec.row_major((8,), "int32"), K.ArraySpec.row_major((2,), "int32")
plan = K.plan_copy_temporal(K.ArraySpec.row_major((4, 9, 32, 128, 128), "float32"), flag, ids,
                            ids)
sig = {"pool_in_ptr": "*i32", "errors_in_ptr": "*i32", "src_ptr": "*i32", "dst_ptr": "*i32",
       "num_rows": "i32", "layer_stride": "i32", "block_stride": "i32", "block_numel": "i32",
       "num_blocks": "i32", "pool_ptr": "*i32", "errors_ptr": "*i32"}
ints = ["layer_stride", "block_stride", "block_numel"]
no_bias = [p for p in ptrs if p != "bias_ptr"]
out["temporal"] = [accesses(plan, sig, no_bias), accesses(plan, sig, no_bias + ints)]
plan = K.plan_copy_conv(K.ArraySpec.row_major((4, 9, 3, 8192), "bfloat16"), flag, ids, ids, ids,
                        layout="SD")
sig = {"pool_in_ptr": "*i16", "errors_in_ptr": "*i32", "src_ptr": "*i32", "dst_ptr": "*i32",
       "bias_ptr": "*i32", "num_layers": "i32", "layer_stride": "i32", "block_stride": "i32",
       "width": "i32", "dim": "i32", "num_blocks": "i32", "pool_ptr": "*i16",
       "errors_ptr": "*i32"}
ints = ["layer_stride", "block_stride", "dim"]
out["conv"] = [accesses(plan, sig, ptrs), accesses(plan, sig, ptrs + ints)]
print(json.dumps(out))
"""


def compiled(script: str, what: str):
    """The JSON that ``script`` prints after compiling ``what`` kernels (a subprocess:
    this session may have chosen Triton's interpreter)."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=600)
    if r.returncode:
        pytest.fail(f"compiling the {what} kernels for sm_90 failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def ptx_accesses():
    return compiled(SCRIPT, "copy")


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
import mamba_align.kernels as K
from mamba_align.kernels.codegen import compile_ptx

i32 = lambda *shape: K.ArraySpec.row_major(shape, "int32")
out = {}
# 8 and 64 rows: one compare width; 512: a wider one; 2000: past it (the loop)
for n in (8, 64, 512, 2000):
    flag, s = K.ArraySpec.row_major((n,), "bool"), max(16, n)
    plans = {
        "add_requests": K.plan_add_requests(i32(s), i32(s), i32(s), i32(2), i32(n), i32(n),
                                            block_size=4),
        "preprocess_resolve": K.plan_preprocess_resolve(
            i32(s), i32(s), i32(s), i32(2), i32(n), i32(n), flag, i32(s, 6), block_size=4,
            num_spec=2, num_blocks=64, mode="copy-free"),
        "postprocess": K.plan_postprocess(i32(s), i32(s), i32(s), i32(2), i32(n), i32(n), flag,
                                          i32(n), i32(s, 6), block_size=4, num_spec=2,
                                          num_blocks=64),
    }
    for name, plan in plans.items():
        names = plan.kernel.arg_names
        sig = {a: ("*i1" if a.startswith("is_spec") else "*i32") if a.endswith("_ptr")
               else "i32" for a in names}
        ptx = compile_ptx(plan, sig)
        out[f"{name} {n}"] = sorted(set(re.findall(r"atom\.global[\w.]*", ptx)))
print(json.dumps(out))
"""


def test_bookkeeping_kernels_compile_for_the_gpu_with_the_flag_atomics():
    """The fault checks compile for sm_90 (no GPU needed) at every width of the duplicate
    check (the interpreter does not type loop-carried values), and each kernel updates the
    error flag with atomic OR and MIN."""
    atomics = compiled(BOOKKEEPING_SCRIPT, "bookkeeping")
    assert len(atomics) == 12, sorted(atomics)
    for name, ops in atomics.items():
        assert any(".or." in o for o in ops) and any(".min." in o for o in ops), (name, ops)


RECURRENT_SCRIPT = r"""
import json, os, re
from collections import Counter
os.environ["TRITON_INTERPRET"] = "0"
import mamba_align.kernels as K
from mamba_align.kernels.codegen import compile_ptx

spec = K.ArraySpec.row_major
S = 3
bf = "bfloat16"


def gdn(B, algorithm="recurrent"):
    ids, cu = spec((B,), "int32"), spec((B + 1,), "int32")
    return K.plan_gated_delta_rule_fused_gates(
        spec((2, 9, 32, 128, 128), "float32"), spec((2,), "int32"), spec((B, 16, 128), bf),
        spec((B, 16, 128), bf), spec((B, 32, 128), bf), spec((B, 32), bf), spec((B, 32), bf),
        spec((32,), "float32"), spec((32,), "float32"), cu, ids, spec((B, 1 + S), "int32"),
        ids, layer=1, scale=0.0, use_qk_l2norm=True, layout="VK", algorithm=algorithm)


def ssu(B, algorithm):
    ids, cu, f32 = spec((B,), "int32"), spec((B + 1,), "int32"), "float32"
    return K.plan_selective_state_update(
        spec((2, 9, 32, 64, 128), f32), spec((2,), "int32"), spec((B, 32, 64), bf),
        spec((B, 32), bf), spec((32,), f32), spec((B, 4, 128), bf), spec((B, 4, 128), bf),
        spec((32,), f32), spec((32,), f32), cu, ids, spec((B, 1 + S), "int32"), ids, layer=1,
        dt_softplus=True, algorithm=algorithm)


def conv(B, T):
    ids, cu = spec((B,), "int32"), spec((B + 1,), "int32")
    return K.plan_conv1d_update(
        spec((2, 9, 6, 8192), bf), spec((2,), "int32"), spec((T * B, 8192), bf),
        spec((8192, 4), bf), spec((8192,), bf), cu, ids, ids, ids, ids, layer=1, layout="SD",
        activation="silu")


# a spec step of the conv: 1 + S tokens per row (256 channels a program)
plans = {"gdn": gdn(64), "gdn_small": gdn(1), "gdn_chunked": gdn(64, "chunked"),
         "gdn_prepare": gdn(64, "chunked").before[0], "ssu_chunked": ssu(64, "chunked"),
         "conv": conv(64, 1 + S), "conv_decode": conv(64, 1)}
out = {}
for name, plan in plans.items():
    names = plan.kernel.arg_names

    def ty(n):
        if not n.endswith("_ptr"):
            return "fp32" if n == "scale" else "i32"
        stem = n[:-4].replace("_in", "")
        if name.startswith("gdn") and (stem in ("pool", "A_log", "dt_bias")
                                       or stem.startswith("chunk_")):
            return "*fp32"
        if name.startswith("ssu") and stem in ("pool", "A", "D", "dt_bias"):
            return "*fp32"
        return "*i32" if stem in ("errors", "cu_seqlens", "read_block", "write_blocks",
                                  "read_offset", "write_block", "is_spec") else "*bf16"
    # pointers 16-byte aligned, integers unmarked: what jax-triton tells the compiler
    ptx = compile_ptx(plan, {n: ty(n) for n in names if n not in plan.constexprs},
                      [n for n in names if n.endswith("_ptr")])
    out[name] = dict(Counter(re.findall(r"(?:ld|st)\.global[\w:.]*", ptx)))
    out[name]["maxnreg"] = re.findall(r"\.maxnreg\s+(\d+)", ptx)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def recurrent_accesses():
    return compiled(RECURRENT_SCRIPT, "recurrent")


def test_recurrent_kernels_access_the_state_in_16_byte_vectors(recurrent_accesses):
    """The gated delta rule's state and the conv's SD window compile to 16-byte accesses
    (sm_90, no GPU needed) although no integer argument is marked aligned: each kernel
    states the alignment its plan derived. Without it the GDN state was read and written
    4 bytes at a time and held the addresses in registers (157 per thread; 3.5 instead of
    3.96 TB/s at decode, benchmarks/README.md)."""
    acc = recurrent_accesses
    gdn = acc["gdn"]
    # the fp32 state's [8, 128] tile in one warp: 8 loads and 8 stores of 16 bytes per
    # thread, no 4-byte store (the int32 ids and the bf16 q/k/v/o account for the rest)
    assert gdn.get("ld.global.v4.b32", 0) >= 8 and gdn.get("st.global.v4.b32", 0) >= 8, gdn
    assert "st.global.b32" not in gdn, gdn
    conv = acc["conv"]
    assert conv.get("ld.global.v4.b32", 0) >= 1 and "st.global.b16" not in conv, conv
    # the one-token path's bf16 taps: a packed 8-byte word per channel, two in one load
    assert acc["conv_decode"].get("ld.global.v2.b64", 0) >= 1, acc["conv_decode"]
    # the gated delta rule's register cap reaches the PTX the launchers compile; the conv
    # update has none
    from mamba_align.kernels.gdn import REGISTER_CAP
    assert gdn["maxnreg"] == [str(REGISTER_CAP)] and conv["maxnreg"] == [], (gdn, conv)
    # the chunked algorithm: its own kernel, uncapped, its [128, 32] state tile stored as
    # 16-byte vectors (four or eight a thread, on eight or four warps) on every path that
    # stores it (the spec rows' candidates and the final state)
    for name in ("gdn_chunked", "ssu_chunked"):  # Mamba2's: a [32, 128] tile, the same
        chunked = acc[name]
        assert chunked["maxnreg"] == [] and chunked.get("st.global.v4.b32", 0) >= 8, chunked
        assert chunked.get("ld.global.v4.b32", 0) >= 4, chunked
    # its step 1 (every chunk's solve): uncapped, W and U0 stored 16 bytes at a time, at
    # most one 4-byte store a thread left (the log decays, a float a token)
    prepare = acc["gdn_prepare"]
    assert prepare["maxnreg"] == [] and prepare.get("st.global.v4.b32", 0) >= 8, prepare
    assert prepare.get("st.global.b32", 0) <= 1, prepare


def test_the_streaming_hints_reach_the_ptx(recurrent_accesses):
    """The gated delta rule's state is loaded ``evict_first`` and stored ``.cs`` below
    ``STREAM_BELOW`` rows and plainly from there; the conv update's one-token path always
    streams its window (benchmarks/README.md, "Streaming hints")."""
    acc = recurrent_accesses

    def hinted(name):
        return ({k for k in acc[name] if k.startswith("ld.") and "evict_first" in k},
                {k for k in acc[name] if k.startswith("st.") and ".cs" in k})

    assert all(hinted("gdn_small")) and all(hinted("conv_decode")), acc
    # the hinted state accesses stay 16 bytes wide
    small = acc["gdn_small"]
    assert small.get("ld.global.L1::evict_first.L2::cache_hint.v4.b32", 0) >= 8, small
    assert small.get("st.global.cs.v4.b32", 0) >= 8, small
    assert hinted("gdn") == (set(), set()), acc["gdn"]


def load_order(*args: str):
    """``benchmarks/sass_load_order.py``'s lines for a launch: ``(round trips, load or
    control-flow instruction)``."""
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "sass_load_order.py")
    env = dict(os.environ, TRITON_INTERPRET="0")
    r = subprocess.run([sys.executable, script, *args], env=env, capture_output=True,
                       text=True, timeout=600)
    if r.returncode:
        pytest.fail(f"sass_load_order.py {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    found = [re.match(r"\s*\d+\s+behind (\d+) round trip\(s\)\s+(.*)", line)
             for line in r.stdout.splitlines()]
    return [(int(m.group(1)), m.group(2)) for m in found if m]


@pytest.mark.parametrize("rows", ["1", "64"])
def test_the_state_waits_for_one_round_trip_only(rows):
    # the read block id must be issued with the first loads: ptxas had put it behind the
    # cu_seqlens round trip (benchmarks/README.md, "The rows' first loads")
    loads = load_order("--rows", rows)
    state = [d for d, text in loads if "LDG.E" in text and ".128" in text and "+0x200]" in text]
    assert state and set(state) == {1}, loads
    assert all(d == 0 for d, _ in loads[:3]), loads  # two cu_seqlens entries, a block id


def test_a_one_row_launch_issues_the_state_before_the_first_tokens_inputs():
    # below STATE_FIRST_BELOW rows nothing that waits for the ids goes ahead of the state's
    # (evict_first) loads: ptxas had put q, k, v and the gates first (benchmarks/README.md,
    # "The state ahead of the first token's inputs")
    loads = load_order("--rows", "1")
    # the state's eight 16-byte loads share a base register, 0x200 bytes apart
    base = [re.search(r"\[(R\d+)\.64\+0x200\]", text) for _, text in loads]
    base = {f"[{m.group(1)}.64" for m in base if m}
    assert len(base) == 1, loads
    state = [i for i, (_, text) in enumerate(loads) if ".128" in text and min(base) in text]
    assert len(state) == 8, loads
    assert all(i in state for i, (d, _) in enumerate(loads[:state[-1] + 1]) if d > 0), loads


@pytest.mark.parametrize("layout,rows,width", [("SD", "1", "6"), ("SD", "16", "6"),
                                               ("DS", "1", "6"), ("DS", "1", "3")])
def test_a_small_conv_launch_loads_the_window_before_any_branch(layout, rows, width):
    # below LATENCY_BELOW rows a one-token row's window, token and taps load with no branch
    # ahead of them, one round trip after the ids: the branch to the one-token path had
    # kept them about 100 instructions behind the ids' arrival (benchmarks/README.md, "The
    # window ahead of the row's checks"); a DS window of 3 columns loads as words
    lines = load_order("--conv", layout, "--rows", rows, "--tokens", "1", "--width", width)
    window = [i for i, (_, text) in enumerate(lines) if "LDG.E.EF" in text]
    # K - 1 = 3 history rows, or a group's three words
    assert len(window) == 3, lines
    opcodes = [next(t for t in lines[i][1].split() if t.startswith("LDG")) for i in window]
    if layout == "DS":  # 2-byte fields, or words
        assert (width == "3") == all(op.endswith(".64") for op in opcodes), opcodes
    control = ("BRA", "BRX", "JMP", "JMX", "EXIT", "RET", "CALL")
    assert not any(c in text for _, text in lines[:window[-1]] for c in control), lines
    assert max(d for d, text in lines if "LDG" in text) == 1, lines

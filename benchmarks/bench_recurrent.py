"""The recurrent kernels against flash-linear-attention (fla), at Qwen3-Next shapes.

Gated delta rule: H = 16 qk heads, HV = 32 value heads, K = V = 128, bf16 q/k/v, fp32 state
pool ``[L, NB, HV, V, K]``, in-kernel gates and q/k l2norm. Causal conv1d update: D = 8192,
K = 4, bf16 DS pool ``[L, NB, D, K - 1 + S]``, SiLU. S = 3. Batches B = 1, 16, 64, 256:

- ``decode``: one token per row, the final state written (non-spec);
- ``spec``: 1 + S = 4 tokens per row, every candidate state written (ours; fla writes only
  the final state: its rows say so);
- ``prefill``: one non-spec row of 2048 tokens (B = 1), given gates, ours token by token
  (``ours``) and by chunks (``ours_chunked``, ``algorithm="chunked"``) against fla's fused
  recurrent and ``chunk_gated_delta_rule`` kernels;
- ``step``: pre-copy against copy-free for B crossing decode rows: the two copies plus both
  kernels, against both kernels reading the old column.

Op ``conv_sd``: the conv update on the same windows in an SD pool ``[L, NB, K - 1 + S, D]``
(ours, torch and JAX; its fla columns are fla's on the DS rows' caches). Ops ``conv_s0``
and ``conv_s0_sd``: decode rows on conv pools sized for a model without drafts (``W = K -
1``, the history fla's cache holds), DS and SD, fla alone and pooled on the same windows.

Methods: ``ours`` (torch, CUDA-graph replay), ``ours_jax`` (jitted, pool donated; device
time from a profiler trace), ``fla`` (fla's kernel on contiguous states, as its docs call
it: keywords, ``state_v_first=True`` for the ``[V, K]`` layout), ``fla_pooled`` (what a pool
user must do: gather the read blocks, fla, scatter to the write blocks, with
``index_select`` / ``index_copy_``), ``fla_pooled_indexing`` (the same with plain indexing,
``pool[ids]`` and ``pool[ids] = h``; gated delta rule only, the conv's pooled rows index
that way already). Every output is checked against the float64 reference of one row before
anything is timed. TB/s counts the state traffic only: the state read once plus every state
written (conv: the K - 1 history rows read, the window rows written).

Usage::

    python benchmarks/bench_recurrent.py [--out benchmarks/results] [--small]

Writes ``recurrent_h200.json`` and ``recurrent_h200.md`` under ``--out``. ``--small``: a CPU
smoke run in Triton's interpreter, tiny shapes, ours only when fla cannot run.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before jax is imported

import argparse
import datetime
import functools
import itertools
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from timing import (bench_ms, d2d_ceiling, dist_version, free,  # noqa: E402  (makes
                    results_folder)  # mamba_align importable)
from recurrent_cases import (Case, check, conv_bytes, fla_conv_calls, load_fla, np32,  # noqa: E402
                             shapes, state_bytes)
from recurrent_report import plot, table  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

from mamba_align.backends.torch import ops as tops  # noqa: E402
from mamba_align.kernels import gdn as gdn_kernels  # noqa: E402


def run(args: argparse.Namespace) -> Dict[str, Any]:
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    s = shapes(args.small)
    fla = load_fla() if cuda else None
    if cuda and fla is None and not args.small:
        raise SystemExit("fla-core is needed for the baselines (the .whl/ wheels, make gpu-setup)")
    gen = torch.Generator().manual_seed(0)
    records: List[Dict[str, Any]] = []

    def rec(op, method, B, T, fn, nbytes, note="", ms=None):
        """Time ``fn`` (or take ``ms``, measured elsewhere) and keep the record."""
        ms = bench_ms(fn, cuda, graph=cuda) if ms is None else ms
        records.append({"op": op, "method": method, "batch": B, "tokens_per_row": T, "ms": ms,
                        "bytes": nbytes, "tbps": nbytes / (ms * 1e-3) / 1e12, "note": note})
        print(f"{op:8s} {method:19s} B={B:4d} T={T:4d} {ms * 1e3:9.1f} us "
              f"{records[-1]['tbps']:6.2f} TB/s {note}", flush=True)

    ceiling = d2d_ceiling(1 << (20 if args.small else 32), dev, cuda)
    for T, spec, label in ((1, False, "decode"), (1 + s["S"], True, "spec")):
        for B in s["batches"]:
            c = Case(s, B, T, spec, dev, gen)
            o, y = c.gdn(), c.conv()
            for row in sorted({0, B - 1}):
                want_o, want_h = c.gdn_ref(row)
                t0 = row * T
                check(f"ours gdn {label} B={B} row {row}", o[t0:t0 + T], want_o, 2e-2)
                check(f"ours gdn state {label} B={B} row {row}",
                      c.pool[1, c.wbs[row, :want_h.shape[0]]], want_h, 2e-2)
                check(f"ours conv {label} B={B} row {row}", y[t0:t0 + T], c.conv_ref(row), 2e-2)
            c.assert_clean(f"ours {label} B={B}")
            rec("gdn", "ours", B, T, c.timed(c.gdn), state_bytes(s, B, T if spec else 1))
            rec("conv", "ours", B, T, c.timed(c.conv), conv_bytes(s, B, T + s["KC"] - 2 if spec
                                                                  else s["KC"] - 1))
            c.assert_clean(f"ours {label} B={B}, timed")
            c.i = 0
            if fla is not None:
                fla_rows(s, c, fla, rec, label)
            jax_rows(s, c, rec, args.small, records)
            conv_sd_rows(s, c, rec, label)
            del c
            free(cuda)
            if not spec:
                no_draft_conv_rows(s, B, dev, gen, fla, rec)
                free(cuda)
    prefill_rows(s, dev, gen, fla, rec)
    step_rows(s, dev, gen, rec)
    header = {
        "device": torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)",
        "torch": torch.__version__, "triton": triton.__version__, "fla": dist_version("fla-core"),
        "jax_triton": dist_version("jax-triton"), "shapes": {k: v for k, v in s.items()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "ceiling": ceiling,
        "conv_groups": True,  # the conv pool and fla's caches cycle groups of their own
        "fla_conv_tuned_per_batch": True,  # retune_fla_conv with no disk cache
        "gdn_register_cap": gdn_kernels.REGISTER_CAP,
        "timer": "timing.graph_ms (triton.testing.do_bench_cudagraph's method, thread-local "
                 "capture: median device time of a CUDA-graph "
                 "replay); ours_jax: GPU busy time from a jax.profiler trace",
    }
    return {"header": header, "records": records}


def fla_rows(s, c: Case, fla, rec, label: str) -> None:
    fused, _, conv_update = fla
    B, T = c.B, c.T
    h0s = [c.pool[1].index_select(0, rb).contiguous()  # [B, HV, V, K]: state_v_first
           for rb, _, _ in c.sets]
    h0 = h0s[0]

    def fla_gdn(h):
        return fused(q=c.q[None], k=c.k[None], v=c.v[None], g=c.a[None], beta=c.b[None],
                     initial_state=h, output_final_state=True, use_qk_l2norm_in_kernel=True,
                     use_gate_in_kernel=True, A_log=c.A_log, dt_bias=c.dt_bias,
                     use_beta_sigmoid_in_kernel=True, state_v_first=True, cu_seqlens=c.cu)

    o, ht = fla_gdn(h0)
    want_o, want_h = c.gdn_ref(0)
    check(f"fla gdn {label} B={B}", o[0, :T], want_o, 2e-2)
    check(f"fla gdn final state {label} B={B}", ht[0], want_h[-1], 2e-2)
    note = "final state only" if c.spec else ""
    rec("gdn", "fla", B, T, c.timed(lambda: fla_gdn(h0s[c.i % c.nsets])), state_bytes(s, B, 1), note)

    def last():  # the write block of the final state
        return c.wbs[:, T - 1] if c.spec else c.wb

    def pooled():  # torch's dedicated gather and scatter
        _, h = fla_gdn(c.pool[1].index_select(0, c.rb))
        c.pool[1].index_copy_(0, last(), h)

    def pooled_indexing():  # plain indexing (its rate matches the 0.93-0.95 TB/s)
        _, h = fla_gdn(c.pool[1][c.rb])
        c.pool[1][last()] = h

    for method, fn in (("fla_pooled", pooled), ("fla_pooled_indexing", pooled_indexing)):
        c.i = 0  # group 0: want_h is row 0's reference there
        c.pool[1, last()] = float("nan")  # (ours wrote the same state there before)
        fn()
        check(f"{method} gdn final state {label} B={B}", c.pool[1, last()[0]], want_h[-1], 2e-2)
        rec("gdn", method, B, T, c.timed(fn), state_bytes(s, B, 1), note)
    if c.spec:  # fla's conv update takes one token per sequence
        return
    alone, pooled_conv = fla_conv_calls(s, c, conv_update, label)
    rec("conv", "fla", B, T, c.timed(alone), conv_bytes(s, B, s["KC"] - 1), "contiguous caches")
    del alone
    rec("conv", "fla_pooled", B, T, c.timed(pooled_conv), conv_bytes(s, B, s["KC"] - 1))


def conv_sd_rows(s, c: Case, rec, label: str) -> None:
    """Ours on the same windows in an "SD" pool (``[W, D]`` blocks: a window row is
    contiguous), checked against the reference first: op ``conv_sd``."""
    B, T = c.B, c.T
    c.use_sd_pool()
    y = c.conv()
    for row in sorted({0, B - 1}):
        check(f"ours conv SD {label} B={B} row {row}", y[row * T:(row + 1) * T],
              c.conv_ref(row), 2e-2)
    c.assert_clean(f"ours conv SD {label} B={B}")
    rec("conv_sd", "ours", B, T, c.timed(c.conv),
        conv_bytes(s, B, T + s["KC"] - 2 if c.spec else s["KC"] - 1))
    c.assert_clean(f"ours conv SD {label} B={B}, timed")


def no_draft_conv_rows(s, B: int, dev, gen, fla, rec) -> None:
    """The conv update's decode rows on a pool sized for a model without drafts (``W = K -
    1``, the history fla's ``[B, D, K]`` cache also holds): ours on a DS pool (op
    ``conv_s0``) and on the same windows in an SD pool (``conv_s0_sd``), fla alone and
    pooled on the same windows (op ``conv_s0``), each checked against the reference first."""
    c = Case(s, B, 1, False, dev, gen, conv_S=0, state=False)
    nbytes = conv_bytes(s, B, s["KC"] - 1)
    for op in ("conv_s0", "conv_s0_sd"):
        if op.endswith("_sd"):
            c.use_sd_pool()
        y = c.conv()
        for row in sorted({0, B - 1}):
            check(f"ours {op} decode B={B} row {row}", y[row:row + 1], c.conv_ref(row), 2e-2)
        c.assert_clean(f"ours {op} B={B}")
        rec(op, "ours", B, 1, c.timed(c.conv), nbytes, f"W = {s['KC'] - 1}")
        c.assert_clean(f"ours {op} B={B}, timed")
        if fla is not None and not op.endswith("_sd"):
            c.i = 0
            alone, pooled = fla_conv_calls(s, c, fla[2], "decode, no drafts")
            rec(op, "fla", B, 1, c.timed(alone), nbytes, "contiguous caches")
            del alone
            rec(op, "fla_pooled", B, 1, c.timed(pooled), nbytes)


#: the Triton kernels the JAX rows launch, by the names a profiler trace gives them
KERNEL_NAMES = {"gdn": "gated_delta_rule_fused_gates_kernel", "conv": "conv1d_update_kernel",
                "conv_sd": "conv1d_update_kernel"}


def jax_rows(s, c: Case, rec, small: bool, records: List[Dict[str, Any]]) -> None:
    """ours_jax: the same launches jitted with the pools donated (GPU only)."""
    if not torch.cuda.is_available():
        return
    import jax
    import jax.numpy as jnp

    from jax_device_time import device_ms
    from mamba_align.backends.jax import ops as jops
    def J(t):  # noqa: N802
        if t.dtype == torch.bfloat16:
            return jnp.asarray(t.float().cpu().numpy()).astype(jnp.bfloat16)
        return jnp.asarray(t.cpu().numpy())

    T, B = c.T, c.B
    c.i = 0  # the references below read group 0's blocks, as the first JAX calls do
    # the group of blocks of each call is chosen on the host, as the torch rows choose it
    # while capturing: the jitted call holds the launch alone (and what XLA adds to it)
    groups = {"gdn": [(J(rb), J(wbs)) for rb, wbs, _ in c.sets],
              "conv": [(J(rb), J(wb)) for rb, wb in c.csets]}
    groups["conv_sd"] = groups["conv"]
    # every array an argument: XLA would fold a uniform array the function closed over
    # (is_spec, the read offsets) into a broadcast kernel run on every call
    gdn_in = [J(x) for x in (c.q, c.k, c.v, c.a, c.b, c.A_log, c.dt_bias, c.cu, c.is_spec)]
    conv_args = [J(x) for x in (c.x, c.w, c.cb, c.cu, c.off, c.is_spec)]

    @functools.partial(jax.jit, donate_argnums=(0,))
    def gdn(carry, group, q, k, v, a, b, A_log, dt_bias, cu, spec):  # noqa: N803
        p, e = carry
        out = jops.gated_delta_rule_fused_gates(p, e, q, k, v, a, b, A_log, dt_bias, cu,
                                                group[0], group[1], spec, layer=1,
                                                use_qk_l2norm=True)
        return (out["pool"], out["errors"]), out["o"]

    def conv_in(layout):
        @functools.partial(jax.jit, donate_argnums=(0,))
        def conv(carry, group, x, w, cb, cu, off, spec):
            p, e = carry
            out = jops.conv1d_update(p, e, x, w, cb, cu, group[0], off, group[1], spec,
                                     layer=1, layout=layout)
            return (out["pool"], out["errors"]), out["y"]
        return conv

    assert c.conv_layout == "DS"  # (conv_sd_rows moves the torch rows to an SD pool after)
    # op "conv_sd": the same windows in an SD pool, as conv_sd_rows times them from torch
    for name, fn, pool, args, ref in (
            ("gdn", gdn, lambda: c.pool, gdn_in, lambda: c.gdn_ref(0)[0]),
            ("conv", conv_in("DS"), lambda: c.cpool, conv_args, lambda: c.conv_ref(0)),
            ("conv_sd", conv_in("SD"), lambda: c.cpool.transpose(2, 3).contiguous(),
             conv_args, lambda: c.conv_ref(0))):
        carry = (J(pool()), jnp.asarray(np.array([0, 2**31 - 1], np.int32)))
        carry, out = fn(carry, groups[name][0], *args)  # group 0: the reference's blocks
        check(f"ours_jax {name} B={B}", torch.as_tensor(np.asarray(out[:T], np.float32)),
              ref(), 2e-2)

        def step(cr, fn=fn, g=groups[name], args=args, calls=itertools.count(1)):
            return fn(cr, g[next(calls) % len(g)], *args)[0]

        ms, carry, by_name = device_ms(step, carry)
        if np.asarray(carry[1]).tolist() != [0, 2**31 - 1]:
            raise SystemExit(f"ours_jax {name} B={B}: faults {np.asarray(carry[1]).tolist()}")
        nbytes = (state_bytes(s, B, T if c.spec else 1) if name == "gdn" else
                  conv_bytes(s, B, T + s["KC"] - 2 if c.spec else s["KC"] - 1))
        rec(name, "ours_jax", B, T, None, nbytes, "profiler busy time", ms=ms)
        records[-1]["ms_by_activity"] = by_name
        # the Triton kernel's own device time, without what XLA adds around it (what
        # torch's graph holds)
        own = [v for k, v in by_name.items() if KERNEL_NAMES[name] in k]
        if own:
            rec(name, "ours_jax_kernel", B, T, None, nbytes, "the kernel's busy time",
                ms=sum(own))
        else:
            print(f"ours_jax {name} B={B}: no activity named {KERNEL_NAMES[name]} in "
                  f"{sorted(by_name)}", flush=True)
        del carry


def prefill_rows(s, dev, gen, fla, rec) -> None:
    """One non-spec row of ``prefill`` tokens, given gates: ours against fla's fused
    recurrent and chunked kernels."""
    T = s["prefill"]
    c = Case(s, 1, T, False, dev, gen)
    A = torch.exp(c.A_log)
    g = (-A * torch.nn.functional.softplus(c.a.float() + c.dt_bias)).contiguous()
    beta = torch.sigmoid(c.b.float()).to(torch.bfloat16)

    def ours(algorithm="recurrent"):
        return tops.gated_delta_rule_(c.pool, c.errors, c.q, c.k, c.v, g, beta, c.cu, c.rb,
                                      c.wbs, c.is_spec, layer=1, use_qk_l2norm=True,
                                      algorithm=algorithm)["o"]

    o = ours()
    check("ours prefill", o, c.gdn_ref(0)[0], 5e-2)  # the reference's gates: beta unrounded
    check("ours chunked prefill", ours("chunked"), c.gdn_ref(0)[0], 5e-2)
    note = "state bytes only (q/k/v/o traffic dominates)"
    if fla is not None:
        fused, chunk, _ = fla
        h0 = c.pool[1].index_select(0, c.rb).contiguous()
        kw = dict(q=c.q[None], k=c.k[None], v=c.v[None], g=g[None], beta=beta[None],
                  initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                  state_v_first=True, cu_seqlens=c.cu)
        for name, f in (("fla", fused), ("fla_chunk", chunk)):
            of, _ = f(**kw)
            check(f"{name} prefill vs ours", of[0], np32(o), 5e-2)
            rec("prefill", name, 1, T, lambda f=f: f(**kw), state_bytes(s, 1, 1), note)
    rec("prefill", "ours", 1, T, ours, state_bytes(s, 1, 1), note)
    rec("prefill", "ours_chunked", 1, T, lambda: ours("chunked"), state_bytes(s, 1, 1), note)
    c.assert_clean("prefill")


def step_rows(s, dev, gen, rec) -> None:
    """Pre-copy against copy-free for B crossing decode rows, over all ``L`` layers as a
    step runs them: the pre-copy moves each row's state (and its conv window) from its old
    block into the new window's block in every layer (one launch per pool), then the
    kernels of each layer read there; copy-free reads the old block directly."""
    L = s["L"]
    for B in s["batches"]:
        c = Case(s, B, 1, False, dev, gen)
        zero = torch.zeros(B, dtype=torch.int64, device=dev)

        def kernels(read):
            for layer in range(L):
                tops.gated_delta_rule_fused_gates_(
                    c.pool, c.errors, c.q, c.k, c.v, c.a, c.b, c.A_log, c.dt_bias, c.cu, read,
                    c.wbs, c.is_spec, layer=layer, use_qk_l2norm=True)
                tops.conv1d_update_(c.cpool, c.errors, c.x, c.w, c.cb, c.cu, read, zero, c.wb,
                                    c.is_spec, layer=layer, layout="DS")

        def pre_copy():
            tops.copy_temporal_(c.pool, c.errors, c.rb, c.wb)
            tops.copy_conv_(c.cpool, c.errors, c.rb, c.wb, zero, layout="DS")
            kernels(c.wb)

        n = L * (state_bytes(s, B, 1) + conv_bytes(s, B, s["KC"] - 1))
        rec("step", "pre_copy", B, 1, c.timed(pre_copy), n, f"{L} layers: copies + kernels")
        rec("step", "copy_free", B, 1, c.timed(lambda: kernels(c.rb)), n,
            f"{L} layers: kernels only")
        c.assert_clean(f"step B={B}")
        del c
        free(torch.cuda.is_available())



def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="default: benchmarks/results (a temporary folder with --small)")
    ap.add_argument("--small", action="store_true", help="CPU smoke run: tiny shapes")
    ap.add_argument("--plot-only", type=Path, metavar="JSON",
                    help="redraw recurrent_h200.png under --out from an earlier run's JSON")
    args = ap.parse_args(argv)
    args.out = results_folder(args.out, args.small, "bench_recurrent_")
    if args.plot_only:
        plot(json.loads(args.plot_only.read_text()), args.out / "recurrent_h200.png")
        return
    data = run(args)
    (args.out / "recurrent_h200.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / "recurrent_h200.md").write_text(table(data) + "\n")
    plot(data, args.out / "recurrent_h200.png")
    print(table(data))


if __name__ == "__main__":
    main()

"""Mamba2's selective state update against flash-linear-attention (fla), at Nemotron-H shapes.

H = 128 heads, head dim P = 64, state size N = 128, G = 8 groups, bf16 x / dt / B / C, fp32
``A``, ``D``, ``dt_bias`` and state pool ``[L, NB, H, P, N]``, ``dt_softplus``. S = 3.
Batches B = 1, 16, 64, 256:

- ``decode``: one token per row, the final state written (non-spec);
- ``spec``: 1 + S = 4 tokens per row, every candidate state written (ours; fla writes only
  the final state: its rows say so).

fla has no Mamba2 decode kernel; its scalar-decay linear attention,
``fused_recurrent_simple_gla``, runs the same recurrence: with keys ``B`` (expanded to every
head), values ``d * x``, queries ``C``, log decay ``g = d * A``, ``scale=1.0`` and
``state_v_first=True`` (its ``[V, K]`` state is our ``[P, N]``), its output is ``y - D * x``
and its state ours. Its inputs are prepared before timing (softplus, the products, the
expanded groups): its rows time the recurrence alone, ours the whole update.

Methods: ``ours`` (torch, CUDA-graph replay), ``ours_jax`` (jitted, pool donated; GPU busy
time from a profiler trace), ``fla`` (contiguous states), ``fla_pooled`` (gather the read
blocks with ``index_select``, fla, scatter with ``index_copy_``), ``fla_pooled_indexing``
(plain indexing). Before anything is timed, ours is checked against the float64 reference
on a batch's first and last rows (y and every state written), fla and ours_jax on its
first row. TB/s counts the state traffic only: the state read once plus every state
written. Blocks are cycled through groups that exceed the L2 cache, as in
``bench_recurrent.py``.

Usage::

    python benchmarks/bench_selective_state.py [--out benchmarks/results] [--small]

Writes ``selective_state_h200.json`` and ``selective_state_h200.md`` under ``--out``.
``--small``: tiny shapes (a smoke run; on the CPU in Triton's interpreter, ours only).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before jax is imported
os.environ.setdefault("FLA_FLASH_QLA", "0")

import argparse  # noqa: E402
import datetime  # noqa: E402
import functools  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Dict, List, Optional, Sequence  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from timing import (bench_ms, d2d_ceiling, dist_version, free,  # noqa: E402  (makes
                    results_folder)  # mamba_align importable)
from recurrent_cases import block_groups, check, np32  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

from mamba_align.backends.torch import ops as tops  # noqa: E402
from mamba_align.core.selective_state_ref import selective_state_update_ref  # noqa: E402

INPUTS = ("x", "dt", "A", "B", "C", "D", "dt_bias")


def shapes(small: bool) -> Dict[str, Any]:
    if small:
        return dict(H=4, G=2, P=8, N=16, S=3, L=2, batches=(1, 2), rotate=4 << 10)
    # rotate: state bytes read before a group of blocks comes round again (> the 50 MB L2)
    return dict(H=128, G=8, P=64, N=128, S=3, L=2, batches=(1, 16, 64, 256),
                rotate=256 << 20)


class SsuCase:
    """One batch of rows with distinct read and write blocks, cycled through groups of
    blocks (``i``: calls so far) so that replayed calls find no state in the L2 cache."""

    def __init__(self, s: Dict[str, Any], B: int, T: int, spec: bool, dev: torch.device,
                 gen: torch.Generator):
        H, G, P, N, S, L = (s[n] for n in ("H", "G", "P", "N", "S", "L"))
        self.B, self.T, self.spec = B, T, spec
        n = B * T
        nb, groups = block_groups(B, S, spec, H * P * N * 4, s["rotate"], gen, dev)
        # (read, write, the final state's write block)
        self.sets = [(rb, wbs, wbs[:, T - 1].clone() if spec else last)
                     for rb, wbs, last in groups]
        self.nsets = len(self.sets)
        self.i = 0
        def r(*shape, dt=torch.bfloat16):
            return torch.randn(*shape, generator=gen).to(dev, dt)
        self.ins = {"x": r(n, H, P), "dt": r(n, H) - 2,
                    "A": -torch.rand(H, generator=gen).to(dev) - 0.5,
                    "B": r(n, G, N), "C": r(n, G, N), "D": r(H, dt=torch.float32),
                    "dt_bias": r(H, dt=torch.float32) * 0.5}
        self.cu = torch.arange(0, n + 1, T, device=dev)
        self.is_spec = torch.full((B,), int(spec), device=dev)
        self.pool = torch.zeros((L, nb, H, P, N), device=dev)
        for rb, _, _ in self.sets:
            self.pool[:, rb] = r(L, B, H, P, N, dt=torch.float32) * 0.1
        self.errors = torch.tensor([0, 2**31 - 1], dtype=torch.int32, device=dev)

    @property
    def group(self):
        """The current call's read blocks, write blocks and final write block."""
        return self.sets[self.i % self.nsets]

    def timed(self, fn):
        def call():
            self.i += 1
            return fn()
        return call

    def ours(self):
        rb, wbs, _ = self.group
        return tops.selective_state_update_(self.pool, self.errors,
                                            *(self.ins[n] for n in INPUTS), self.cu, rb, wbs,
                                            self.is_spec, layer=1)["y"]

    def ref(self, row: int):
        """y and the states written by ``row`` of the current group (float64 reference)."""
        t0, t1 = row * self.T, (row + 1) * self.T
        rb = self.group[0]
        block = np32(self.pool[1, rb[row]])[None]  # read block 0, write blocks 1..T
        pool = np.concatenate([block, np.zeros((self.T,) + block.shape[1:], np.float32)])
        ins = {n: np32(a if n in ("A", "D", "dt_bias") else a[t0:t1])
               for n, a in self.ins.items()}
        y, out, _ = selective_state_update_ref(
            *(ins[n] for n in INPUTS), pool, [0, self.T], [0],
            [list(range(1, 1 + self.T)) if self.spec else [1]], [self.spec])
        return y, out[1:1 + (self.T if self.spec else 1)]

    def assert_clean(self, what: str) -> None:
        if self.errors.tolist() != [0, 2**31 - 1]:
            raise SystemExit(f"{what}: the kernel flagged faults {self.errors.tolist()}")


def state_bytes(s: Dict[str, Any], B: int, writes: int) -> int:
    return B * s["H"] * s["P"] * s["N"] * 4 * (1 + writes)


def load_fla():
    try:
        from fla.ops.simple_gla import fused_recurrent_simple_gla
        return fused_recurrent_simple_gla
    except Exception as e:  # noqa: BLE001  (no fla, or no GPU for its kernels)
        print(f"fla unavailable: {e!r}")
        return None


def run(args: argparse.Namespace) -> Dict[str, Any]:
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    s = shapes(args.small)
    fla = load_fla() if cuda else None
    if cuda and fla is None and not args.small:
        raise SystemExit("fla-core is needed for the baseline (the .whl/ wheels, make gpu-setup)")
    gen = torch.Generator().manual_seed(0)
    records: List[Dict[str, Any]] = []

    def rec(method, B, T, fn, nbytes, note="", ms=None):
        ms = bench_ms(fn, cuda, graph=cuda) if ms is None else ms
        records.append({"op": "ssu", "method": method, "batch": B, "tokens_per_row": T,
                        "ms": ms, "bytes": nbytes, "tbps": nbytes / (ms * 1e-3) / 1e12,
                        "note": note})
        print(f"ssu {method:19s} B={B:4d} T={T:2d} {ms * 1e3:9.1f} us "
              f"{records[-1]['tbps']:6.2f} TB/s {note}", flush=True)

    ceiling = d2d_ceiling(1 << (20 if args.small else 32), dev, cuda)
    for T, spec, label in ((1, False, "decode"), (1 + s["S"], True, "spec")):
        for B in s["batches"]:
            c = SsuCase(s, B, T, spec, dev, gen)
            y = c.ours()
            for row in sorted({0, B - 1}):
                want_y, want_h = c.ref(row)
                check(f"ours {label} B={B} row {row}", y[row * T:(row + 1) * T], want_y, 2e-2)
                check(f"ours state {label} B={B} row {row}",
                      c.pool[1, c.group[1][row, :want_h.shape[0]]], want_h, 2e-2)
            c.assert_clean(f"ours {label} B={B}")
            rec("ours", B, T, c.timed(c.ours), state_bytes(s, B, T if spec else 1))
            c.assert_clean(f"ours {label} B={B}, timed")
            c.i = 0
            if fla is not None:
                fla_rows(s, c, fla, rec, label)
            if cuda:
                jax_rows(s, c, rec, records)
            del c
            free(cuda)
    header = {
        "device": torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)",
        "torch": torch.__version__, "triton": triton.__version__, "fla": dist_version("fla-core"),
        "jax_triton": dist_version("jax-triton"), "shapes": dict(s),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "ceiling": ceiling,
        "timer": "timing.graph_ms (median device time of a CUDA-graph replay); ours_jax: GPU "
                 "busy time from a jax.profiler trace",
    }
    return {"header": header, "records": records}


def fla_rows(s, c: SsuCase, fla, rec, label: str) -> None:
    """fla's scalar-decay linear attention on the same rows (module docstring): checked
    against the reference, then alone and pooled."""
    B, T, H, G = c.B, c.T, s["H"], s["G"]
    group = torch.arange(H, device=c.cu.device) // (H // G)
    d = torch.nn.functional.softplus(c.ins["dt"].float() + c.ins["dt_bias"])  # [n, H]
    kw = dict(q=c.ins["C"][:, group][None], k=c.ins["B"][:, group][None],
              v=(d[..., None] * c.ins["x"].float()).to(torch.bfloat16)[None],
              g=(d * c.ins["A"])[None], scale=1.0, output_final_state=True,
              state_v_first=True, cu_seqlens=c.cu)
    Dx = c.ins["D"][:, None] * c.ins["x"].float()  # noqa: N806
    h0s = [c.pool[1].index_select(0, rb).contiguous() for rb, _, _ in c.sets]
    o, ht = fla(initial_state=h0s[0].clone(), **kw)
    want_y, want_h = c.ref(0)
    # (its v is d * x rounded to bf16, as a caller would pass it: bf16's tolerance)
    check(f"fla {label} B={B}", o[0, :T].float() + Dx[:T], want_y, 3e-2)
    check(f"fla final state {label} B={B}", ht[0], want_h[-1], 3e-2)
    note = "recurrence only; final state only" if c.spec else "recurrence only"
    rec("fla", B, T, c.timed(lambda: fla(initial_state=h0s[c.i % c.nsets], **kw)),
        state_bytes(s, B, 1), note)

    def pooled():
        rb, _, last = c.group
        _, h = fla(initial_state=c.pool[1].index_select(0, rb), **kw)
        c.pool[1].index_copy_(0, last, h)

    def pooled_indexing():
        rb, _, last = c.group
        _, h = fla(initial_state=c.pool[1][rb], **kw)
        c.pool[1][last] = h

    for method, fn in (("fla_pooled", pooled), ("fla_pooled_indexing", pooled_indexing)):
        c.i = 0
        c.pool[1, c.group[2]] = float("nan")
        fn()
        check(f"{method} final state {label} B={B}", c.pool[1, c.group[2][0]], want_h[-1], 3e-2)
        rec(method, B, T, c.timed(fn), state_bytes(s, B, 1), note)


def jax_rows(s, c: SsuCase, rec, records: List[Dict[str, Any]]) -> None:
    """ours_jax: the same launch jitted with the pool donated (GPU only)."""
    import jax
    import jax.numpy as jnp

    from jax_device_time import device_ms
    from mamba_align.backends.jax import ops as jops

    def J(t):  # noqa: N802
        if t.dtype == torch.bfloat16:
            return jnp.asarray(t.float().cpu().numpy()).astype(jnp.bfloat16)
        return jnp.asarray(t.cpu().numpy())

    B, T = c.B, c.T
    c.i = 0
    groups = [(J(rb), J(wbs)) for rb, wbs, _ in c.sets]
    args = [J(c.ins[n]) for n in INPUTS] + [J(c.cu), J(c.is_spec)]

    @functools.partial(jax.jit, donate_argnums=(0,))
    def ssu(carry, group, x, dt, A, B_, C, D, dt_bias, cu, spec):  # noqa: N803
        p, e = carry
        out = jops.selective_state_update(p, e, x, dt, A, B_, C, D, dt_bias, cu, group[0],
                                          group[1], spec, layer=1)
        return (out["pool"], out["errors"]), out["y"]

    carry = (J(c.pool), jnp.asarray(np.array([0, 2**31 - 1], np.int32)))
    carry, out = ssu(carry, groups[0], *args)
    check(f"ours_jax B={B}", torch.as_tensor(np.asarray(out[:T], np.float32)), c.ref(0)[0], 2e-2)

    def step(cr, calls=itertools.count(1)):
        return ssu(cr, groups[next(calls) % len(groups)], *args)[0]

    ms, carry, by_name = device_ms(step, carry)
    if np.asarray(carry[1]).tolist() != [0, 2**31 - 1]:
        raise SystemExit(f"ours_jax B={B}: faults {np.asarray(carry[1]).tolist()}")
    nbytes = state_bytes(s, B, T if c.spec else 1)
    rec("ours_jax", B, T, None, nbytes, "profiler busy time", ms=ms)
    records[-1]["ms_by_activity"] = by_name
    own = [v for k, v in by_name.items() if "selective_state_update_kernel" in k]
    if own:
        rec("ours_jax_kernel", B, T, None, nbytes, "the kernel's busy time", ms=sum(own))


def table(data: Dict[str, Any]) -> str:
    """Markdown: TB/s (µs) per method and batch, decode then spec rows."""
    h = data["header"]
    recs = data["records"]
    methods = list(dict.fromkeys(r["method"] for r in recs))
    batches = sorted({r["batch"] for r in recs})
    lines = [f"Copy ceiling {h['ceiling'].get('tbps', float('nan')):.2f} TB/s; {h['device']}, "
             f"torch {h['torch']}, triton {h['triton']}, fla {h['fla']}, {h['date']}", "",
             "| rows | method | " + " | ".join(f"B = {b}" for b in batches) + " |",
             "|---|---|" + "---:|" * len(batches)]
    for T in sorted({r["tokens_per_row"] for r in recs}):
        for m in methods:
            cells = []
            for b in batches:
                r = [x for x in recs if (x["method"], x["batch"], x["tokens_per_row"]) == (m, b, T)]
                cells.append(f"{r[0]['tbps']:.2f} ({r[0]['ms'] * 1e3:.1f} µs)" if r else "")
            if any(cells):
                lines.append(f"| {'decode' if T == 1 else f'spec T = {T}'} | {m} | "
                             + " | ".join(cells) + " |")
    return "\n".join(lines)


def section_md(results: Path) -> str:
    """BENCHMARKS.md's section from ``results/selective_state_h200.json`` (empty without
    it)."""
    path = results / "selective_state_h200.json"
    if not path.exists():
        return ""
    data = json.loads(path.read_text())
    sh = data["header"]["shapes"]
    return f"""## Mamba2 selective state update

Generated from `benchmarks/results/{path.name}` (written by
`benchmarks/bench_selective_state.py`).

- Shapes: H = {sh['H']} heads, head dim P = {sh['P']}, state size N = {sh['N']},
  G = {sh['G']} groups, bf16 x / dt / B / C, fp32 state pool, softplus on dt; S = {sh['S']}.
- TB/s counts state bytes only (read once + every state written); ours writes every
  candidate on spec rows, fla the final state only.
- fla: its scalar-decay linear attention (`fused_recurrent_simple_gla`), the same
  recurrence, with its inputs prepared before timing; pooled: gather, fla, scatter.
- No targets were set for this kernel. TB/s (µs):

{table(data)}
"""



def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="default: benchmarks/results (a temporary folder with --small)")
    ap.add_argument("--small", action="store_true", help="CPU smoke run: tiny shapes")
    args = ap.parse_args(argv)
    args.out = results_folder(args.out, args.small, "bench_ssu_")
    data = run(args)
    (args.out / "selective_state_h200.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / "selective_state_h200.md").write_text(table(data) + "\n")
    print(table(data))


if __name__ == "__main__":
    main()

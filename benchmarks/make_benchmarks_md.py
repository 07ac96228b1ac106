"""Rewrite ``BENCHMARKS.md`` from the results of ``benchmarks/bench_copy.py``,
``benchmarks/bench_dispatch.py``, ``benchmarks/bench_recurrent.py`` and
``benchmarks/bench_serving.py``.

Every number in the page comes from the JSON (card, versions, date, timings); only the
targets of the issue are written here. ``bench_copy.py`` imports :func:`tables_md` to print
the same tables it stores. The dispatch results are read from ``dispatch_h200.json`` next
to the copy JSON (or ``--dispatch-json``) when that file exists.

Usage::

    python benchmarks/make_benchmarks_md.py                       # repo-root BENCHMARKS.md
    python benchmarks/make_benchmarks_md.py --json R.json --out /tmp/BENCHMARKS.md \
        [--dispatch-json D.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "copy_h200.json"
DEFAULT_OUT = ROOT / "BENCHMARKS.md"
PLOT_LINK = "benchmarks/results/copy_h200.png"

# Targets of the issue, on the temporal pool (the bulk of the pre-copy's bytes).
MIN_TBPS_LARGE = 3.8  # TB/s at B >= 8
MIN_TBPS_B1 = 3.2  # TB/s at B = 1
MIN_SPEEDUP_VS_INDEXING = 4.5  # x torch advanced indexing, every B
MIN_JAX_VS_TORCH_PCT = 95.0  # % of torch eager (same kernel) at B >= 8, JAX host-timed
MIN_JAX_VS_XLA = 1.9  # x the XLA scatter, every B
MAX_JAX_DISPATCH_US = 30.0  # jitted JAX step (preprocess + pre-copy + resolve), host us
JAX = "jax-host"  # timing of the host-timed JAX records
JAX_DEVICE = "jax-device"  # device time of the JAX records (profiler)


def _timing(data: Dict[str, Any]) -> str:
    """Targets and main columns use CUDA-graph timings (device time) when present."""
    return "graph" if any(r.get("timing") == "graph" for r in data["records"]) else "eager"


def _lookup(data: Dict[str, Any], timing: Optional[str] = None) -> Dict[tuple, Dict[str, Any]]:
    timing = timing or _timing(data)
    return {(r["pool"], r["method"], r["batch"]): r for r in data["records"]
            if r.get("timing", "eager") == timing}


def batches(data: Dict[str, Any]) -> List[int]:
    return sorted({r["batch"] for r in data["records"]})


def _tbps(rec: Dict[tuple, Dict[str, Any]], pool: str, method: str, b: int) -> Optional[float]:
    r = rec.get((pool, method, b))
    return None if r is None else r["tbps"]


def _fmt(x: Optional[float], spec: str = ".2f", suffix: str = "") -> str:
    return "n/a" if x is None else f"{x:{spec}}{suffix}"


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or not b else a / b


def tables_md(data: Dict[str, Any]) -> str:
    """Two markdown tables: the temporal pool (ours vs torch vs the d2d ceiling) and the
    conv pool with the combined pre-copy. Throughput in TB/s (1e12 B/s, read + write)."""
    rec, d2d = _lookup(data), data["header"]["d2d"]["tbps"]
    eager = _lookup(data, "eager")
    lines = [
        f"Temporal pool, {_timing(data)} timing (eager: host launch included):",
        "",
        "| B | MB moved | ours TB/s | ours eager TB/s | torch indexing TB/s | index_copy_ TB/s "
        "| ours / indexing | ours / index_copy_ | % of d2d | no row copies: µs "
        "| 4 of the B rows copy: µs (TB/s) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in batches(data):
        ours = _tbps(rec, "temporal", "ours", b)
        ours_eager = _tbps(eager, "temporal", "ours", b)
        idx = _tbps(rec, "temporal", "torch_index", b)
        ic = _tbps(rec, "temporal", "index_copy", b)
        mb = rec[("temporal", "ours", b)]["bytes"] / 1e6 if ("temporal", "ours", b) in rec else None
        pct = _ratio(ours, d2d)
        empty = rec.get(("temporal", "ours_no_copy", b))
        lines.append(
            f"| {b} | {_fmt(mb, '.1f')} | {_fmt(ours)} | {_fmt(ours_eager)} | {_fmt(idx)} | {_fmt(ic)} "
            f"| {_fmt(_ratio(ours, idx), '.2f', 'x')} | {_fmt(_ratio(ours, ic), '.2f', 'x')} "
            f"| {_fmt(None if pct is None else 100 * pct, '.0f', '%')} "
            f"| {_fmt(empty and empty['ms'] * 1e3, '.1f')} "
            f"| {_few(rec.get(('temporal', 'ours_4_rows_copy', b)))} |"
        )
    lines += [
        "",
        f"Conv pool and the whole pre-copy, {_timing(data)} timing:",
        "",
        "| B | conv ours TB/s | conv torch indexing TB/s | conv ours / indexing "
        "| conv, no row copies: µs | pre-copy (temporal + conv) ms | pre-copy TB/s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in batches(data):
        ours = _tbps(rec, "conv", "ours", b)
        idx = _tbps(rec, "conv", "torch_index", b)
        comb = rec.get(("combined", "ours", b))
        empty = rec.get(("conv", "ours_no_copy", b))
        lines.append(
            f"| {b} | {_fmt(ours)} | {_fmt(idx)} | {_fmt(_ratio(ours, idx), '.2f', 'x')} "
            f"| {_fmt(empty and empty['ms'] * 1e3, '.1f')} "
            f"| {_fmt(comb and comb['ms'], '.4f')} | {_fmt(comb and comb['tbps'])} |"
        )
    return "\n".join(lines) + "\n\n" + jax_table_md(data)


def _few(r: Optional[Dict[str, Any]]) -> str:
    return "n/a" if r is None else f"{r['ms'] * 1e3:.1f} ({r['tbps']:.2f})"


def _pct(x: Optional[float]) -> Optional[float]:
    return None if x is None else 100 * x


def jax_table_md(data: Dict[str, Any]) -> str:
    """Our kernels from JAX (jitted, pool donated) vs the same kernels from torch and vs the
    XLA scatter ``p.at[:, dst].set(p[:, src])``: device time (profiler) and host timer."""
    jx, dev, torch_t = _lookup(data, JAX), _lookup(data, JAX_DEVICE), _lookup(data)
    head = (f"JAX (jitted, pool donated) vs torch ({_timing(data)} timing, same kernel) and vs "
            "the XLA scatter. Device: GPU busy time per call from a `jax.profiler` trace; host: "
            "back-to-back calls, dispatch included:")
    if not jx:
        return head + "\n\nnot measured"
    lines = [head, "",
             "| pool | B | jax device TB/s | jax host TB/s | torch TB/s | jax / torch (device) "
             "| xla device TB/s | xla host TB/s | jax / xla (device) | jax / xla (host) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for pool in ("temporal", "conv"):
        for b in batches(data):
            ours_d, ours_h = _tbps(dev, pool, "jax", b), _tbps(jx, pool, "jax", b)
            torch_ = _tbps(torch_t, pool, "ours", b)
            xla_d, xla_h = _tbps(dev, pool, "xla_scatter", b), _tbps(jx, pool, "xla_scatter", b)
            lines.append(f"| {pool} | {b} | {_fmt(ours_d)} | {_fmt(ours_h)} | {_fmt(torch_)} "
                         f"| {_fmt(_pct(_ratio(ours_d, torch_)), '.0f', '%')} | {_fmt(xla_d)} "
                         f"| {_fmt(xla_h)} | {_fmt(_ratio(ours_d, xla_d), '.2f', 'x')} "
                         f"| {_fmt(_ratio(ours_h, xla_h), '.2f', 'x')} |")
    return "\n".join(lines)


def _check(rows: List[tuple], want: float, unit: str) -> tuple:
    """``rows`` = [(batch, value)]: the worst value, and met / missed / not measured. A
    batch without a value fails the target: it is not shown to be met there."""
    vals = [(b, v) for b, v in rows if v is not None]
    if not vals:
        return "not measured", "not measured"

    def where(b: Any) -> str:
        return b if isinstance(b, str) else f"B = {b}"
    b, worst = min(vals, key=lambda bv: bv[1])
    gone = [where(b) for b, v in rows if v is None]
    text = f"{worst:.2f}{unit} (worst, at {where(b)})"
    if gone:
        text += f"; n/a at {', '.join(gone)}"
    return text, "met" if worst >= want and not gone else "missed"


def targets_md(data: Dict[str, Any]) -> str:
    rec, bs, timing = _lookup(data), batches(data), _timing(data)
    ours = {b: _tbps(rec, "temporal", "ours", b) for b in bs}
    speedup = {b: _ratio(ours[b], _tbps(rec, "temporal", "torch_index", b)) for b in bs}
    dev = _lookup(data, JAX_DEVICE)
    pools = ("temporal", "conv")
    vs_torch = {(p, b): _pct(_ratio(_tbps(dev, p, "jax", b), _tbps(rec, p, "ours", b)))
                for p in pools for b in bs}
    vs_xla = {(p, b): _ratio(_tbps(dev, p, "jax", b), _tbps(dev, p, "xla_scatter", b))
              for p in pools for b in bs}
    rows = [
        (f"ours ≥ {MIN_TBPS_LARGE} TB/s at B ≥ 8 ({timing} timing)",
         _check([(b, ours[b]) for b in bs if b >= 8], MIN_TBPS_LARGE, " TB/s")),
        (f"ours ≥ {MIN_TBPS_B1} TB/s at B = 1 ({timing} timing)",
         _check([(b, ours[b]) for b in bs if b == 1], MIN_TBPS_B1, " TB/s")),
        (f"ours ≥ {MIN_SPEEDUP_VS_INDEXING}× torch advanced indexing at every B "
         f"({timing} timing)",
         _check([(b, speedup[b]) for b in bs], MIN_SPEEDUP_VS_INDEXING, "×")),
        (f"JAX ≥ {MIN_JAX_VS_TORCH_PCT:.0f}% of torch (same kernel, {timing} timing) at B ≥ 8, "
         "both pools (JAX device time)",
         _check([(f"{p} {b}", v) for (p, b), v in vs_torch.items() if b >= 8],
                MIN_JAX_VS_TORCH_PCT, "%")),
        (f"JAX ≥ {MIN_JAX_VS_XLA}× the XLA scatter at every B, both pools (device time)",
         _check([(f"{p} {b}", v) for (p, b), v in vs_xla.items()], MIN_JAX_VS_XLA, "×")),
    ]
    lines = ["| target | measured | status |",
             "|---|---|---|"]
    lines += [f"| {t} | {m} | {s} |" for t, (m, s) in rows]
    return "\n".join(lines)


def _shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def benchmarks_md(data: Dict[str, Any], source: Path = DEFAULT_JSON,
                  plot_link: str = PLOT_LINK, dispatch: Optional[Dict[str, Any]] = None,
                  dispatch_source: Optional[Path] = None) -> str:
    h = data["header"]
    d2d = h["d2d"]
    cfg = h["config"]
    bias = cfg.get("conv_bias", cfg.get("conv_shift"))  # results before 2026-12-01: conv_shift
    return f"""# Benchmarks

Generated by `benchmarks/make_benchmarks_md.py` from `{_shown(source)}`
(written by `benchmarks/bench_copy.py`); do not edit by hand.

## State-block pre-copy

- Card: {h['device']}
- Versions: torch {h['torch']}, triton {h['triton']}{_jax_versions(h)}
- Date: {h['date']}
- Temporal pool: `{cfg['temporal_shape']}` {cfg['temporal_dtype']}
  ({cfg['temporal_block_bytes'] / 2**20:.2f} MiB per block).
- Conv pool: `{cfg['conv_shape']}` {cfg['conv_dtype']}, {cfg['conv_layout']} layout, bias
  {bias} on every row (only the `W - {bias}` rows that move are counted).
- Each batch row copies a random source block into a random destination block; all ids
  are distinct. Bytes moved = read + write of the copied data; TB/s = 1e12 B/s.
- Timing: {h['timer']}{'; ' + h['jax_timer'] if 'jax_timer' in h else ''}.
- Ceiling: device-to-device `b.copy_(a)` of {d2d['bytes'] / 2 / 2**30:.2f} GiB, measured in
  the same run: {d2d['tbps']:.2f} TB/s ({d2d['ms']:.3f} ms).

### Targets

{targets_md(data)}

### Results

{tables_md(data)}

![pre-copy throughput vs batch]({plot_link})

{dispatch_md(dispatch, dispatch_source)}

{checks_md(source.parent)}

{_recurrent_md(source.parent)}

{_serving_md(source.parent)}

{_selective_state_md(source.parent)}

Reproduce on the GPU:

```
python benchmarks/bench_copy.py            # writes benchmarks/results/copy_h200.*
python benchmarks/bench_dispatch.py        # writes benchmarks/results/dispatch_h200.json
python benchmarks/bench_recurrent.py       # writes benchmarks/results/recurrent_h200.*
python benchmarks/bench_serving.py         # writes benchmarks/results/serving_h200.*
python benchmarks/bench_selective_state.py # writes benchmarks/results/selective_state_h200.*
python benchmarks/make_benchmarks_md.py    # rewrites BENCHMARKS.md
```
"""


def _recurrent_md(results: Path) -> str:
    from recurrent_report import recurrent_md  # (it imports this module's helpers)
    return recurrent_md(results)


def _serving_md(results: Path) -> str:
    from bench_serving import serving_md
    return serving_md(results)


def _selective_state_md(results: Path) -> str:
    from bench_selective_state import section_md
    return section_md(results)


def _jax_versions(h: Dict[str, Any]) -> str:
    if "jax" not in h:
        return ""
    jt = f", jax-triton {h['jax_triton']}" if h.get("jax_triton") else ""
    return f", jax {h['jax']} ({h.get('jax_backend', '?')}){jt}"


def dispatch_md(data: Optional[Dict[str, Any]], source: Optional[Path] = None) -> str:
    """The host dispatch section from ``bench_dispatch.py``'s JSON (None: not measured)."""
    target = f"jitted JAX step dispatch ≤ {MAX_JAX_DISPATCH_US:.0f} µs"
    head = "## Host dispatch of one step\n\n"
    if data is None:
        return head + f"| target | measured | status |\n|---|---|---|\n| {target} " \
                      "| not measured | not measured |"
    h, cfg = data["header"], data["header"]["config"]
    us = {r["method"]: r.get("dispatch_us", r["us_per_step"]) for r in data["records"]}
    # a scan's per-step figure is the slower of issuing and running it (device included)
    us.update({r["method"]: max(r.get("dispatch_us", 0.0), r["us_per_step"])
               for r in data["records"] if r["method"].startswith("jax_scan")})

    def row(label: str, method: str) -> str:
        v = us.get(method)
        status = "not measured" if v is None else "met" if v <= MAX_JAX_DISPATCH_US else "missed"
        return f"| {target}: {label} | {_fmt(v, '.1f', ' µs')} | {status} |"

    floor = us.get("jax_floor_x_plus_1")
    scans = sorted(m for m in us if m.startswith("jax_scan") and not m.endswith("+cmdbuf"))
    lines = [
        f"Generated from `{_shown(source)}` (written by `benchmarks/bench_dispatch.py`).",
        "",
        f"- Card: {h['device']}; host CPU: {h.get('cpu', 'not recorded')}",
        f"- Versions: torch {h['torch']}, triton {h['triton']}{_jax_versions(h)}",
        f"- Date: {h['date']}",
        f"- Step: {h['step']}",
        f"- Batch: {cfg['rows']} rows of {cfg['num_slots']} slots, B = {cfg['block_size']}, "
        f"S = {cfg['num_spec']}, {cfg['num_layers']} layers, pools "
        + ", ".join(f"{n} `{s}`" for n, s in cfg["pools"].items()) + ".",
        f"- Timing: {h['timer']}.",
    ]
    lines += [f"- `{k}`: {v}." for k, v in h.get("variants", {}).items()]
    lines += [
        "",
        "| target | measured | status |",
        "|---|---|---|",
        row("one jitted call per step", "jax_jit"),
    ]
    lines += [row(f"per step of a jitted `lax.scan` ({m})", m) for m in scans]
    lines += [row(f"per step of a jitted `lax.scan`, XLA command buffers ({m}+cmdbuf)",
                  m + "+cmdbuf") for m in scans]
    if floor is not None:
        lines += ["", f"Any jitted call costs {floor:.1f} µs to issue on this host (`x + 1`, "
                      "donated), with command buffers "
                      f"{_fmt(us.get('jax_floor_x_plus_1+cmdbuf'), '.1f')} µs."]
    lines += [
        "",
        "| method | dispatch µs | µs per step (sustained) | rows |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {r['method']} | {_fmt(r.get('dispatch_us'), '.1f')} | {r['us_per_step']:.1f} "
              f"| {r['rows']} |" for r in data["records"]]
    return head + "\n".join(lines)


#: The checks' cost: (label, file with the checks, same-run file of the version before them)
CHECK_PAIRS = (("64 rows", "dispatch_h200.json", "dispatch_baseline_rows64_h200.json"),
               ("512 rows", "dispatch_rows512_h200.json", "dispatch_baseline_rows512_h200.json"))
CHECK_METHODS = ("torch_graph", "torch_eager", "jax_jit", "jax_scan16_per_step")


def checks_md(results: Path) -> str:
    """What the bad-input checks cost per step: ``bench_dispatch.py`` on this version and,
    in the same run, on the version before the checks (``--label baseline_rows<N>``)."""
    head = "## What the bad-input checks cost per step\n\n"
    pairs = [(label, results / a, results / b) for label, a, b in CHECK_PAIRS
             if (results / a).exists() and (results / b).exists()]
    if not pairs:
        return head + "Not measured."
    date = json.loads(pairs[0][1].read_text())["header"]["date"]
    own = own_cost_md(results)
    nxt = " The checks' own cost, measured more directly, is in the next table." if own else ""
    lines = ["Whole steps (preprocess + postprocess and their copy launches, nothing to copy), "
             "µs per step (sustained), from `bench_dispatch.py` run in one session on this "
             "version and on the version before the checks (`.baseline/`, see the Makefile). "
             "That version also has the copy grids of its day: since then the copy launches "
             "aim at fewer programs, so the change is the checks plus cheaper copy launches "
             "(the checks' own cost, kernel by kernel: benchmarks/README.md). "
             "`torch_graph` is device time under CUDA-graph replay; the other rows are "
             "host-bound and vary from run to run by more than the checks' cost.", "",
             f"These runs date from {date} and may predate the current kernels.{nxt}", "",
             "| batch | method | before the checks | fast path (checks on device) | change "
             "| checked mode (`validate=True`) |", "|---|---|---:|---:|---:|---:|"]
    for label, new_path, old_path in pairs:
        new, old = (json.loads(p.read_text()) for p in (new_path, old_path))
        n = {r["method"]: r["us_per_step"] for r in new["records"]}
        o = {r["method"]: r["us_per_step"] for r in old["records"]}
        for m in CHECK_METHODS:
            if m in n and m in o:
                checked = n.get(m.replace("_per_step", "") + "_checked")
                if m == "torch_graph":
                    checked = None  # the checked mode synchronises: no CUDA graph
                lines.append(f"| {label} | {m} | {o[m]:.1f} | {n[m]:.1f} | "
                             f"{(n[m] / o[m] - 1) * 100:+.0f} % | {_fmt(checked, '.1f')} |")
    lines += ["", "Sources: " + ", ".join(f"`{_shown(p)}`" for _, a, b in pairs for p in (a, b))
              + "."]
    return head + "\n".join(lines) + own


def _kernel_us(run: Dict[str, Any], name: str) -> float:
    """The device time of the one kernel called ``name`` in a probe_step_kernels run."""
    (us,) = [k["us"] for k in run["kernels"] if k["name"] == name]
    return us


#: ``probe_step_kernels.py`` labels: the version before the checks with its own copy grids
#: and with the current ones (``--variant newgrids``), and this version, all from one run
OWN_COST = ("baseline", "baseline_newgrids", "current")


def own_cost_md(results: Path) -> str:
    """The checks' own cost: ``probe_step_kernels.py``'s graph-replayed step on this
    version and, in the same run, on the version before the checks with the current copy
    grids; the two bookkeeping kernels kernel by kernel."""
    runs = {}
    for rows in (64, 512):
        paths = [results / f"probe_step_kernels_{label}_rows{rows}_h200.json" for label in OWN_COST]
        if all(p.exists() for p in paths):
            runs[rows] = [json.loads(p.read_text()) for p in paths]
    if not runs:
        return ""
    lines = ["", "", "The checks' own cost: `probe_step_kernels.py` replays the same step from a "
             "CUDA graph (device time per step, event timer; each kernel's time from the "
             "profiler) on this version and, in the same run, on the version before the "
             "checks, once with its own copy grids and once with the current ones "
             "(`--variant newgrids`: those of `b6764f2`), so that only the checks differ. "
             "Run of "
             f"{runs[min(runs)][2]['date']}.", "",
             "| batch | before the checks | same, current copy grids | fast path | checks' own "
             "cost | `preprocess_resolve` | `postprocess` |", "|---|---:|---:|---:|---:|---:|---:|"]
    for rows, (old, same_grids, new) in runs.items():
        t = [r["us_per_step_event_timer"] for r in (old, same_grids, new)]
        k = [[_kernel_us(r, name) for r in (same_grids, new)]
             for name in ("preprocess_resolve_kernel", "postprocess_kernel")]
        lines.append(f"| {rows} rows | {t[0]:.2f} | {t[1]:.2f} | {t[2]:.2f} | "
                     f"{(t[2] / t[1] - 1) * 100:+.1f} % | "
                     + " | ".join(f"{a:.2f} -> {b:.2f}" for a, b in k) + " |")
    lines += ["", "µs; the kernel columns are the version before the checks (current copy "
              "grids) -> this version. Sources: `benchmarks/results/probe_step_kernels_"
              "{baseline,baseline_newgrids,current}_rows{64,512}_h200.json`."]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON, help="bench_copy.py results")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="markdown file to (re)write")
    ap.add_argument("--dispatch-json", type=Path,
                    help="bench_dispatch.py results (default: dispatch_h200.json next to --json; "
                         "skipped when absent)")
    args = ap.parse_args(argv)
    data = json.loads(args.json.read_text())
    dpath = args.dispatch_json or args.json.parent / "dispatch_h200.json"
    dispatch = json.loads(dpath.read_text()) if dpath.exists() else None
    args.out.write_text(benchmarks_md(data, args.json, dispatch=dispatch, dispatch_source=dpath))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

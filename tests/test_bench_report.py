"""The benchmark reports mark each target met or missed from the data they are given: the
recurrent benchmark's (benchmarks/recurrent_report.py, which also states the pooled ratio the
run's copy ceiling allows) and the copy benchmark's (benchmarks/make_benchmarks_md.py); a
batch without a record never counts as met."""

import importlib
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _benchmark_function(module, name):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return getattr(importlib.import_module(module), name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def _editing(stored, render):
    """``run(edit)``: ``render`` of a copy of the stored run ``stored`` (a file in
    benchmarks/results), its records changed by ``edit``."""
    data = json.loads((RESULTS / stored).read_text())

    def run(edit):
        d = json.loads(json.dumps(data))
        edit(d)
        return render(d)
    return run


@pytest.fixture
def report(tmp_path):
    """recurrent_md over a copy of the stored run, with records changed by ``edit``."""
    recurrent_md = _benchmark_function("recurrent_report", "recurrent_md")

    def render(d):
        (tmp_path / "recurrent_h200.json").write_text(json.dumps(d))
        return recurrent_md(tmp_path)
    return _editing("recurrent_h200.json", render)


def _record(d, op, method, batch, tokens=1):
    (r,) = [r for r in d["records"] if (r["op"], r["method"], r["batch"],
                                        r["tokens_per_row"]) == (op, method, batch, tokens)]
    return r


def _target(md, name):
    (line,) = [line for line in md.splitlines() if line.startswith(f"| {name}")]
    return line


def _set_tbps(d, op, method, batch, tbps):
    r = _record(d, op, method, batch)
    r["ms"] *= r["tbps"] / tbps  # the same bytes in another time
    r["tbps"] = tbps


def test_a_target_is_met_only_when_every_batch_passes(report):
    name = "gdn decode ≥ 3.9 TB/s at B ≥ 64"

    def rates(a, b):
        return lambda d: (_set_tbps(d, "gdn", "ours", 64, a), _set_tbps(d, "gdn", "ours", 256, b))
    assert _target(report(rates(3.95, 4.10)), name).endswith("| 3.95, 4.10 | met |")
    assert _target(report(rates(3.89, 4.10)), name).endswith("| 3.89, 4.10 | **missed** |")


def test_a_missing_record_is_not_met(report):
    def drop(d):
        d["records"].remove(_record(d, "gdn", "ours", 256))
    line = _target(report(drop), "gdn decode ≥ 3.9 TB/s at B ≥ 64")
    assert "n/a" in line and line.endswith("**missed** |")


def test_the_pooled_bound_is_the_ceiling_over_fla_pooled(report):
    def pooled(d):
        ceiling = d["header"]["ceiling"]["tbps"]
        _set_tbps(d, "gdn", "fla_pooled", 64, ceiling / 4.5)
        _set_tbps(d, "gdn", "fla_pooled", 256, ceiling / 3.25)
    md = report(pooled)
    assert "would be at most 4.50x, 3.25x fla pooled" in md
    assert "at B = 64, 256" in md


def test_another_cards_run_is_shown_apart_and_never_read_by_the_targets(tmp_path):
    """A stored run on another card (recurrent_h100.json) gets a section of its own after
    the H200 run, with its own rows; the targets come from the H200 run alone, even where
    the other run would meet one the H200 run misses."""
    recurrent_md = _benchmark_function("recurrent_report", "recurrent_md")
    h200 = json.loads((RESULTS / "recurrent_h200.json").read_text())
    other = json.loads(json.dumps(h200))
    other["header"]["device"] = "Some Other Card"
    other["header"]["ceiling"]["tbps"] = 1.25
    other["header"]["date"] = "2099-01-01T00:00:00+00:00"  # after the H200 run
    _set_tbps(h200, "gdn", "ours", 64, 3.5)  # missed on the H200
    _set_tbps(other, "gdn", "ours", 64, 5.0)  # met on the other card
    tokens = other["header"]["shapes"]["prefill"]
    _record(other, "prefill", "ours", 1, tokens)["ms"] = 0.123456
    (tmp_path / "recurrent_h200.json").write_text(json.dumps(h200))
    alone = recurrent_md(tmp_path)
    assert "Some Other Card" not in alone
    (tmp_path / "recurrent_h100.json").write_text(json.dumps(other))
    md = recurrent_md(tmp_path)
    assert md.startswith(alone)
    extra = md[len(alone):]
    assert "### The same benchmark on another card: Some Other Card" in extra
    assert "copy ceiling was 1.25 TB/s" in extra
    assert "| prefill | ours | 1 | 123.5 |" in extra
    (row,) = [line for line in extra.splitlines() if line.startswith("| gdn | 1 | 64 | ")]
    assert "| 5.00 |" in row
    assert "It ran after the H200 run" in extra
    assert "### Targets" not in extra
    name = "gdn decode ≥ 3.9 TB/s at B ≥ 64"
    assert _target(md, name) == _target(alone, name)
    assert _target(md, name).endswith("**missed** |")


def test_the_no_draft_pool_targets_read_their_own_rows(report):
    """Rows of a pool without drafts (``conv_s0``, ``conv_s0_sd``) get targets of their own,
    each against fla as timed on those windows; a run without them shows none."""
    name = "conv, DS pool without drafts (W = K − 1), ≥ 95 % of fla alone, every B"

    def without(d):  # the stored run's own no-draft rows dropped
        d["records"] = [r for r in d["records"] if not r["op"].startswith("conv_s0")]
    assert name not in report(without)

    def no_draft(ours_us, fla_us):
        def edit(d):
            without(d)
            for B in d["header"]["shapes"]["batches"]:
                for op, method, us in (("conv_s0", "ours", ours_us), ("conv_s0_sd", "ours", 1.0),
                                       ("conv_s0", "fla", fla_us), ("conv_s0", "fla_pooled", 9.0)):
                    d["records"].append({"op": op, "method": method, "batch": B,
                                         "tokens_per_row": 1, "ms": us * 1e-3, "bytes": 1,
                                         "tbps": 1.0, "note": ""})
        return edit
    md = report(no_draft(2.0, 1.95))
    assert _target(md, name).endswith("| 98 %, 98 %, 98 %, 98 % | met |")
    assert _target(md, name.replace("DS", "SD")).endswith("| 195 %, 195 %, 195 %, 195 % | met |")
    pooled = "conv, DS pool without drafts (W = K − 1), ≥ 3x fla pooled, every B"
    assert _target(md, pooled).endswith("| 4.5x, 4.5x, 4.5x, 4.5x | met |")
    assert _target(report(no_draft(2.0, 1.8)), name).endswith("| 90 %, 90 %, 90 %, 90 % | **missed** |")
    assert "| conv_s0_sd | 1 | 1 | 1.0 |" in md  # the per-B table shows the rows


# -- the copy benchmark's targets (benchmarks/make_benchmarks_md.py) ----------------------------
@pytest.fixture
def copy_targets():
    """targets_md over a copy of the stored copy run, with records changed by ``edit``."""
    return _editing("copy_h200.json", _benchmark_function("make_benchmarks_md", "targets_md"))


def _copy_tbps(d, pool, method, timing):
    """{batch: record} of one method's records."""
    return {r["batch"]: r for r in d["records"]
            if (r["pool"], r["method"], r.get("timing")) == (pool, method, timing)}


def _scale(d, pool, method, timing, rate, batches=None):
    """Sets a method's TB/s to ``rate(batch, the record it is compared with)``."""
    for b, r in _copy_tbps(d, pool, method, timing).items():
        if batches is None or b in batches:
            r["tbps"] = rate(b)


def _ours(d, pool, b):
    return _copy_tbps(d, pool, "ours", "graph")[b]["tbps"]


def _jax(d, pool, b):
    return _copy_tbps(d, pool, "jax", "jax-device")[b]["tbps"]


# Each edit puts every value a target compares at 1.01 times its threshold, except at batch
# ``at`` (and, for the two-pool targets, one pool), where it is ``m`` times it.
def _large(d, m, at):
    _scale(d, "temporal", "ours", "graph", lambda b: 3.8 * (m if b == at else 1.01),
           {8, 64, 256})


def _b1(d, m, at):
    _scale(d, "temporal", "ours", "graph", lambda b: 3.2 * m, {1})


def _indexing(d, m, at):
    _scale(d, "temporal", "torch_index", "graph",
           lambda b: _ours(d, "temporal", b) / (4.5 * (m if b == at else 1.01)))


def _jax_torch(d, m, at):
    for p in ("temporal", "conv"):
        _scale(d, p, "jax", "jax-device", lambda b, p=p: 0.95 * _ours(d, p, b)
               * (m if (b, p) == (at, "conv") else 1.01), {8, 64, 256})


def _jax_xla(d, m, at):
    for p in ("temporal", "conv"):
        _scale(d, p, "xla_scatter", "jax-device", lambda b, p=p: _jax(d, p, b)
               / (1.9 * (m if (b, p) == (at, "temporal") else 1.01)))


COPY_TARGETS = [("ours ≥ 3.8 TB/s at B ≥ 8", _large), ("ours ≥ 3.2 TB/s at B = 1", _b1),
                ("ours ≥ 4.5× torch advanced indexing", _indexing),
                ("JAX ≥ 95% of torch", _jax_torch), ("JAX ≥ 1.9× the XLA scatter", _jax_xla)]


@pytest.mark.parametrize("name,edit", COPY_TARGETS, ids=[t[0] for t in COPY_TARGETS])
def test_each_copy_target_flips_at_its_threshold(copy_targets, name, edit):
    at = 1 if "B = 1" in name else 64
    assert _target(copy_targets(lambda d: edit(d, 1.01, at)), name).endswith("| met |")
    assert _target(copy_targets(lambda d: edit(d, 0.99, at)), name).endswith("| missed |")


def test_a_copy_target_is_missed_where_a_batch_has_no_record(copy_targets):
    def drop(d):  # the temporal pool's graph-timed runs at B = 1, 8 and 64
        d["records"] = [r for r in d["records"] if not (
            (r["pool"], r["method"], r.get("timing")) == ("temporal", "ours", "graph")
            and r["batch"] in (1, 8, 64))]
    md = copy_targets(drop)
    line = _target(md, "ours ≥ 3.8 TB/s at B ≥ 8")
    assert line.endswith("| missed |") and "n/a at B = 8, B = 64" in line, line
    assert _target(md, "ours ≥ 4.5× torch advanced indexing").endswith("| missed |")
    assert _target(md, "ours ≥ 3.2 TB/s at B = 1").endswith("| not measured | not measured |")


# -- every recurrent target flips at its threshold ----------------------------------------------
def _ms(d, op, method, batch, tokens=1):
    return _record(d, op, method, batch, tokens)["ms"]


def _set_ms(d, op, method, batch, ms, tokens=1):
    r = _record(d, op, method, batch, tokens)
    r["tbps"] *= r["ms"] / ms  # the same bytes in another time
    r["ms"] = ms


def _each(d, batches, f, m, at):
    """``f(d, B, factor)`` at every batch: ``m`` at batch ``at``, 1.01 (passing) elsewhere."""
    for B in batches:
        f(d, B, m if B == at else 1.01)


EVERY, BIG = (1, 16, 64, 256), (64, 256)
# (target, batches, f(d, B, factor): the target's value at B set to factor x its threshold,
# factor > 1 passing); a ``≤`` target's f divides by the factor
RECURRENT_TARGETS = [
    ("gdn decode ≥ 95 % of fla alone", BIG,
     lambda d, B, f: _set_ms(d, "gdn", "fla", B, _ms(d, "gdn", "ours", B) * 0.95 * f)),
    ("gdn decode ≥ 4x fla pooled at B ≥ 64 (`index_select`", BIG,
     lambda d, B, f: _set_ms(d, "gdn", "fla_pooled", B, _ms(d, "gdn", "ours", B) * 4 * f)),
    ("gdn decode ≥ 4x fla pooled at B ≥ 64 (plain indexing", BIG,
     lambda d, B, f: _set_ms(d, "gdn", "fla_pooled_indexing", B,
                             _ms(d, "gdn", "ours", B) * 4 * f)),
    ("gdn decode ≤ 3.5 µs at B = 1", (1,),
     lambda d, B, f: _set_ms(d, "gdn", "ours", B, 3.5e-3 / f)),
    ("gdn spec ≥ 3.6 TB/s at B ≥ 64", BIG,
     lambda d, B, f: _set_ms(d, "gdn", "ours", B, _ms(d, "gdn", "ours", B, 4)
                             * _record(d, "gdn", "ours", B, 4)["tbps"] / (3.6 * f), 4)),
    ("conv (DS pool) ≥ 95 % of fla alone", EVERY,
     lambda d, B, f: _set_ms(d, "conv", "fla", B, _ms(d, "conv", "ours", B) * 0.95 * f)),
    ("conv (DS pool) ≥ 3x fla pooled", EVERY,
     lambda d, B, f: _set_ms(d, "conv", "fla_pooled", B, _ms(d, "conv", "ours", B) * 3 * f)),
    ("conv, SD pool, ≥ 95 % of fla alone", EVERY,
     lambda d, B, f: _set_ms(d, "conv_sd", "ours", B, _ms(d, "conv", "fla", B) / (0.95 * f))),
    ("conv, SD pool, ≥ 3x fla pooled", EVERY,
     lambda d, B, f: _set_ms(d, "conv_sd", "ours", B, _ms(d, "conv", "fla_pooled", B) / (3 * f))),
    ("JAX ≥ 95 % of torch (device time), gdn decode", EVERY,
     lambda d, B, f: _set_ms(d, "gdn", "ours_jax", B, _ms(d, "gdn", "ours", B) / (0.95 * f))),
    ("JAX ≥ 95 % of torch, gdn decode, the kernel's own", EVERY,
     lambda d, B, f: _set_ms(d, "gdn", "ours_jax_kernel", B,
                             _ms(d, "gdn", "ours", B) / (0.95 * f))),
    ("JAX ≥ 95 % of torch (device time), conv decode, DS", EVERY,
     lambda d, B, f: _set_ms(d, "conv", "ours_jax", B, _ms(d, "conv", "ours", B) / (0.95 * f))),
    ("JAX ≥ 95 % of torch (device time), conv decode, SD", EVERY,
     lambda d, B, f: _set_ms(d, "conv_sd", "ours_jax", B,
                             _ms(d, "conv_sd", "ours", B) / (0.95 * f))),
    ("copy-free per step / pre-copy per step ≤ 1", EVERY,
     lambda d, B, f: _set_ms(d, "step", "copy_free", B, _ms(d, "step", "pre_copy", B) / f)),
]


@pytest.mark.parametrize("name,batches,f", RECURRENT_TARGETS,
                         ids=[t[0] for t in RECURRENT_TARGETS])
def test_each_recurrent_target_flips_at_its_threshold(report, name, batches, f):
    at = batches[-1]
    assert _target(report(lambda d: _each(d, batches, f, 1.01, at)), name).endswith("| met |")
    missed = _target(report(lambda d: _each(d, batches, f, 0.99, at)), name)
    assert missed.endswith("| **missed** |"), missed

"""The recurrent benchmark's report marks each target met or missed from the data it is given,
and states the pooled ratio the run's copy ceiling allows (benchmarks/recurrent_report.py)."""

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture
def report(tmp_path):
    """recurrent_md over a copy of the stored run, with records changed by ``edit``."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from recurrent_report import recurrent_md
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    data = json.loads((RESULTS / "recurrent_h200.json").read_text())

    def run(edit):
        d = json.loads(json.dumps(data))
        edit(d)
        (tmp_path / "recurrent_h200.json").write_text(json.dumps(d))
        return recurrent_md(tmp_path)
    return run


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

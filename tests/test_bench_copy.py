"""The copy benchmark's smoke run (``--small``: Triton's interpreter on the CPU, tiny pools
compiled on a GPU): it runs, checks every copy it times (torch and JAX, the error flag
clear afterwards), and writes its records and plot."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("jax", reason="the benchmark's JAX section is part of what is checked")
pytest.importorskip("matplotlib", reason="the benchmark draws its plot")


def test_small_run_checks_and_records_every_method(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_copy.py"), "--small",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    data = json.loads((tmp_path / "copy_h200.json").read_text())
    seen = {(x["method"], x["pool"]) for x in data["records"]}
    assert {("ours", "temporal"), ("ours", "conv"), ("ours", "combined"),
            ("ours_no_copy", "temporal"), ("ours_no_copy", "conv"),
            ("jax", "temporal"), ("jax", "conv"),
            ("xla_scatter", "temporal"), ("xla_scatter", "conv")} <= seen
    assert {x["batch"] for x in data["records"]} == {1, 2}
    assert all(x["ms"] > 0 for x in data["records"])
    assert (tmp_path / "copy_h200.md").exists() and (tmp_path / "copy_h200.png").exists()

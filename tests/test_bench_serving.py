"""The serving benchmark's CPU smoke run (``--small``: the tiny model in Triton's
interpreter): every method serves the workload with its logits checked against each
request run alone, and the cache saves prompt tokens."""

import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def test_small_run_checks_and_records_every_method(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_serving.py"), "--small",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "serving_h200.json").read_text())
    runs = {(x["method"], x["caching"]): x for x in data["records"]}
    methods = ("torch_graphs",) * torch.cuda.is_available() + ("torch_eager", "jax")
    assert set(runs) == {(m, c) for m in methods for c in (True, False)}
    for (method, caching), x in runs.items():
        assert x["checked_positions"] > 0 and x["steps"] > 0
        assert (x["hit_tokens"] > 0) == caching
        assert x["ttft_ms_second_turns"]["n"] == data["header"]["requests"] // 2
    for m in ("torch_eager", "jax"):
        assert runs[m, True]["computed_tokens"] < runs[m, False]["computed_tokens"]
    assert (tmp_path / "serving_h200.md").read_text().startswith("| method |")

"""The recurrent benchmarks' CPU smoke runs (``--small``, Triton's interpreter): they run,
check our kernels against the reference before timing, and write their records."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_small_run_writes_every_op(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_recurrent.py"), "--small",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "recurrent_h200.json").read_text())
    seen = {(x["op"], x["method"]) for x in data["records"]}
    assert {("gdn", "ours"), ("conv", "ours"), ("conv_sd", "ours"), ("conv_s0", "ours"),
            ("conv_s0_sd", "ours"), ("prefill", "ours"), ("prefill", "ours_chunked"),
            ("step", "pre_copy"),
            ("step", "copy_free")} <= seen
    import torch
    if torch.cuda.is_available():  # the JAX rows, on both conv pools
        assert {("gdn", "ours_jax"), ("conv", "ours_jax"), ("conv_sd", "ours_jax")} <= seen
    assert all(x["ms"] > 0 for x in data["records"])
    assert (tmp_path / "recurrent_h200.md").read_text().startswith("Copy ceiling")


def test_the_conv_probe_runs_on_a_pool_without_drafts(tmp_path):
    # probe_conv_update.py --conv-drafts 0: decode rows only, on windows of K - 1 rows
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "probe_conv_update.py"),
                        "--small", "--out", str(tmp_path / "new"), "--conv-drafts", "0",
                        "--layouts", "DS", "SD", "--tiles", "default"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads((tmp_path / "new" / "probe_conv_update_current_h200.json").read_text())
    mine = [x for x in rows["rows"] if x["method"] == "ours"]
    assert {(x["layout"], x["tokens_per_row"], x["width"]) for x in mine} == {("DS", 1, 3),
                                                                             ("SD", 1, 3)}
    assert all(x["us"] > 0 for x in mine)


def test_the_selective_state_benchmark_runs(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_selective_state.py"),
                        "--small", "--out", str(tmp_path)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "selective_state_h200.json").read_text())
    seen = {(x["method"], x["batch"], x["tokens_per_row"]) for x in data["records"]}
    assert {("ours", b, t) for b in (1, 2) for t in (1, 4)} <= seen
    import torch
    if torch.cuda.is_available():  # fla's rows (the GPU has it) and JAX's
        assert {("fla", 1, 1), ("fla_pooled", 1, 4), ("ours_jax", 2, 4)} <= seen
    assert all(x["ms"] > 0 for x in data["records"])
    assert "| decode | ours |" in (tmp_path / "selective_state_h200.md").read_text()


def test_the_chunked_probe_runs_a_variant_in_a_process_of_its_own(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "probe_gdn_chunked.py"),
                        "--small", "--out", str(tmp_path), "--tokens", "20", "--rows", "1",
                        "--variants", "16:16:4:tf32x3:2"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "probe_gdn_chunked_current_h200.json").read_text())
    got = {(x["variant"], x["method"], x["rows"]) for x in data["records"]}
    v = "16:16:4:tf32x3:2"
    assert got == {(v, "chunked", 1), (v, "chunked_step1", 1), (v, "recurrent", 1)}
    assert all(x["us"] > 0 for x in data["records"])

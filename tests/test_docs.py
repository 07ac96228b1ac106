"""The README's code runs as written, and the examples run to completion with the results
they claim."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def python_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


# what each README block prints, line by line (the comments beside its prints say so)
README_OUTPUT = [
    ["[1] [1]", "[5] [[5 6 7]]", "[1] [2]"],  # core: no crossing; the boundary at 8 tokens
    ["[5] [[5, 6, 7]]", "[1] True", "[-1] the block table names"],  # torch quick-start
    ["[[5, 6, 7]] [1]", "True"],  # JAX quick-start
    ["True", "16384"],  # one operation; a bad id flagged
]


def test_readme_python_blocks_run(capsys):
    blocks = python_blocks(ROOT / "README.md")
    assert len(blocks) == len(README_OUTPUT), "README's python blocks changed: update the test"
    for i, (code, want) in enumerate(zip(blocks, README_OUTPUT)):
        exec(compile(code, f"README.md block {i}", "exec"), {})
        lines = capsys.readouterr().out.splitlines()
        got = [line for line in lines if line in want]
        assert got == want, f"README block {i} printed {lines}"


def test_demo_serves_the_model_and_its_checks_pass(tmp_path):
    # make demo's script on a smaller workload (the full one: tests/test_e2e.py's checks)
    png = tmp_path / "saved.png"
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "serve_demo.py"), "--conversations", "2",
         "--new-tokens", "4", "--png", str(png)],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for check in ("cached == uncached", "torch == JAX", "pre-copy == copy-free",
                  "cached == each request alone"):
        assert re.search(rf"PASS  {re.escape(check)}: [1-9]\d* positions compared, 0 differ",
                         out.stdout), out.stdout
    assert png.stat().st_size > 0


def test_jax_cache_study_runs(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "jax_cache_study.py"), "--blocks", "8", "16",
         "--drafts", "0", "1", "--png", str(tmp_path / "study.png")],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.stdout.splitlines()
            if re.match(r"\|\s+\d", line)]
    assert len(rows) == 4
    for r in rows:  # every prompt token from the cache or computed once (no preemption)
        prompt, hit, computed = int(r[3]), int(r[4]), int(r[6])
        assert hit > 0 and hit + computed == prompt
    assert (tmp_path / "study.png").stat().st_size > 0


def test_simulation_example_runs_and_compares_like_with_like():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "simulate_prefix_cache.py")],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "every row read exactly the state of its token prefix" in out.stdout
    # every row serves the same workload: the prompt tokens computed without the cache are
    # those computed with it plus those it served
    rows = [line.split() for line in out.stdout.splitlines()
            if line.startswith(("pre-copy", "copy-free"))]
    assert len(rows) == 4
    for mode in ("pre-copy", "copy-free"):
        off, on = ([int(x) for x in r[2:5]] for r in rows if r[0] == mode)
        assert on[2] > 0 and off[1] == on[1] + on[2]


def test_the_chunked_prefill_example_runs_as_its_docstring_says():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "chunked_prefill.py")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    close = re.search(r"outputs within ([\d.e+-]+), final state within ([\d.e+-]+)", out.stdout)
    assert close and max(float(close.group(1)), float(close.group(2))) < 1e-5, out.stdout
    assert "gives the one-launch bits: True" in out.stdout
    assert "torch and JAX give the same bits: True" in out.stdout


@pytest.mark.parametrize("example,x64", [("torch_serving_loop.py", False),
                                         ("jax_serving_loop.py", False),
                                         ("jax_serving_loop.py", True)])
def test_serving_loop_examples_show_exact_prefix_caching(example, x64):
    # with x64 too (JAX users often turn it on): its pools and toy layer keep float32
    env = {**os.environ, "JAX_ENABLE_X64": "1" if x64 else "0"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / example)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "resumed from a cached block after 16 tokens" in out.stdout
    assert "outputs identical bit for bit: True" in out.stdout


def test_benchmarks_md_is_what_the_results_give(tmp_path):
    # BENCHMARKS.md is generated: a figure edited by hand or a result file added without
    # regenerating it would show here
    out = tmp_path / "BENCHMARKS.md"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_benchmarks_md.py"),
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert out.read_text() == (ROOT / "BENCHMARKS.md").read_text()


def test_the_checks_section_points_to_the_own_cost_table_only_when_it_has_one(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from make_benchmarks_md import CHECK_PAIRS, OWN_COST, checks_md
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    results = ROOT / "benchmarks" / "results"
    for _, a, b in CHECK_PAIRS:
        for name in (a, b):
            (tmp_path / name).write_text((results / name).read_text())
    without = checks_md(tmp_path)
    assert "next table" not in without and "checks' own cost |" not in without
    for label in OWN_COST:
        for rows in (64, 512):
            name = f"probe_step_kernels_{label}_rows{rows}_h200.json"
            (tmp_path / name).write_text((results / name).read_text())
    with_table = checks_md(tmp_path)
    table = with_table.split("checks' own cost |")[1]
    assert "next table" in with_table and "| 512 rows |" in table

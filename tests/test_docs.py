"""The README's code runs as written, and the examples run to completion with the results
they claim."""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def python_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def test_readme_python_blocks_run(capsys):
    blocks = python_blocks(ROOT / "README.md")
    assert blocks, "README has no python block"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "[1] [2]" in out  # the boundary at 8 tokens lands in column 1 with bias 2
    assert "[5] [[5, 6, 7]]" in out and "[1] True" in out  # the torch quick-start
    assert "[[5, 6, 7]] [1]" in out and "True" in out.splitlines()[-1]  # the JAX quick-start


def test_demo_example_runs():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "simulate_prefix_cache.py")],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "every row read exactly the state of its token prefix" in out.stdout


@pytest.mark.parametrize("example", ["torch_serving_loop.py", "jax_serving_loop.py"])
def test_serving_loop_examples_show_exact_prefix_caching(example):
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / example)],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "resumed from a cached block after 16 tokens" in out.stdout
    assert "outputs identical bit for bit: True" in out.stdout

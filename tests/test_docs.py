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


# what each README block prints, line by line (the comments beside its prints say so)
README_OUTPUT = [
    ["[1] [1]", "[5] [[5 6 7]]", "[1] [2]"],  # core: no crossing; the boundary at 8 tokens
    ["[5] [[5, 6, 7]]", "[1] True", "[-1] the block table names"],  # torch quick-start
    ["[[5, 6, 7]] [1]", "True"],  # JAX quick-start
    ["True"],  # one operation
]


def test_readme_python_blocks_run(capsys):
    blocks = python_blocks(ROOT / "README.md")
    assert len(blocks) == len(README_OUTPUT), "README's python blocks changed: update the test"
    for i, (code, want) in enumerate(zip(blocks, README_OUTPUT)):
        exec(compile(code, f"README.md block {i}", "exec"), {})
        lines = capsys.readouterr().out.splitlines()
        got = [line for line in lines if line in want]
        assert got == want, f"README block {i} printed {lines}"


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

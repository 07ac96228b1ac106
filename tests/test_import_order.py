"""Importing triton before mamba_align (as ``torch._dynamo``, jax-triton and fla do) changes
nothing: without a GPU the interpreter is chosen when mamba_align is imported, after
Triton's own ``@triton.jit`` helpers were built compiled, and the package rebuilds them
interpreted (kernels/interpret.py, ``reinterpret_helpers``); with a GPU nothing is
rebuilt. A script that imports triton first computes the same bits as this process."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import torch

from mamba_align.backends.torch import ops

HERE = pathlib.Path(__file__).resolve().parent
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

_SCRIPT = """
import sys
import triton.language  # noqa: F401
import torch._dynamo  # noqa: F401  (imports triton too)
assert "mamba_align" not in sys.modules
sys.path.insert(0, {here!r})
import numpy as np
from test_import_order import DEVICE, compute
np.savez({out!r}, **compute(DEVICE))
"""


def compute(device: str) -> dict:
    """A gated delta rule (in-kernel gates) and a conv1d update on small random inputs;
    every output and pool as NumPy arrays."""
    g = torch.Generator().manual_seed(7)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device)

    def ids(*v):
        return torch.tensor(v, dtype=torch.int32, device=device)

    L, NB, H, HV, K, V, T = 2, 6, 2, 4, 16, 16, 5
    pool, errors = rand(L, NB, HV, V, K), ids(0, 2**31 - 1)
    o = ops.gated_delta_rule_fused_gates_(
        pool, errors, rand(T, H, K), rand(T, H, K), rand(T, HV, V), rand(T, HV), rand(T, HV),
        rand(HV), rand(HV), ids(0, 1, 5), ids(2, -1), ids([1, -1, -1, -1], [3, 4, 5, 0]),
        ids(0, 1), layer=1, use_qk_l2norm=True)["o"]
    D, W = 32, 6
    cpool, cerrors = rand(L, NB, D, W), ids(0, 2**31 - 1)
    y = ops.conv1d_update_(cpool, cerrors, rand(T, D), rand(D, 4), rand(D), ids(0, 1, 5),
                           ids(2, 3), ids(1, 0), ids(4, 3), ids(0, 1), layer=1, layout="DS",
                           activation="silu")["y"]
    return {name: t.cpu().numpy() for name, t in
            dict(o=o, pool=pool, errors=errors, y=y, cpool=cpool, cerrors=cerrors).items()}


def test_triton_imported_first_computes_the_same_bits(tmp_path):
    out = tmp_path / "out.npz"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _SCRIPT.format(here=str(HERE), out=str(out))],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got, want = np.load(out), compute(DEVICE)
    assert want["errors"][0] == 0 and want["cerrors"][0] == 0  # clean rows, no flag
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)

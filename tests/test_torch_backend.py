"""What only the torch backend has (the ops themselves are checked three ways in the
per-operation test files): every op is a ``torch.library`` custom op with a fake
implementation, so a whole step compiles with ``torch.compile(fullgraph=True)`` and gives
what the eager step gives, at any batch size. Runs on the CPU (inductor, the kernels in Triton's interpreter)
and on the GPU; CUDA-graph capture and host synchronisation are in ``test_torch_gpu.py``."""

import os
import re
import subprocess
import sys

import pytest
import torch
from torch_steps import run_step, seed_runner, step_config, step_inputs, step_pools

from mamba_align import kernels as K
from mamba_align.backends.torch import StateRunner

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def test_every_op_is_a_custom_op_with_its_mutations_and_outputs():
    for op in K.OPS:
        name = op.name + ("_" if op.mutates else "")  # the backend's naming rule
        schema = str(getattr(torch.ops.mamba_align, name).default._schema)
        args = re.findall(r"Tensor(\(\w!\))? (\w+)", schema.split(" -> ")[0])
        assert [n for _, n in args] == list(op.arrays)
        assert {n for alias, n in args if alias} == set(op.mutates)
        outs = ", ".join(["Tensor"] * len(op.returns))
        assert schema.endswith(f" -> {outs}" if len(op.returns) == 1 else f" -> ({outs})")


@pytest.mark.parametrize("mode", ["pre-copy", "copy-free"])
def test_torch_compile_of_a_step_at_several_batch_sizes(mode):
    # the second batch size makes torch mark the row dimension dynamic: the fakes then see
    # symbolic sizes
    cfg = step_config(dim=16, ssm=(2, 4, 4))
    slots, cols, nb = 8, 12, 8 * 12 + 1
    gen = torch.Generator().manual_seed(3)
    a, b = StateRunner(cfg, slots, DEV, mode), StateRunner(cfg, slots, DEV, mode)
    seed_runner(a, 4, slots)
    seed_runner(b, 4, slots)
    pa, pb = step_pools(cfg, nb, DEV), step_pools(cfg, nb, DEV)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(run_step, fullgraph=True)
    for rows in (6, 3, 5, 7, 2):
        idx, ql, bt, ns = step_inputs(gen, rows, slots, cols, nb, 2, DEV)
        spec = torch.ones(rows, dtype=torch.bool, device=DEV)
        got = compiled(a, pa, idx, ql, spec, bt, ns)
        want = run_step(b, pb, idx, ql, spec, bt, ns)
        for x, y in zip(got, want):
            assert torch.equal(x, y)
        for f in ("state_idx", "acc", "num_computed"):
            assert torch.equal(getattr(a, f), getattr(b, f))
        for n in pa:
            assert torch.equal(pa[n].view(torch.int16), pb[n].view(torch.int16))
    # one graph for the first size, one with the row count symbolic: no size is pinned
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2


def test_cpu_tensors_for_compiled_kernels_get_a_clear_error(monkeypatch):
    # where the kernels are compiled (a GPU machine), CPU tensors cannot reach them
    import dataclasses

    from mamba_align.backends.torch import ops

    real = ops._plan

    def compiled_plan(*a, **k):
        plan = real(*a, **k)
        return dataclasses.replace(plan, kernel=object())  # not an interpreted kernel

    monkeypatch.setattr(ops, "_plan", compiled_plan)
    pool = torch.zeros(1, 4, 8)
    with pytest.raises(ValueError, match="kernels run compiled on CUDA devices"):
        ops.copy_temporal_(pool, torch.zeros(2, dtype=torch.int32), torch.tensor([1]),
                           torch.tensor([2]))
    assert (pool == 0).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU interpreter path")
def test_a_cpu_script_needs_no_environment_variable(tmp_path):
    # the package chooses the interpreter before triton is first imported; a backend that
    # imported triton itself first left triton.language's reductions uninterpretable
    code = ("import torch\n"
            "from mamba_align.backends.torch import ops\n"
            "pool = torch.zeros(1, 4, 2, 8)\n"
            "pool[0, 1] = 7\n"
            "flag = torch.tensor([0, 2**31 - 1], dtype=torch.int32)\n"
            "ops.copy_temporal_(pool, flag, torch.tensor([1]), torch.tensor([2]))\n"
            "assert pool[0, 2].eq(7).all()\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True)

"""What only the torch backend has (the ops themselves are checked three ways in the
per-operation test files): every op is a ``torch.library`` custom op with a fake
implementation, so a whole step compiles with ``torch.compile(fullgraph=True)`` and gives
what the eager step gives. Runs on the CPU (inductor, the kernels in Triton's interpreter)
and on the GPU; CUDA-graph capture and host synchronisation are in ``test_torch_gpu.py``."""

import re

import torch

from mamba_align import kernels as K
from mamba_align.backends.torch import StateRunner
from mamba_align.core import CacheConfig, ConvSpec, TemporalSpec

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def run_step(runner, pools, idx, ql, is_spec, bt, ns):
    b = runner.preprocess(pools, idx, ql, is_spec, bt)
    c = runner.postprocess(pools, idx, ql, is_spec, ns, bt)
    return [b.temporal_read, b.conv_read, b.conv_read_bias, b.temporal_write, b.conv_write, c]


def test_every_op_is_a_custom_op_with_its_mutations_and_outputs():
    for op in K.OPS:
        schema = str(getattr(torch.ops.mamba_align, op.name + "_").default._schema)
        args = re.findall(r"Tensor(\(\w!\))? (\w+)", schema.split(" -> ")[0])
        assert [n for _, n in args] == list(op.arrays)
        assert {n for alias, n in args if alias} == set(op.mutates)
        assert schema.endswith(" -> (" + ", ".join(["Tensor"] * len(op.returns)) + ")")


def test_torch_compile_of_a_step():
    cfg = CacheConfig(4, 2, 3, {"conv": ConvSpec(4, 16, "SD", "bfloat16"),
                                "ssm": TemporalSpec((2, 4, 4), "float32")})
    rows, slots, cols, nb = 6, 8, 12, 8 * 12 + 1
    gen = torch.Generator().manual_seed(3)
    a, b = StateRunner(cfg, slots, DEV), StateRunner(cfg, slots, DEV)
    for r in (a, b):
        nc = torch.randint(0, 40, (slots,), generator=torch.Generator().manual_seed(4))
        r.add_requests(torch.arange(slots, dtype=torch.int32, device=DEV), nc.to(DEV, torch.int32))
    g = torch.Generator().manual_seed(0)
    pools = {n: torch.randn(cfg.pool_shape(n, nb), generator=g).to(getattr(torch, s.dtype))
             for n, s in cfg.states.items()}
    pa = {n: p.to(DEV) for n, p in pools.items()}
    pb = {n: p.to(DEV) for n, p in pools.items()}
    spec = torch.ones(rows, dtype=torch.bool, device=DEV)
    compiled = torch.compile(run_step, fullgraph=True)
    for _ in range(2):
        idx = torch.randperm(slots, generator=gen)[:rows]
        ql = torch.randint(1, 4, (rows,), generator=gen)
        bt = (torch.randperm(nb - 1, generator=gen)[: slots * cols] + 1).view(slots, cols)
        ns = torch.minimum(torch.randint(1, 4, (rows,), generator=gen), ql)
        step = [x.to(DEV, torch.int32) for x in (idx, ql)] + [spec] + \
            [x.to(DEV, torch.int32) for x in (bt, ns)]
        got = compiled(a, pa, *step)
        want = run_step(b, pb, *step)
        for x, y in zip(got, want):
            assert torch.equal(x, y)
        for f in ("state_idx", "acc", "num_computed"):
            assert torch.equal(getattr(a, f), getattr(b, f))
        for n in pa:
            assert torch.equal(pa[n].view(torch.int16), pb[n].view(torch.int16))

"""Whole torch steps on the torch runner, shared by the runner tests (torch.compile on the
CPU, CUDA graphs on the GPU): a config, random valid step inputs, seeded runners, pools."""

from __future__ import annotations


def step_config(S: int = 2, dim: int = 64, ssm=(2, 16, 16)):
    from mamba_align.core import CacheConfig, ConvSpec, TemporalSpec

    return CacheConfig(4, S, 3, {"conv": ConvSpec(4, dim, "SD", "bfloat16"),
                                 "ssm": TemporalSpec(tuple(ssm), "float32")})


def step_inputs(gen, rows, slots_, cols, nb, S, device):
    """A valid random torch step: distinct slots, -1 padding rows, block tables of distinct
    ids; ``[idx_mapping, query_len, block_table, num_sampled]`` int32 on ``device``."""
    import torch

    perm = torch.randperm(slots_, generator=gen)[:rows]
    idx = torch.where(torch.rand(rows, generator=gen) < 0.2, -1, perm)
    ql = torch.randint(1, S + 2, (rows,), generator=gen)
    bt = (torch.randperm(nb - 1, generator=gen)[: slots_ * cols] + 1).view(slots_, cols)
    ns = torch.minimum(torch.randint(1, S + 2, (rows,), generator=gen), ql)
    return [t.to(device).to(torch.int32) for t in (idx, ql, bt, ns)]


def seed_runner(runner, seed: int, slots_: int) -> None:
    import torch

    nc = torch.randint(0, 40, (slots_,), generator=torch.Generator().manual_seed(seed))
    runner.add_requests(torch.arange(slots_, device=runner.device, dtype=torch.int32),
                        nc.to(runner.device, torch.int32))


def step_pools(cfg, nb, device):
    import torch

    g = torch.Generator().manual_seed(0)
    return {n: torch.randn(cfg.pool_shape(n, nb), generator=g).to(getattr(torch, s.dtype))
            .to(device) for n, s in cfg.states.items()}


def run_step(runner, pools, idx, ql, is_spec, bt, ns):
    """One whole step through the torch runner; its per-row results."""
    b = runner.preprocess(pools, idx, ql, is_spec, bt)
    c = runner.postprocess(pools, idx, ql, is_spec, ns, bt)
    return [b.temporal_read, b.conv_read, b.conv_read_bias, b.temporal_write, b.conv_write, c]

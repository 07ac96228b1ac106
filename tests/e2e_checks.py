"""Checks both end-to-end test files make (tests/test_e2e.py: the GDN model,
tests/test_e2e_mamba2.py: its Mamba2 twin): the blocks a served run put in the prefix cache
hold the state at their boundaries, and JAX serves the workload with torch's bits."""

from __future__ import annotations

import numpy as np
from hybrid_serving import compare, serve


def check_cached_blocks(torch_model, plain, cached, num_spec: int) -> None:
    """Each block a run recorded in the prefix cache (``cached``: ``(request, tokens,
    pools)``, as it was then) against the request's first ``tokens`` tokens run alone from
    an empty state: the recurrent state, and the conv history (its ``K - 1`` rows)."""
    from hybrid_torch import single_row, to_numpy
    workload, outputs, _ = plain
    K = torch_model.cfg.conv_kernel
    for rid, n, got in cached:
        tokens = (list(workload.requests[rid][1]) + list(outputs[rid]))[:n]
        alone = single_row(torch_model, num_spec)
        alone(tokens, -1, 1)
        want = {name: to_numpy(p[:, 1]) for name, p in alone.pools.items()}
        np.testing.assert_array_equal(got["ssm"], want["ssm"], err_msg=f"{rid} at {n}")
        np.testing.assert_array_equal(got["conv"][..., :K - 1], want["conv"][..., :K - 1],
                                      err_msg=f"{rid} at {n}")


def check_jax_serves_torchs_bits(model, weights, cache, num_blocks: int, slots: int, plain,
                                 want) -> None:
    """The workload served by the JAX step functions gives the logits of ``want`` (a torch
    run's ``Served``) at every position, bit for bit, with no fault flagged."""
    from hybrid_jax import load_weights, new_pools, serving_step

    from mamba_align.backends import jax as mj
    step = serving_step(model, load_weights(model, weights), cache, new_pools(cache, num_blocks),
                        slots)
    got = serve(model, plain[0], plain[1], step, block_size=cache.block_size,
                num_spec=cache.num_spec, num_blocks=num_blocks)
    assert mj.errors(step.carry["state"]) == []
    assert got.logits.keys() == want.logits.keys()
    assert compare(got.logits, want.logits) == (len(want.logits), 0)

"""GPU-only properties of the torch backend (run by ``make gpu`` on the device machine):
64-bit offsets, grids beyond 65 535 programs, no host synchronisation, CUDA-graph capture
and replay of a whole step (torch.compile of a step: ``test_torch_backend.py``)."""

import pytest
import torch
from torch_steps import run_step, seed_runner, step_config, step_inputs, step_pools

from mamba_align.backends.torch import StateRunner
from mamba_align.backends.torch import ops
from mamba_align.core import CacheConfig, ConvSpec, Fault, TemporalSpec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu)"),
]

DEV = "cuda"


def ids(*v):
    return torch.tensor(v, dtype=torch.int64, device=DEV)


def clear_flag():
    return torch.tensor([0, 2**31 - 1], dtype=torch.int32, device=DEV)


def test_pool_beyond_2_31_elements_uses_64_bit_offsets():
    # 2 layers x 16 400 blocks x 65 536 bf16: the last blocks of layer 1 sit past 2^31 elements.
    L, NB, E = 2, 16_400, 65_536
    assert L * NB * E > 2**31
    pool = torch.empty((L, NB, 16, 64, 64), dtype=torch.bfloat16, device=DEV)
    pool[:, -4:].normal_()
    pool[:, 1:3].normal_()
    src, dst = ids(NB - 1, NB - 3, 1), ids(NB - 2, 2, NB - 4)
    want = pool[:, src].clone()
    keep = pool[:, NB - 3].clone()
    err = clear_flag()
    ops.copy_temporal_(pool, err, src, dst)
    assert torch.equal(pool[:, dst].view(torch.int16), want.view(torch.int16))
    assert torch.equal(pool[:, NB - 3].view(torch.int16), keep.view(torch.int16))
    del pool
    # conv: [1, NB, 4, 8192] bf16 with NB * 32 768 > 2^31
    NB = 65_600
    conv = torch.empty((1, NB, 4, 8192), dtype=torch.bfloat16, device=DEV)
    conv[:, -3:].normal_()
    before = conv[:, -3:].clone()
    # through the dispatcher this time (the torch.compile path)
    torch.ops.mamba_align.copy_conv_(conv, err, ids(NB - 1, NB - 3), ids(NB - 2, NB - 3),
                                     ids(1, 2), "SD")
    assert err.tolist() == clear_flag().tolist()
    assert torch.equal(conv[0, NB - 2, :3], before[0, 2, 1:])
    assert torch.equal(conv[0, NB - 2, 3], before[0, 1, 3])
    assert torch.equal(conv[0, NB - 3, :2], before[0, 0, 2:])  # in place, shift 2
    assert torch.equal(conv[0, NB - 3, 2:], before[0, 0, 2:])


def test_grid_beyond_65535_request_layer_programs():
    rows, L = 2_100, 40  # conv copy: 84 000 programs on axis 0; temporal: 66 groups of 32 rows
    pool = torch.randn((L, 2 * rows + 1, 8, 16), device=DEV)
    conv = torch.randn((L, 2 * rows + 1, 16, 5), device=DEV)  # DS, W = 5
    perm = torch.randperm(2 * rows, device=DEV) + 1
    src, dst = perm[:rows], perm[rows:]
    bias = torch.randint(0, 4, (rows,), device=DEV)
    want_t = pool.clone()
    want_t[:, dst] = pool[:, src]
    want_c = conv.clone()
    for s in range(4):
        m = bias == s
        want_c[:, dst[m], :, : 5 - s] = conv[:, src[m], :, s:]
    err = clear_flag()
    ops.copy_temporal_(pool, err, src, dst)
    ops.copy_conv_(conv, err, src, dst, bias, layout="DS")
    assert torch.equal(pool, want_t) and torch.equal(conv, want_c)
    assert err.tolist() == clear_flag().tolist()
    # one bad row each, near the end (the last row group): flagged with the lowest of the
    # two rows, nothing copied; every other row names no source (-1)
    before_t, before_c = pool.clone(), conv.clone()
    bad_t, bad_c, bad_bias = torch.full_like(src, -1), torch.full_like(src, -1), bias.clone()
    bad_t[-1] = 2 * rows + 1  # = NB
    bad_c[-2], bad_bias[-2] = src[0], 7  # valid ids, bias 7 >= W = 5
    ops.copy_temporal_(pool, err, bad_t, dst)
    assert err.tolist() == [int(Fault.BAD_COPY), rows - 1]
    ops.copy_conv_(conv, err, bad_c, dst, bad_bias, layout="DS")
    assert err.tolist() == [int(Fault.BAD_COPY), rows - 2]
    assert torch.equal(pool, before_t) and torch.equal(conv, before_c)


def test_a_step_never_synchronises_with_the_host():
    cfg = step_config()
    gen = torch.Generator().manual_seed(1)
    runner = StateRunner(cfg, 16, DEV)
    seed_runner(runner, 1, 16)
    pools = step_pools(cfg, 16 * 12 + 1, DEV)
    idx, ql, bt, ns = step_inputs(gen, 12, 16, 12, 16 * 12 + 1, 2, DEV)
    spec = torch.ones(12, dtype=torch.bool, device=DEV)
    run_step(runner, pools, idx, ql, spec, bt, ns)  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        runner.add_requests(idx[:1].clamp(min=0), ql[:1])
        run_step(runner, pools, idx, ql, spec, bt, ns)
        # the detector is armed: a read back to the host raises here
        with pytest.raises(RuntimeError, match="synchroniz"):
            ns.sum().item()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.parametrize("mode", ["pre-copy", "copy-free"])
def test_cuda_graph_capture_and_replay_with_new_inputs(mode):
    cfg = step_config()
    rows, slots, cols, nb = 24, 32, 12, 32 * 12 + 1
    gen = torch.Generator().manual_seed(2)
    graph_runner = StateRunner(cfg, slots, DEV, mode)
    eager_runner = StateRunner(cfg, slots, DEV, mode)
    seed_runner(graph_runner, 9, slots)
    seed_runner(eager_runner, 9, slots)
    g_pools, e_pools = step_pools(cfg, nb, DEV), step_pools(cfg, nb, DEV)
    static = step_inputs(gen, rows, slots, cols, nb, 2, DEV)
    spec = torch.ones(rows, dtype=torch.bool, device=DEV)
    # warm up (compiles) on a side stream, as CUDA graphs require, then restore the state
    saved = [t.clone() for t in (graph_runner.state_idx, graph_runner.acc, graph_runner.num_computed)]
    saved_pools = {n: p.clone() for n, p in g_pools.items()}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run_step(graph_runner, g_pools, static[0], static[1], spec, static[2], static[3])
    torch.cuda.current_stream().wait_stream(s)
    for t, v in zip((graph_runner.state_idx, graph_runner.acc, graph_runner.num_computed), saved):
        t.copy_(v)
    for n in g_pools:
        g_pools[n].copy_(saved_pools[n])

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # JAX shares the process
        outs = run_step(graph_runner, g_pools, static[0], static[1], spec, static[2], static[3])
    # capture does not execute: replay three steps with new inputs, eager alongside
    for step in range(3):
        new = step_inputs(gen, rows, slots, cols, nb, 2, DEV)
        for st, nv in zip(static, new):
            st.copy_(nv)
        graph.replay()
        want = run_step(eager_runner, e_pools, new[0], new[1], spec, new[2], new[3])
        torch.cuda.synchronize()
        for a, b in zip(outs, want):
            assert torch.equal(a, b), f"step {step}"
        for f in ("state_idx", "acc", "num_computed"):
            assert torch.equal(getattr(graph_runner, f), getattr(eager_runner, f))
        for n in g_pools:
            assert torch.equal(g_pools[n].view(torch.int16 if n == "conv" else torch.int32),
                               e_pools[n].view(torch.int16 if n == "conv" else torch.int32))


def test_cpu_tensors_on_a_gpu_machine_get_a_clear_error():
    pool = torch.zeros(1, 4, 8)
    with pytest.raises(ValueError, match="kernels run compiled on CUDA devices"):
        ops.copy_temporal_(pool, torch.zeros(2, dtype=torch.int32), torch.tensor([1]),
                           torch.tensor([2]))

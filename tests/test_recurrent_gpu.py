"""GPU-only properties of the recurrent kernels (run by ``make gpu``): pools past 2^31
elements (64-bit offsets), more than 65 535 programs, CUDA-graph capture and replay,
inputs as unaligned views."""

import functools

import numpy as np
import pytest
import torch
from support import SSU_INPUTS, make_backend

from mamba_align.backends.torch import ops

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu)"),
]

DEV = "cuda"


def t(a, dtype=None):
    return torch.as_tensor(np.asarray(a), dtype=dtype, device=DEV)


def gdn_row(pool, rb, wbs, T=3, seed=0, algorithm="recurrent"):
    """One spec row of ``T`` tokens on ``pool`` (HV = 32, K = V = 128), in-kernel gates."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    HV, K = pool.shape[2], pool.shape[4]
    q, k = (torch.randn(T, 16, K, device=DEV, generator=g, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(T, HV, K, device=DEV, generator=g, dtype=torch.bfloat16)
    a, b = (torch.randn(T, HV, device=DEV, generator=g) for _ in range(2))
    A_log, dt_bias = (torch.randn(HV, device=DEV, generator=g) for _ in range(2))
    errors = torch.zeros(2, dtype=torch.int32, device=DEV)
    o = ops.gated_delta_rule_fused_gates_(
        pool, errors, q, k, v, a, b, A_log, dt_bias, t([0, T]), t([rb]), t([wbs]), t([1]),
        layer=pool.shape[0] - 1, use_qk_l2norm=True, algorithm=algorithm)["o"]
    assert errors.tolist()[0] == 0
    return o


def ssu_row(pool, rb, wbs, T=3, seed=0, algorithm="recurrent"):
    """One spec row of ``T`` tokens on ``pool`` (``[L, NB, H, 64, 128]``, 4 groups)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    H, P, N = pool.shape[2:]
    ins = {"x": torch.randn(T, H, P, device=DEV, generator=g, dtype=torch.bfloat16),
           "dt": torch.randn(T, H, device=DEV, generator=g, dtype=torch.bfloat16),
           "A": -torch.rand(H, device=DEV, generator=g) - 0.5,
           "B": torch.randn(T, 4, N, device=DEV, generator=g, dtype=torch.bfloat16),
           "C": torch.randn(T, 4, N, device=DEV, generator=g, dtype=torch.bfloat16),
           "D": torch.randn(H, device=DEV, generator=g),
           "dt_bias": torch.randn(H, device=DEV, generator=g)}
    errors = torch.zeros(2, dtype=torch.int32, device=DEV)
    y = ops.selective_state_update_(pool, errors, *(ins[n] for n in SSU_INPUTS), t([0, T]),
                                    t([rb]), t([wbs]), t([1]), layer=pool.shape[0] - 1,
                                    algorithm=algorithm)["y"]
    assert errors.tolist()[0] == 0
    return y


@pytest.mark.parametrize("op", ["gdn", "gdn_chunked", "ssu", "ssu_chunked"])
def test_temporal_pool_beyond_2_31_elements(op):
    # gdn: [1, 4200, 32, 128, 128] fp32, 2.2e9 elements; ssu: [1, 8200, 32, 64, 128] fp32,
    # 2.15e9 elements; the row reads and writes the last blocks
    algorithm = "chunked" if op.endswith("_chunked") else "recurrent"
    NB, block, row = (8200, (32, 64, 128), ssu_row) if op.startswith("ssu") else \
        (4200, (32, 128, 128), gdn_row)
    row = functools.partial(row, algorithm=algorithm)
    big = torch.zeros((1, NB) + block, device=DEV)
    assert big.numel() > 2**31
    small = torch.zeros((1, 5) + block, device=DEV)
    init = torch.randn(block, device=DEV)
    big[0, NB - 1], small[0, 1] = init, init
    out_big = row(big, NB - 1, [NB - 4, NB - 3, NB - 2])
    out_small = row(small, 1, [2, 3, 4])
    assert torch.equal(out_big, out_small)  # the same row, wherever its blocks are
    assert torch.equal(big[0, NB - 4:NB - 1], small[0, 2:5])
    assert torch.equal(big[0, NB - 1], init) and not big[0, :NB - 4].any()


def test_conv_pool_beyond_2_31_elements():
    NB, D = 52_500, 8192  # [1, NB, 5, 8192] bf16: 2.15e9 elements
    big = torch.zeros((1, NB, 5, D), dtype=torch.bfloat16, device=DEV)
    assert big.numel() > 2**31
    small = torch.zeros((1, 3, 5, D), dtype=torch.bfloat16, device=DEV)
    hist = torch.randn(5, D, device=DEV).to(torch.bfloat16)
    big[0, NB - 1], small[0, 1] = hist, hist
    x = torch.randn(3, D, device=DEV).to(torch.bfloat16)
    w, cb = torch.randn(D, 4, device=DEV), torch.randn(D, device=DEV)

    def run(pool, rb, wb):
        errors = torch.zeros(2, dtype=torch.int32, device=DEV)
        y = ops.conv1d_update_(pool, errors, x, w, cb, t([0, 3]), t([rb]), t([1]), t([wb]),
                               t([1]), layer=0, layout="SD")["y"]
        assert errors.tolist()[0] == 0
        return y

    assert torch.equal(run(big, NB - 1, NB - 2), run(small, 1, 2))
    assert torch.equal(big[0, NB - 2].view(torch.int16), small[0, 2].view(torch.int16))


@pytest.mark.parametrize("op", ["conv1d", "gdn", "gdn_chunked", "ssu", "ssu_chunked"])
def test_more_than_65535_programs(op):
    # 70 000 one-token rows: every program index past the 65 535 of a y / z grid axis
    rows, rng = 70_000, np.random.default_rng(0)
    cu = np.arange(rows + 1)
    rb = rng.integers(-1, 4, rows)  # read blocks no row writes: rows are not ordered
    wb = np.where(rng.random(rows) < 0.1, -1, rng.integers(4, 8, rows))
    spec = np.zeros(rows, np.int64)
    ref, dev = make_backend("reference"), make_backend("torch")
    if op == "conv1d":
        pool = rng.normal(size=(1, 8, 3, 16)).astype(np.float32)
        x = rng.normal(size=(rows, 16)).astype(np.float32)
        w, cb = rng.normal(size=(16, 3)).astype(np.float32), np.zeros(16, np.float32)
        args = (pool, x, w, cb, cu, rb, np.zeros(rows, np.int64), wb, spec)
        got, want = (b.conv1d_update(*args, layer=0, layout="SD") for b in (dev, ref))
    elif op.startswith("gdn"):  # chunked: 16 value columns a program, one program a row
        pool = rng.normal(size=(1, 8, 1, 8, 8)).astype(np.float32)
        q, k, v = (rng.normal(size=(rows, 1, 8)).astype(np.float32) for _ in range(3))
        gates = {"g": -rng.uniform(0, 1, (rows, 1)).astype(np.float32),
                 "beta": rng.uniform(0, 1, (rows, 1)).astype(np.float32)}
        wbs = np.stack([wb, -np.ones(rows, np.int64)], axis=1)
        got, want = (b.gdn(pool, q, k, v, gates, cu, rb, wbs, spec, layer=0,
                           algorithm="chunked" if op == "gdn_chunked" else "recurrent")
                     for b in (dev, ref))
    elif op.startswith("ssu"):  # chunked: 16 head-dim rows a program, one program a row
        pool = rng.normal(size=(1, 8, 1, 8, 8)).astype(np.float32)
        ins = {"x": rng.normal(size=(rows, 1, 8)), "dt": rng.normal(size=(rows, 1)),
               "A": -rng.uniform(0.5, 1, 1), "B": rng.normal(size=(rows, 1, 8)),
               "C": rng.normal(size=(rows, 1, 8)), "D": rng.normal(size=1),
               "dt_bias": rng.normal(size=1)}
        ins = {n: a.astype(np.float32) for n, a in ins.items()}
        wbs = np.stack([wb, -np.ones(rows, np.int64)], axis=1)
        got, want = (b.ssu(pool, ins, cu, rb, wbs, spec, layer=0,
                           algorithm="chunked" if op == "ssu_chunked" else "recurrent")
                     for b in (dev, ref))
    # the outputs row by row; many rows write each block, so the pools are not compared
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert got[2].tolist() == want[2].tolist()


def test_a_chunked_row_gives_its_bits_on_either_warp_count():
    # step 2 of the chunked rule runs 8 warps while its grid fits one wave, 4 beyond it; a
    # row alone (128 programs at these shapes) and beside another (256) take one each, and
    # its bits must not depend on the batch (docs/semantics.md §4)
    from gdn_cases import chunked_plan

    from mamba_align.core import new_errors
    rng, n0, n1 = np.random.default_rng(5), 85, 45  # a ragged last chunk in the first
    assert chunked_plan(n0, 1, 16, 32, 128, 128).num_warps != chunked_plan(
        n0 + n1, 2, 16, 32, 128, 128).num_warps
    pool = (0.1 * rng.normal(size=(2, 4, 32, 128, 128))).astype(np.float32)
    q, k = (rng.normal(size=(n0 + n1, 16, 128)).astype(np.float32) for _ in range(2))
    v = rng.normal(size=(n0 + n1, 32, 128)).astype(np.float32)
    gates = {"g": -rng.uniform(0, 0.5, (n0 + n1, 32)).astype(np.float32),
             "beta": rng.uniform(0, 1, (n0 + n1, 32)).astype(np.float32)}
    dev = make_backend("torch")
    ids = functools.partial(np.array, dtype=np.int64)
    first = {n: a[:n0] for n, a in gates.items()}
    both = dev.gdn(pool, q, k, v, gates, ids([0, n0, n0 + n1]), ids([0, 2]),
                   ids([[1, -1], [3, -1]]), ids([0, 0]), layer=1, use_qk_l2norm=True,
                   algorithm="chunked")
    alone = dev.gdn(pool, q[:n0], k[:n0], v[:n0], first, ids([0, n0]), ids([0]),
                    ids([[1, -1]]), ids([0]), layer=1, use_qk_l2norm=True, algorithm="chunked")
    assert both[2].tolist() == alone[2].tolist() == new_errors().tolist()
    np.testing.assert_array_equal(alone[0], both[0][:n0])
    np.testing.assert_array_equal(alone[1][1, 1], both[1][1, 1])
    want = make_backend("reference").gdn(pool, q[:n0], k[:n0], v[:n0], first, ids([0, n0]),
                                         ids([0]), ids([[1, -1]]), ids([0]), layer=1,
                                         use_qk_l2norm=True)
    np.testing.assert_allclose(alone[0], want[0], rtol=1e-4, atol=1e-4)


def test_cuda_graph_replay_of_the_recurrences():
    pool_c = torch.zeros((1, 4, 5, 64), device=DEV)
    pool_t = torch.zeros((1, 4, 2, 16, 16), device=DEV)
    pool_s = torch.zeros((1, 4, 2, 16, 16), device=DEV)
    ssu = {"x": torch.randn(3, 2, 16, device=DEV), "dt": torch.randn(3, 2, device=DEV),
           "A": -torch.rand(2, device=DEV), "B": torch.randn(3, 1, 16, device=DEV),
           "C": torch.randn(3, 1, 16, device=DEV), "D": torch.randn(2, device=DEV),
           "dt_bias": torch.randn(2, device=DEV)}
    x = torch.randn(3, 64, device=DEV)
    w, cb = torch.randn(64, 4, device=DEV), torch.zeros(64, device=DEV)
    q, k = torch.randn(3, 1, 16, device=DEV), torch.randn(3, 1, 16, device=DEV)
    v = torch.randn(3, 2, 16, device=DEV)
    g, beta = -torch.rand(3, 2, device=DEV), torch.rand(3, 2, device=DEV)
    errors = torch.zeros(2, dtype=torch.int32, device=DEV)
    cu, spec, one, zero, two, wbs = t([0, 3]), t([1]), t([1]), t([0]), t([2]), t([[2, 3, -1]])

    def step():  # no host-to-device copies: capturable
        y = ops.conv1d_update_(pool_c, errors, x, w, cb, cu, one, zero, two, spec, layer=0,
                               layout="SD")["y"]
        o = ops.gated_delta_rule_(pool_t, errors, q, k, v, g, beta, cu, one, wbs, spec,
                                  layer=0)["o"]
        ys = ops.selective_state_update_(pool_s, errors, *(ssu[n] for n in SSU_INPUTS), cu, one,
                                         wbs, spec, layer=0)["y"]
        return y, o, ys

    eager = [r.clone() for r in step()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # JAX shares the process
        out = step()
    x.normal_()  # new inputs, replayed without capture
    ssu["x"].normal_()
    graph.replay()
    torch.cuda.synchronize()
    fresh = step()
    for a, b in zip(out, fresh):
        assert torch.equal(a, b)
    assert not torch.equal(out[0], eager[0]) and not torch.equal(out[2], eager[2])
    assert errors.tolist()[0] == 0


def test_inputs_as_unaligned_views_give_the_bits_of_contiguous_ones():
    # q/k/v (and the conv's x) as views into one fused projection buffer with an odd row
    # stride and a pointer 2 bytes past 16-byte alignment: the plans must then promise the
    # compiler less alignment (QK_ALIGN / V_ALIGN / X_ALIGN), and the launcher must not
    # specialise the pointer. A wrong promise faults or reads the wrong elements compiled;
    # the interpreter cannot tell
    T, H, HV, K, D = 5, 2, 4, 64, 96
    g = torch.Generator(device=DEV).manual_seed(1)
    width = 1 + 2 * H * K + HV * K + 3  # odd: no row of the buffer is aligned
    fused = torch.randn(T, width, device=DEV, generator=g).to(torch.bfloat16)
    q = fused[:, 1:1 + H * K].unflatten(1, (H, K))
    k = fused[:, 1 + H * K:1 + 2 * H * K].unflatten(1, (H, K))
    v = fused[:, 1 + 2 * H * K:1 + 2 * H * K + HV * K].unflatten(1, (HV, K))
    assert q.data_ptr() % 16 and q.stride(0) % 8
    gates = [torch.randn(T, HV, device=DEV, generator=g) for _ in range(2)]
    A_log, dt_bias = (torch.randn(HV, device=DEV, generator=g) for _ in range(2))
    init = torch.randn(HV, K, K, device=DEV, generator=g)
    cu, spec, wbs = t([0, 2, T]), t([1, 0]), t([[2, 3, 4], [5, -1, -1]])

    def gdn(q, k, v):
        pool = torch.zeros((1, 6, HV, K, K), device=DEV)
        pool[0, 1] = init
        errors = torch.zeros(2, dtype=torch.int32, device=DEV)
        o = ops.gated_delta_rule_fused_gates_(
            pool, errors, q, k, v, *gates, A_log, dt_bias, cu, t([1, 1]), wbs, spec, layer=0,
            use_qk_l2norm=True)["o"]
        assert errors.tolist()[0] == 0
        return o, pool

    (o_view, p_view), (o_cont, p_cont) = gdn(q, k, v), gdn(*(a.contiguous() for a in (q, k, v)))
    assert torch.equal(o_view, o_cont) and torch.equal(p_view, p_cont)
    assert p_view[0, 2:6].abs().sum() > 0  # the candidates and the final state were written

    xs = torch.randn(T, D + 3, device=DEV, generator=g).to(torch.bfloat16)
    x = xs[:, 1:1 + D]  # row stride D + 3, pointer 2 bytes off
    w, cb = torch.randn(D, 4, device=DEV, generator=g), torch.randn(D, device=DEV, generator=g)
    hist = torch.randn(D, 5, device=DEV, generator=g).to(torch.bfloat16)

    def conv(x):
        pool = torch.zeros((1, 6, D, 5), dtype=torch.bfloat16, device=DEV)
        pool[0, 1] = hist
        errors = torch.zeros(2, dtype=torch.int32, device=DEV)
        y = ops.conv1d_update_(pool, errors, x, w, cb, cu, t([1, 1]), t([0, 1]), t([2, 5]),
                               spec, layer=0, layout="DS")["y"]
        assert errors.tolist()[0] == 0
        return y, pool

    (y_view, c_view), (y_cont, c_cont) = conv(x), conv(x.contiguous())
    assert torch.equal(y_view, y_cont)
    assert torch.equal(c_view.view(torch.int16), c_cont.view(torch.int16))

    # Mamba2: x, B and C as views of the conv's output (x | B | C per token), dt of the
    # projection's, with odd row strides, x 2 bytes off alignment
    Hs, P, G, N = 4, 32, 2, 16
    xbc = torch.randn(T, 1 + Hs * P + 2 * G * N + 1, device=DEV, generator=g).to(torch.bfloat16)
    xs = xbc[:, 1:1 + Hs * P].unflatten(1, (Hs, P))
    Bs = xbc[:, 1 + Hs * P:1 + Hs * P + G * N].unflatten(1, (G, N))
    Cs = xbc[:, 1 + Hs * P + G * N:1 + Hs * P + 2 * G * N].unflatten(1, (G, N))
    dts = torch.randn(T, Hs + 3, device=DEV, generator=g).to(torch.bfloat16)[:, 1:1 + Hs]
    assert xs.data_ptr() % 16 and xs.stride(0) % 8
    A, D = -torch.rand(Hs, device=DEV), torch.randn(Hs, device=DEV)
    dt_bias = torch.zeros(Hs, device=DEV)
    init_s = torch.randn(Hs, P, N, device=DEV, generator=g)

    def ssu(x, dt, B, C):
        pool = torch.zeros((1, 6, Hs, P, N), device=DEV)
        pool[0, 1] = init_s
        errors = torch.zeros(2, dtype=torch.int32, device=DEV)
        y = ops.selective_state_update_(pool, errors, x, dt, A, B, C, D, dt_bias, cu, t([1, 1]),
                                        wbs, spec, layer=0)["y"]
        assert errors.tolist()[0] == 0
        return y, pool

    (ys_view, s_view) = ssu(xs, dts, Bs, Cs)
    (ys_cont, s_cont) = ssu(*(a.contiguous() for a in (xs, dts, Bs, Cs)))
    assert torch.equal(ys_view, ys_cont) and torch.equal(s_view, s_cont)
    assert s_view[0, 2:6].abs().sum() > 0


def test_the_gated_delta_rule_compiles_under_its_register_cap(monkeypatch):
    """torch's launcher passes the kernel's register cap (kernels/gdn_recurrent.py): the binary it
    compiled uses no more registers than that, and spills none."""
    from mamba_align.kernels import gdn

    kernel, seen = gdn.gated_delta_rule_fused_gates_kernel, []
    run = kernel.run

    def spy(*args, **kwargs):
        seen.append((kwargs.get("maxnreg"), run(*args, **kwargs)))
        return seen[-1][1]

    monkeypatch.setattr(kernel, "run", spy)
    gdn_row(torch.zeros((1, 3, 32, 128, 128), device=DEV), 1, [2, -1, -1], T=1)
    (cap, compiled), = seen
    assert cap == gdn.REGISTER_CAP and 0 < compiled.n_regs <= cap, compiled.n_regs
    assert compiled.n_spills == 0

"""The float64 references of the recurrences (core.gdn_ref, core.conv1d_ref,
core.selective_state_ref) against independent formulations: a whole-sequence convolution,
the delta rule as a matrix product, the selective state update as a decayed sum over the
sequence, chunked = unchunked, spec candidates = the non-spec states they stand for."""

import numpy as np
import pytest

from mamba_align.core import Fault
from mamba_align.core.conv1d_ref import causal_conv1d_update_ref
from mamba_align.core.gdn_ref import gated_delta_rule_ref, gates, softplus
from mamba_align.core.selective_state_ref import selective_state_update_ref

RNG = np.random.default_rng(7)


def conv_whole(x, w, cb, silu=True):
    """Causal depthwise conv of a whole sequence from zero history, per channel."""
    n, d = x.shape
    y = np.stack([np.convolve(x[:, c], w[c, ::-1])[:n] for c in range(d)], axis=1) + cb
    return y / (1 + np.exp(-y)) if silu else y


@pytest.mark.parametrize("layout", ["SD", "DS"])
def test_conv_chunks_then_decode_equal_the_whole_sequence(layout):
    K, S, D, n = 4, 2, 5, 11
    W = K - 1 + S
    x, w, cb = RNG.normal(size=(n, D)), RNG.normal(size=(D, K)), RNG.normal(size=D)
    shape = (6, W, D) if layout == "SD" else (6, D, W)
    pool = RNG.normal(size=shape)  # stale content everywhere
    one = lambda xs, pool, rb, off, wb, spec: causal_conv1d_update_ref(  # noqa: E731
        xs, w, cb, pool, [0, len(xs)], [rb], [off], [wb], [spec], layout=layout)
    ys = []
    y, pool, f = one(x[:6], pool, -1, 0, 2, 0)  # a prefill chunk from zero history
    ys.append(y)
    for t in range(6, 8):  # plain decode, each step reading the block the last wrote
        y, pool, f = one(x[t:t + 1], pool, 2 if t == 6 else 3, 0, 3 if t == 6 else 4, 0)
        ys.append(y)
    # a spec row of 3 candidates, of which 2 are accepted: the next read starts at offset 1
    y, pool, f = one(x[8:10], pool, 4, 0, 1, 1)
    ys.append(y)
    y, pool, f = one(x[10:11], pool, 1, 1, 5, 0)
    ys.append(y)
    assert not f.any()
    np.testing.assert_allclose(np.concatenate(ys), conv_whole(x, w, cb), rtol=1e-12, atol=1e-12)


def test_conv_spec_window_holds_every_acceptance():
    # after a spec row of T tokens, offset a - 1 is the history after accepting a tokens
    K, S, D = 3, 3, 2
    W = K - 1 + S
    hist_x, x = RNG.normal(size=(K - 1, D)), RNG.normal(size=(1 + S, D))
    w, cb = RNG.normal(size=(D, K)), np.zeros(D)
    pool = np.zeros((3, W, D))
    pool[1, :K - 1] = hist_x
    _, pool, _ = causal_conv1d_update_ref(x, w, cb, pool, [0, 1 + S], [1], [0], [2], [1],
                                          activation="none")
    seq = np.concatenate([hist_x, x])
    for acc in range(1, 2 + S):
        np.testing.assert_array_equal(pool[2, acc - 1:acc - 1 + K - 1], seq[acc:acc + K - 1])


def test_conv_faulty_rows_write_nothing():
    K, S, D = 3, 1, 2
    W = K - 1 + S
    pool = RNG.normal(size=(4, W, D))
    x = RNG.normal(size=(5, D))
    cu = [0, 1, 2, 3, 5]
    y, out, f = causal_conv1d_update_ref(
        x, RNG.normal(size=(D, K)), None, pool, cu, [4, 1, 1, 1], [0, 2, 0, 0],
        [0, 0, -3, 2], [0, 0, 0, 1])
    # read block past NB; offset past W - K + 1; a write block below -1; a good spec row
    assert f.tolist() == [Fault.BAD_BLOCK, Fault.BAD_OFFSET, Fault.BAD_BLOCK, 0]
    assert (y[:3] == 0).all() and (out[[0, 3]] == pool[[0, 3]]).all()
    _, _, f = causal_conv1d_update_ref(x[:3], RNG.normal(size=(D, K)), None, pool, [0, 3],
                                       [1], [0], [2], [1])
    assert f.tolist() == [Fault.BAD_QUERY_LEN]


def delta_rule_matrix(q, k, v, g, beta, h):
    """h_t = exp(g) h (I - beta k k^T) + beta v k^T; o = h_t q (one head, [V, K] state)."""
    outs = []
    for t in range(len(q)):
        kk = k[t][:, None]
        h = np.exp(g[t]) * h @ (np.eye(len(kk)) - beta[t] * kk @ kk.T) + beta[t] * v[t][:, None] @ kk.T
        outs.append(h @ q[t])
    return np.array(outs), h


@pytest.mark.parametrize("l2norm", [False, True])
def test_gdn_equals_the_matrix_form(l2norm):
    T, K, V = 6, 4, 3
    q, k, v = RNG.normal(size=(T, 1, K)), RNG.normal(size=(T, 1, K)), RNG.normal(size=(T, 1, V))
    g, beta = -RNG.uniform(0, 1, (T, 1)), RNG.uniform(0, 1, (T, 1))
    pool = RNG.normal(size=(3, 1, V, K))
    o, out, f = gated_delta_rule_ref(q, k, v, pool, [0, T], [1], [[2]], [0], g=g, beta=beta,
                                     scale=0.7, use_qk_l2norm=l2norm)
    qn, kn = q[:, 0], k[:, 0]
    if l2norm:
        qn = qn / np.sqrt((qn ** 2).sum(-1, keepdims=True) + 1e-6)
        kn = kn / np.sqrt((kn ** 2).sum(-1, keepdims=True) + 1e-6)
    want_o, want_h = delta_rule_matrix(0.7 * qn, kn, v[:, 0], g[:, 0], beta[:, 0], pool[1, 0])
    np.testing.assert_allclose(o[:, 0], want_o, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[2, 0], want_h, rtol=1e-12, atol=1e-12)
    assert (out[[0, 1]] == pool[[0, 1]]).all() and not f.any()


def test_gdn_spec_candidates_are_the_prefix_states_and_gva_and_layouts_agree():
    T, H, HV, K, V, S = 3, 2, 4, 4, 2, 2
    q, k = RNG.normal(size=(T, H, K)), RNG.normal(size=(T, H, K))
    v = RNG.normal(size=(T, HV, V))
    A_log, dt_bias = RNG.normal(size=HV), RNG.normal(size=HV)
    a, b = RNG.normal(size=(T, HV)), RNG.normal(size=(T, HV))
    pool = RNG.normal(size=(8, HV, V, K))
    kw = dict(A_log=A_log, a=a, dt_bias=dt_bias, b=b)
    o, spec_pool, f = gated_delta_rule_ref(q, k, v, pool, [0, T], [7], [[1, 2, 3]], [1], **kw)
    assert not f.any()
    for j in range(T):  # candidate j = the final state of the first j + 1 tokens
        sl = slice(0, j + 1)
        oj, pj, _ = gated_delta_rule_ref(q[sl], k[sl], v[sl], pool, [0, j + 1], [7], [[4, -1, -1]],
                                         [0], **{n: (x if x.ndim == 1 else x[sl]) for n, x in kw.items()})
        np.testing.assert_array_equal(spec_pool[1 + j], pj[4])
        np.testing.assert_array_equal(o[sl], oj)
    # value head i uses qk head i // (HV / H): the same as repeating q and k per value head
    rep = np.repeat(np.arange(H), HV // H)
    o2, p2, _ = gated_delta_rule_ref(q[:, rep], k[:, rep], v, pool, [0, T], [7], [[1, 2, 3]],
                                     [1], **kw)
    np.testing.assert_array_equal(o2, o)
    np.testing.assert_array_equal(p2, spec_pool)
    # the [K, V] layout holds the transposed states
    o3, p3, _ = gated_delta_rule_ref(q, k, v, np.swapaxes(pool, 2, 3).copy(), [0, T], [7],
                                     [[1, 2, 3]], [1], layout="KV", **kw)
    np.testing.assert_array_equal(o3, o)
    np.testing.assert_array_equal(np.swapaxes(p3, 2, 3), spec_pool)


def test_gdn_zero_read_block_and_faults():
    T, K, V = 2, 2, 2
    q, k, v = (RNG.normal(size=(T, 1, n)) for n in (K, K, V))
    g, beta = np.zeros((T, 1)), np.ones((T, 1))
    pool = RNG.normal(size=(3, 1, V, K))
    # fresh row from a zero state; a row reading block 3 of 3; a spec row of 3 > 1 + S tokens
    q3, k3, v3 = (np.concatenate([x, x, x[:1], x, x[:1]]) for x in (q, k, v))
    g3, b3 = np.zeros((8, 1)), np.ones((8, 1))
    o, out, f = gated_delta_rule_ref(q3, k3, v3, pool, [0, 2, 4, 7], [-1, 3, 1],
                                     [[2, -1], [1, -1], [1, 2]], [0, 0, 1], g=g3, beta=b3)
    assert f.tolist() == [0, Fault.BAD_BLOCK, Fault.BAD_QUERY_LEN]
    assert (o[2:7] == 0).all() and (out[[0, 1]] == pool[[0, 1]]).all()
    want_o, want_h = delta_rule_matrix(q[:, 0] * K ** -0.5, k[:, 0], v[:, 0], g[:, 0],
                                       beta[:, 0], np.zeros((V, K)))
    np.testing.assert_allclose(o[:2, 0], want_o, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[2, 0], want_h, rtol=1e-12, atol=1e-12)


def test_gates_and_softplus():
    x = np.array([-30.0, 0.0, 19.9, 20.0, 20.1, 40.0])
    np.testing.assert_allclose(softplus(x)[:3], np.log1p(np.exp(x[:3])), rtol=1e-14)
    assert softplus(x)[4:].tolist() == [20.1, 40.0]
    g, beta = gates(np.array([0.5]), np.array([[1.0]]), np.array([-0.25]), np.array([[0.0]]))
    np.testing.assert_allclose(g, -np.exp(0.5) * np.log1p(np.exp(0.75)), rtol=1e-14)
    assert beta.tolist() == [[0.5]]


def ssd_sum(x, d, A, B, C, D, h0):
    """Mamba2's recurrence of one head as a sum: the state after token ``t`` is
    ``exp(A * sum(d[:t+1])) h0 + sum_s exp(A * sum(d[s+1:t+1])) d[s] x[s] B[s]^T`` and
    ``y[t] = h_t C[t] + D x[t]``; ``x`` ``[T, P]``, ``d`` ``[T]`` (the step sizes),
    ``B``, ``C`` ``[T, N]``, ``h0`` ``[P, N]``."""
    ys, hs = [], []
    for t in range(len(x)):
        h = np.exp(A * d[:t + 1].sum()) * h0
        for s in range(t + 1):
            h = h + np.exp(A * d[s + 1:t + 1].sum()) * d[s] * np.outer(x[s], B[s])
        ys.append(h @ C[t] + D * x[t])
        hs.append(h)
    return np.array(ys), hs


@pytest.mark.parametrize("dt_softplus", [False, True])
def test_selective_state_update_equals_the_sum_form(dt_softplus):
    T, H, G, P, N = 5, 4, 2, 3, 6
    x, dt = RNG.normal(size=(T, H, P)), RNG.normal(size=(T, H))
    B, C = RNG.normal(size=(T, G, N)), RNG.normal(size=(T, G, N))
    A, D, dt_bias = -RNG.uniform(0.5, 2, H), RNG.normal(size=H), RNG.uniform(0.5, 1, H)
    pool = RNG.normal(size=(3, H, P, N))
    y, out, f = selective_state_update_ref(x, dt, A, B, C, D, dt_bias, pool, [0, T], [1], [[2]],
                                           [0], dt_softplus=dt_softplus)
    d = dt + dt_bias
    d = np.log1p(np.exp(d)) if dt_softplus else d
    for h in range(H):  # head h uses group h // (H / G)
        g = h // (H // G)
        want_y, want_h = ssd_sum(x[:, h], d[:, h], A[h], B[:, g], C[:, g], D[h], pool[1, h])
        np.testing.assert_allclose(y[:, h], want_y, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(out[2, h], want_h[-1], rtol=1e-12, atol=1e-12)
    assert (out[[0, 1]] == pool[[0, 1]]).all() and not f.any()


def test_selective_state_spec_candidates_are_the_prefix_states_and_faults():
    T, H, G, P, N = 3, 2, 1, 2, 4
    x, dt = RNG.normal(size=(T, H, P)), RNG.normal(size=(T, H))
    B, C = RNG.normal(size=(T, G, N)), RNG.normal(size=(T, G, N))
    A, D, dt_bias = -RNG.uniform(0.5, 2, H), RNG.normal(size=H), RNG.normal(size=H)
    pool = RNG.normal(size=(8, H, P, N))
    y, spec_pool, f = selective_state_update_ref(x, dt, A, B, C, D, dt_bias, pool, [0, T], [7],
                                                 [[1, 2, 3]], [1])
    assert not f.any()
    for j in range(T):  # candidate j = the final state of the first j + 1 tokens
        sl = slice(0, j + 1)
        yj, pj, _ = selective_state_update_ref(x[sl], dt[sl], A, B[sl], C[sl], D, dt_bias, pool,
                                               [0, j + 1], [7], [[4, -1, -1]], [0])
        np.testing.assert_array_equal(spec_pool[1 + j], pj[4])
        np.testing.assert_array_equal(y[sl], yj)
    # a fresh row (zero state); a read block past NB; a spec row of 3 > 1 + S tokens
    x3, dt3, B3, C3 = (np.concatenate([a, a[:1], a]) for a in (x, dt, B, C))
    y3, out3, f3 = selective_state_update_ref(x3, dt3, A, B3, C3, D, dt_bias, pool[:3],
                                              [0, 3, 4, 7], [-1, 3, 1], [[2, -1], [1, -1], [1, 2]],
                                              [0, 0, 1])
    assert f3.tolist() == [0, Fault.BAD_BLOCK, Fault.BAD_QUERY_LEN]
    assert (y3[3:] == 0).all() and (out3[[0, 1]] == pool[[0, 1]]).all()
    zero, _, _ = selective_state_update_ref(x, dt, A, B, C, D, dt_bias, 0 * pool, [0, T], [7],
                                            [[4, -1, -1]], [0])
    np.testing.assert_array_equal(y3[:3], zero)

"""Bookkeeping (docs/semantics.md §1-2), checked three ways (core, torch, JAX): unit cases,
the worked example of §2 number by number, and random batches against a plain per-row
transcription of the rules written independently of the core. Bad input: test_faults.py."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import slots

from mamba_align.core import accept, copy_plan, init_slots, postprocess, preprocess

def cdiv(a, b):
    return -(-a // b)


# -- a per-row transcription of docs/semantics.md §2, written independently of core -------------
def spec_preprocess(st_idx, acc, nc, idx_mapping, query_len, B):
    st_idx, acc = list(st_idx), list(acc)
    rows = []
    for b, r in enumerate(idx_mapping):
        if r < 0:
            rows.append((-1, 0, -1))
            continue
        src_col = st_idx[r]
        src_bias = max(acc[r] - 1, 0)
        new = max(src_col, cdiv(nc[r] + query_len[b], B) - 1)
        st_idx[r] = new
        if src_col >= 0 and src_col != new:
            acc[r] = 1
        rows.append((src_col, src_bias, new))
    return st_idx, acc, rows


def spec_postprocess(st_idx, acc, nc, idx_mapping, B):
    acc_out = list(acc)
    rows = []
    for r in idx_mapping:
        if r < 0:
            rows.append(None)
            continue
        running = nc[r] - acc[r] + 1
        aligned = (nc[r] // B) * B
        if aligned >= running and aligned > 0:
            bias, dest = aligned - running, aligned // B - 1
            if dest == st_idx[r]:
                acc_out[r] = 1
            rows.append((dest, bias, not (dest == st_idx[r] and bias == 0)))
        else:
            rows.append(None)
    return acc_out, rows


# -- unit cases -------------------------------------------------------------------------
def test_init_and_add_requests_seed_columns(backend):
    s = init_slots(5)
    assert s.state_idx.tolist() == [-1] * 5 and s.acc.tolist() == [1] * 5
    s2 = backend.add_requests(s, [0, 2, 4, 3], [0, 8, 9, 7], 4)
    # fresh -> -1; a hit of 2 full blocks (8 tokens) -> column 1; 9 -> 2; 7 -> 1
    assert s2.state_idx.tolist() == [-1, -1, 1, 1, 2]
    assert s2.num_computed.tolist() == [0, 0, 8, 7, 9]
    assert s.state_idx.tolist() == [-1] * 5  # input untouched


def test_preprocess_fresh_same_column_crossing_and_skip(backend):
    B, S = 4, 2
    s = slots([-1, 0, 0, 1, 5], [1, 3, 2, 1, 2], [0, 1, 2, 7, 0])
    idx = np.array([0, -1, 1, 2, 3])
    q = np.array([3, 0, 1, 3, 2])
    bt = np.arange(1, 1 + 5 * 7).reshape(5, 7)
    new, out = backend.preprocess_resolve(s, idx, q, np.ones(5, bool), bt, B, S)
    # row0 fresh: 3 tokens -> column 0, no crossing
    # row2 slot1: 1+1=2 tokens, column 0 -> stays, acc kept 3
    # row3 slot2: 2+3=5 tokens -> column 1, crossing from 0 with bias acc-1=1, acc reset
    # row4 slot3: 7+2=9 -> column 2, crossing from 1 with bias 0
    assert out["src_col"].tolist() == [-1, -1, 0, 0, 1]
    assert out["src_bias"].tolist() == [0, 0, 2, 1, 0]
    assert out["run_col"].tolist() == [0, -1, 0, 1, 2]
    # the pre-copy of the crossing rows: temporal bt[src_col + bias], conv bt[src_col]
    assert out["copy_tsrc"].tolist() == [-1, -1, -1, bt[2, 1], bt[3, 1]]
    assert out["copy_csrc"].tolist() == [-1, -1, -1, bt[2, 0], bt[3, 1]]
    assert out["copy_dst"].tolist() == [-1, -1, -1, bt[2, 1], bt[3, 2]]
    assert out["copy_bias"].tolist() == [0, 0, 0, 1, 0]
    assert new.state_idx.tolist() == [0, 0, 1, 2, 5]
    assert new.acc.tolist() == [1, 3, 1, 1, 2]  # slot 4 is not in the batch: untouched
    assert new.num_computed.tolist() == s.num_computed.tolist()  # preprocess never advances


def test_preprocess_never_moves_back(backend):
    # Last step scheduled 4 tokens from 6 (-> column 2 with B=4, S=3) and kept one; this one
    # schedules 1.
    s = slots([2], [1], [7])
    _, out = backend.preprocess_resolve(s, [0], [1], [True], np.arange(1, 7)[None], 4, 3)
    assert out["run_col"].tolist() == [2] and out["copy_dst"].tolist() == [-1]


def test_accept_spec_and_non_spec_rows():
    # the core's accept alone; the kernels fuse it into postprocess (tested below)
    s = slots([0, 0, 0], [1, 1, 1], [4, 10, 3])
    idx, q = np.array([0, 1, 2]), np.array([4, 6, 1])
    new = accept(s, idx, q, np.array([3, 0, 1]), np.array([True, False, True]))
    assert new.acc.tolist() == [3, 1, 1]  # the non-spec row: acc 1, its whole query counted
    assert new.num_computed.tolist() == [7, 16, 4]


@pytest.mark.parametrize("unused", [0, -1, 99])
def test_postprocess_accepts_spec_and_non_spec_rows(backend, unused):
    s = slots([1, 3, 0], [1, 1, 1], [4, 10, 3])
    bt = np.arange(1, 1 + 3 * 5).reshape(3, 5)
    new, out = backend.postprocess(s, [0, 1, 2], [4, 6, 1], [True, False, True], [3, unused, 1],
                                   bt, 4, 3)
    # spec rows take num_sampled, the non-spec row its whole query (its num_sampled unused,
    # whatever it holds: docs/semantics.md constrains it on spec rows only)
    assert new.acc.tolist() == [3, 1, 1] and new.num_computed.tolist() == [7, 16, 4]
    # slot 1's chunk and slot 2's token end on a boundary in their own column: cached as
    # they are, no copy; slot 0 (running 5, boundary 4) reached none
    assert out["cache_col"].tolist() == [-1, 3, 0] and out["copy_dst"].tolist() == [-1] * 3


@pytest.mark.parametrize(
    "st_idx,acc,nc,expect",
    [
        # no boundary reached
        (1, 2, 6, None),
        # chunk ending on a boundary: dest == state_idx, bias 0 -> cache, no copy
        (1, 1, 8, (1, 0, False, 1)),
        # dest == state_idx, bias 2: in-place shift, acc reset
        (1, 3, 8, (1, 2, True, 1)),
        # dest == state_idx - 1: the kept previous block receives the boundary, acc kept
        (2, 2, 8, (1, 1, True, 2)),
    ],
)
def test_postprocess_cases(backend, st_idx, acc, nc, expect):
    # a spec row that sampled `acc` tokens, so that after accept (acc, num_computed) are
    # the case's
    bt = np.array([[10, 11, 12, 13, 14]])
    s = slots([st_idx], [1], [nc - acc])
    new, out = backend.postprocess(s, [0], [acc], [True], [acc], bt, 4, 3)
    assert new.num_computed[0] == nc
    if expect is None:
        assert out["cache_col"][0] == -1 and out["copy_dst"][0] == -1 and new.acc[0] == acc
    else:
        dest, bias, copy, acc_after = expect
        assert out["cache_col"][0] == dest and new.acc[0] == acc_after
        if copy:
            assert (out["copy_dst"][0], out["copy_bias"][0]) == (bt[0, dest], bias)
            assert out["copy_tsrc"][0] == bt[0, st_idx + bias]
            assert out["copy_csrc"][0] == bt[0, st_idx]
        else:
            assert out["copy_dst"][0] == -1 and out["copy_tsrc"][0] == -1


def test_the_reference_rejects_inconsistent_state():
    with pytest.raises(ValueError, match="inconsistent bookkeeping"):
        postprocess(slots([3], [1], [8]), [0], 4)  # boundary column 1, state_idx 3
    # a step would serve column 0 as the state after 100 tokens (column 24 with B = 4)
    with pytest.raises(ValueError, match="state_idx 0 is behind the column of its 100"):
        preprocess(slots([0], [1], [100]), [0], [1], 4)
    with pytest.raises(ValueError, match="state_idx -1 is behind"):
        preprocess(slots([-1], [1], [5]), [0], [1], 4)


# -- docs/semantics.md §2 worked example: B = 560, S = 3, two accepted per step ---------
def test_worked_example_number_by_number(backend):
    B, S = 560, 3  # every step schedules 1 + 3 tokens
    bt = np.array([[7, 3, 5, 9, 11]])  # physical blocks of columns 0..4
    # A step at 556 computed with 4 scheduled: state_idx = 0.
    s = backend.add_requests(slots([-1], [1], [0]), [0], [556], B)
    assert s.state_idx[0] == 0  # (556 - 1) // 560
    s, p = backend.preprocess_resolve(s, [0], [4], [True], bt, B, S)
    assert (p["src_col"][0], p["run_col"][0], p["copy_dst"][0]) == (0, 0, -1)
    s, post = backend.postprocess(s, [0], [4], [True], [2], bt, B, S)
    assert (s.num_computed[0], s.acc[0]) == (558, 2)
    assert post["cache_col"][0] == -1 and post["copy_dst"][0] == -1  # running 557: nothing

    # Next step at 558: state_idx = 1, bias 1, acc = 1.
    s, p = backend.preprocess_resolve(s, [0], [4], [True], bt, B, S)
    assert (p["src_col"][0], p["src_bias"][0], p["run_col"][0]) == (0, 1, 1)
    assert (s.state_idx[0], s.acc[0]) == (1, 1)
    # temporal bt[0 + 1] -> bt[1]: a self-copy (block 3 rotated into column 1);
    # conv shifted by 1 from bt[0] into bt[1].
    assert [p[n][0] for n in ("copy_tsrc", "copy_csrc", "copy_dst", "copy_bias")] == [3, 7, 3, 1]

    # Accept 2 -> 560: running 559, aligned 560, bias 1, dest 0.
    s, post = backend.postprocess(s, [0], [4], [True], [2], bt, B, S)
    assert (s.num_computed[0], s.acc[0]) == (560, 2)  # dest != state_idx: acc kept
    assert post["cache_col"][0] == 0
    # temporal window column 1 (bt[2] = 5) -> bt[0]; conv bt[1] shifted by 1 -> bt[0]
    got = [post[n][0] for n in ("copy_tsrc", "copy_csrc", "copy_dst", "copy_bias")]
    assert got == [5, 3, 7, 1]
    # the core's copy_plan with the same columns gives the same plan
    direct = copy_plan(bt, [0], [1], [0], [1])
    assert [int(getattr(direct, f)[0]) for f in ("tsrc", "csrc", "dst", "bias")] == got


# -- random batches == the per-row transcription --------------------------------------------
@st.composite
def batches(draw):
    B = draw(st.integers(1, 9))
    S = draw(st.integers(0, B - 1))
    n = draw(st.integers(1, 8))
    st_idx = draw(st.lists(st.integers(-1, 6), min_size=n, max_size=n))
    acc = draw(st.lists(st.integers(1, S + 1), min_size=n, max_size=n))
    # a state steps leave: cdiv(nc, B) - 1 <= state_idx <= cdiv(nc + S, B) - 1
    nc = [0 if c < 0 else draw(st.integers(c * B + (S == 0), (c + 1) * B)) for c in st_idx]
    perm = draw(st.permutations(range(n)))
    k = draw(st.integers(0, n))
    idx = list(perm[:k]) + [-1] * draw(st.integers(0, 3))
    idx = draw(st.permutations(idx))
    # spec rows of at most 1 + S tokens; non-spec rows (prefill chunks, plain decode) of up
    # to three blocks and more
    spec = [draw(st.booleans()) for _ in idx]
    q = [draw(st.integers(1, S + 1) if sp else st.integers(1, 3 * B + 2)) if r >= 0 else 0
         for r, sp in zip(idx, spec)]
    return B, S, st_idx, acc, nc, list(idx), q, spec


def table(n, cols=24):  # room for any window of batches()
    return np.arange(1, 1 + n * cols).reshape(n, cols)  # every block distinct, none null


def test_preprocess_matches_the_transcription(backend):
    @settings(max_examples=backend.examples(300))
    @given(batches())
    def run(args):
        B, S, st_idx, acc, nc, idx, q, spec = args
        idx, q = np.array(idx, dtype=np.int64), np.array(q, dtype=np.int64)
        new, out = backend.preprocess_resolve(slots(st_idx, acc, nc), idx, q,
                                              np.array(spec, bool), table(len(st_idx)), B, S)
        want_idx, want_acc, rows = spec_preprocess(st_idx, acc, nc, idx.tolist(), q.tolist(), B)
        assert new.state_idx.tolist() == want_idx and new.acc.tolist() == want_acc
        got = list(zip(out["src_col"].tolist(), out["src_bias"].tolist(),
                       out["run_col"].tolist()))
        assert got == rows

    run()


def test_postprocess_matches_the_transcription(backend):
    @settings(max_examples=backend.examples(300))
    @given(batches(), st.data())
    def run(args, data):
        B, S, st_idx, acc, nc, idx, q, spec = args
        # a consistent state: preprocess, then accept some tokens on spec rows (non-spec
        # rows accept all of theirs, whatever num_sampled says)
        ns = np.array([data.draw(st.integers(1, qq)) if qq else 0 for qq in q], dtype=np.int64)
        idx, q = np.array(idx, dtype=np.int64), np.array(q, dtype=np.int64)
        spec = np.array(spec, bool)
        s, _ = preprocess(slots(st_idx, acc, nc), idx, q, B)
        mid = accept(s, idx, q, ns, spec)
        want_acc, rows = spec_postprocess(mid.state_idx.tolist(), mid.acc.tolist(),
                                          mid.num_computed.tolist(), idx.tolist(), B)
        bt = table(len(st_idx))
        new, out = backend.postprocess(s, idx, q, spec, ns, bt, B, S)
        assert new.acc.tolist() == want_acc
        assert new.num_computed.tolist() == mid.num_computed.tolist()
        for b, row in enumerate(rows):
            if row is None:
                assert out["cache_col"][b] == -1 and out["copy_dst"][b] == -1
            else:
                dest, bias, copy = row
                assert out["cache_col"][b] == dest
                assert out["copy_dst"][b] == (bt[idx[b], dest] if copy else -1)
                assert out["copy_bias"][b] == (bias if copy else 0)

    run()

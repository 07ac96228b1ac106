"""Bookkeeping (SPEC.md §1-2): unit cases, the worked example of §2 number by number, and
the vectorized functions against a plain per-row transcription of the SPEC text."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mamba_align.core import (
    SlotState,
    accept,
    add_requests,
    copy_plan,
    init_slots,
    postprocess,
    postprocess_copy_plan,
    precopy_plan,
    preprocess,
)


def slots(state_idx, acc, nc):
    return SlotState(np.array(state_idx), np.array(acc), np.array(nc))


def cdiv(a, b):
    return -(-a // b)


# -- a per-row transcription of SPEC.md §2, written independently of core -------------
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
def test_init_and_add_requests_seed_columns():
    s = init_slots(5)
    assert s.state_idx.tolist() == [-1] * 5 and s.acc.tolist() == [1] * 5
    s2 = add_requests(s, [0, 2, 4, 3], [0, 8, 9, 7], block_size=4)
    # fresh -> -1; a hit of 2 full blocks (8 tokens) -> column 1; 9 -> 2; 7 -> 1
    assert s2.state_idx.tolist() == [-1, -1, 1, 1, 2]
    assert s2.num_computed.tolist() == [0, 0, 8, 7, 9]
    assert s.state_idx.tolist() == [-1] * 5  # input untouched


def test_preprocess_fresh_same_column_crossing_and_skip():
    B = 4
    s = slots([-1, 0, 0, 1, 5], [1, 3, 2, 1, 2], [0, 1, 2, 7, 0])
    idx = np.array([0, -1, 1, 2, 3])
    q = np.array([3, 0, 1, 3, 2])
    new, plan = preprocess(s, idx, q, B)
    # row0 fresh: 3 tokens -> column 0, no crossing
    # row2 slot1: 1+1=2 tokens, column 0 -> stays, acc kept 3
    # row3 slot2: 2+3=5 tokens -> column 1, crossing from 0 with bias acc-1=1, acc reset
    # row4 slot3: 7+2=9 -> column 2, crossing from 1 with bias 0
    assert plan.src_col.tolist() == [-1, -1, 0, 0, 1]
    assert plan.src_bias.tolist() == [0, 0, 2, 1, 0]
    assert plan.run_col.tolist() == [0, -1, 0, 1, 2]
    assert plan.crossing.tolist() == [False, False, False, True, True]
    assert new.state_idx.tolist() == [0, 0, 1, 2, 5]
    assert new.acc.tolist() == [1, 3, 1, 1, 2]  # slot 4 is not in the batch: untouched
    assert new.num_computed.tolist() == s.num_computed.tolist()  # preprocess never advances


def test_preprocess_never_moves_back():
    # Last step scheduled 4 tokens from 6 (-> column 2 with B=4); this one schedules 1.
    s = slots([2], [1], [7])
    new, plan = preprocess(s, [0], [1], 4)
    assert plan.run_col.tolist() == [2] and not plan.crossing[0]


def test_accept_spec_and_non_spec_rows():
    s = slots([0, 0, 0], [1, 1, 1], [4, 10, 3])
    idx, q = np.array([0, 1, 2]), np.array([4, 6, 1])
    ns = np.array([3, 0, 0])
    spec = np.array([True, False, True])
    new = accept(s, idx, q, ns, spec)
    assert new.acc.tolist() == [3, 1, 1]  # spec row with 0 sampled keeps acc >= 1
    assert new.num_computed.tolist() == [7, 16, 3]


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
def test_postprocess_cases(st_idx, acc, nc, expect):
    s = slots([st_idx], [acc], [nc])
    new, plan = postprocess(s, [0], 4)
    if expect is None:
        assert plan.cache_col[0] == -1 and not plan.copy[0] and new.acc[0] == acc
    else:
        dest, bias, copy, acc_after = expect
        assert (plan.dest[0], plan.bias[0], bool(plan.copy[0])) == (dest, bias, copy)
        assert plan.cache_col[0] == dest and new.acc[0] == acc_after


def test_postprocess_rejects_inconsistent_state():
    with pytest.raises(ValueError, match="inconsistent bookkeeping"):
        postprocess(slots([3], [1], [8]), [0], 4)  # boundary column 1, state_idx 3


# -- SPEC.md §2 worked example: B = 560, S = 3, two accepted per step -------------------
def test_worked_example_number_by_number():
    B = 560  # S = 3: every step schedules 1 + 3 tokens
    bt = np.array([[7, 3, 5, 9, 11]])  # physical blocks of columns 0..4
    s = slots([-1], [1], [0])
    # A step at 556 computed with 4 scheduled: state_idx = 0.
    s = add_requests(s, [0], [556], B)
    assert s.state_idx[0] == 0  # (556 - 1) // 560
    s, p = preprocess(s, [0], [4], B)
    assert (p.src_col[0], p.state_idx[0], bool(p.crossing[0])) == (0, 0, False)
    s = accept(s, [0], [4], [2], True)
    assert (s.num_computed[0], s.acc[0]) == (558, 2)
    s, post = postprocess(s, [0], B)  # running 557, aligned 0: nothing
    assert post.cache_col[0] == -1 and not post.copy[0]

    # Next step at 558: state_idx = 1, bias 1, acc = 1.
    s, p = preprocess(s, [0], [4], B)
    assert (p.src_col[0], p.src_bias[0], p.state_idx[0], bool(p.crossing[0])) == (0, 1, 1, True)
    assert (s.state_idx[0], s.acc[0]) == (1, 1)
    pre = precopy_plan(bt, [0], p)
    # temporal bt[0 + 1] -> bt[1]: a self-copy (block 3 rotated into column 1);
    # conv shifted by 1 from bt[0] into bt[1].
    assert (pre.tsrc[0], pre.csrc[0], pre.dst[0], pre.bias[0]) == (3, 7, 3, 1)

    # Accept 2 -> 560: running 559, aligned 560, bias 1, dest 0.
    s = accept(s, [0], [4], [2], True)
    assert (s.num_computed[0], s.acc[0]) == (560, 2)
    s, post = postprocess(s, [0], B)
    assert (post.dest[0], post.bias[0], bool(post.copy[0]), post.cache_col[0]) == (0, 1, True, 0)
    assert s.acc[0] == 2  # dest != state_idx: the state stays in window column 1
    cp = postprocess_copy_plan(bt, [0], post)
    # temporal window column 1 (bt[2] = 5) -> bt[0]; conv bt[1] shifted by 1 -> bt[0]
    assert (cp.tsrc[0], cp.csrc[0], cp.dst[0], cp.bias[0]) == (5, 3, 7, 1)
    # copy_plan directly with the same columns gives the same plan
    direct = copy_plan(bt, [0], [1], [0], [1])
    assert all(np.array_equal(getattr(cp, f), getattr(direct, f))
               for f in ("tsrc", "csrc", "dst", "shift"))


# -- vectorized == per-row transcription on random inputs -----------------------------
@st.composite
def batches(draw):
    B = draw(st.integers(1, 9))
    S = draw(st.integers(0, B - 1))
    n = draw(st.integers(1, 8))
    st_idx = draw(st.lists(st.integers(-1, 6), min_size=n, max_size=n))
    acc = draw(st.lists(st.integers(1, S + 1), min_size=n, max_size=n))
    nc = [0 if c < 0 else draw(st.integers(c * B, (c + 1) * B)) for c in st_idx]
    perm = draw(st.permutations(range(n)))
    k = draw(st.integers(0, n))
    idx = list(perm[:k]) + [-1] * draw(st.integers(0, 3))
    idx = draw(st.permutations(idx))
    q = [draw(st.integers(1, S + 1)) if r >= 0 else 0 for r in idx]
    return B, S, st_idx, acc, nc, list(idx), q


@settings(max_examples=300)
@given(batches())
def test_preprocess_matches_spec_transcription(args):
    B, S, st_idx, acc, nc, idx, q = args
    s = slots(st_idx, acc, nc)
    idx, q = np.array(idx, dtype=np.int64), np.array(q, dtype=np.int64)
    new, plan = preprocess(s, idx, q, B)
    want_idx, want_acc, rows = spec_preprocess(st_idx, acc, nc, idx.tolist(), q.tolist(), B)
    assert new.state_idx.tolist() == want_idx and new.acc.tolist() == want_acc
    assert list(zip(plan.src_col.tolist(), plan.src_bias.tolist(), plan.run_col.tolist())) == rows


@settings(max_examples=300)
@given(batches(), st.data())
def test_postprocess_matches_spec_transcription(args, data):
    B, S, st_idx, acc, nc, idx, q = args
    # Build a consistent state: preprocess, then accept some tokens on spec rows.
    ns = np.array([data.draw(st.integers(0, qq)) for qq in q], dtype=np.int64)
    idx, q = np.array(idx, dtype=np.int64), np.array(q, dtype=np.int64)
    s, _ = preprocess(slots(st_idx, acc, nc), idx, q, B)
    s = accept(s, idx, q, ns, True)
    want_acc, rows = spec_postprocess(
        s.state_idx.tolist(), s.acc.tolist(), s.num_computed.tolist(), idx.tolist(), B
    )
    new, plan = postprocess(s, idx, B)
    assert new.acc.tolist() == want_acc
    for b, row in enumerate(rows):
        if row is None:
            assert plan.cache_col[b] == -1 and not plan.copy[b]
        else:
            assert (plan.dest[b], plan.bias[b], bool(plan.copy[b])) == row
            assert plan.cache_col[b] == row[0]

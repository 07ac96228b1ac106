"""Fuzzing the device path with bad values (docs/semantics.md §1, "Bad values"), torch and
JAX: random good steps with random faults injected into some rows (each kind alone and
mixed with good rows), run as whole steps (preprocess and resolve, the pre-copy,
postprocess, its copies) on sentinel-filled pools, then a second step on the same slots.
Checked for every example:

* the good rows give exactly what they give alone: per-row results, bookkeeping and the
  pools, bit for bit, equal the core run on the good rows only;
* the faulty rows get nothing (no blocks, no copy, no cache column), their slots are left
  faulty (acc = 0) and the next step skips them (flagged);
* no block outside the good rows' own blocks changed, and never the null block;
* the error flag names every injected fault, nothing else, and the lowest faulty row; the
  faulty rows and the flag's bits are exactly those of the core's non-raising screen
  (``mamba_align.core.screen``).

``FUZZ_EXAMPLES`` sets the examples per backend (CI: 150 each; ``make gpu``: 5000).
"""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import COPY_PLAN, Reference, in_flight, slots

from mamba_align.core import (CacheConfig, ConvSpec, CopyPlan, Fault, TemporalSpec, apply_copy,
                              screen_postprocess, screen_preprocess)

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))
B, S, SLOTS, ROWS, COLS = 4, 2, 16, 12, 8  # rows of two programs (kernels.bookkeeping)
NB = SLOTS * COLS + 3  # every slot owns COLS distinct blocks; block 0 null, 2 spare
CFG = CacheConfig(B, S, 1, {"conv": ConvSpec(3, 4, "SD", "float32"),
                            "ssm": TemporalSpec((2, 2), "float32")})
SENTINEL = np.float32(-7.5)

#: fault kinds, by the stage that sees them, and the bit each must raise
PRE_KINDS = {"block_big": Fault.BAD_BLOCK, "block_neg": Fault.BAD_BLOCK,
             "block_null": Fault.BAD_BLOCK, "block_missing": Fault.BAD_BLOCK,
             "column": Fault.BAD_COLUMN,
             "slot_big": Fault.BAD_SLOT, "slot_neg": Fault.BAD_SLOT,
             "dup": Fault.DUPLICATE_SLOT, "q_zero": Fault.BAD_QUERY_LEN,
             "q_big": Fault.BAD_QUERY_LEN, "is_spec_2": Fault.BAD_IS_SPEC,
             "faulty": Fault.FAULTY_SLOT, "in_flight": Fault.STEP_ORDER,
             "col_behind": Fault.INCONSISTENT, "col_ahead": Fault.INCONSISTENT}
POST_KINDS = {"ns_zero": Fault.BAD_NUM_SAMPLED, "ns_big": Fault.BAD_NUM_SAMPLED,
              "window_missing": Fault.BAD_BLOCK}
#: read from the slot's state or its blocks: not checked on a row that already faults
STATE_STAGE = {"block_big", "block_neg", "block_null", "block_missing", "column", "faulty",
               "in_flight", "col_behind", "col_ahead"}


def good_step(rng):
    """A valid step: distinct slots, consistent bookkeeping, each slot its own blocks."""
    bt = rng.permutation(np.arange(1, NB))[: SLOTS * COLS].reshape(SLOTS, COLS)
    nc = rng.integers(0, 3 * B, SLOTS)
    state = slots((nc - 1) // B, np.ones(SLOTS, np.int64), nc)
    idx = rng.permutation(SLOTS)[:ROWS]
    spec = rng.integers(0, 2, ROWS)
    q = np.where(spec == 1, rng.integers(1, 2 + S, ROWS), rng.integers(1, 2 * B, ROWS))
    ns = np.where(spec == 1, [rng.integers(1, qq + 1) for qq in q], 1)
    return state, idx, q, spec, ns, bt


def inject(rng, kinds, state, idx, q, spec, ns, bt):
    """Faults into rows 0..len(kinds)-1 (a kind or None each); returns the inputs and, per
    row, the set of its faults. A duplicate names a later good row's slot: both fault."""
    state = state.copy()
    idx, q, spec, ns, bt = (a.copy() for a in (idx, q, spec, ns, bt))
    faults = [set() for _ in range(ROWS)]
    for b, kind in enumerate(kinds):
        if kind is None:
            continue
        if kind == "pad":  # a skipped row (CUDA-graph padding): not a fault
            idx[b] = -1
            continue
        slot = idx[b]
        col = max(state.state_idx[slot], -(-(state.num_computed[slot] + q[b]) // B) - 1)
        if kind == "block_big":
            bt[slot, col] = NB + int(rng.integers(0, 50))
        elif kind == "block_neg":
            bt[slot, col] = -int(rng.integers(2, 9))
        elif kind == "block_null":
            bt[slot, col] = 0
        elif kind == "block_missing":  # no block where a request with tokens reads its state
            if state.num_computed[slot] == 0:
                state.state_idx[slot], state.num_computed[slot] = 0, 1
            col = max(state.state_idx[slot],
                      -(-(state.num_computed[slot] + q[b]) // B) - 1)
            bt[slot, col] = -1
        elif kind == "column":  # a request longer than its table
            state.num_computed[slot] = COLS * B + int(rng.integers(0, B))
            state.state_idx[slot] = (state.num_computed[slot] - 1) // B
        elif kind == "slot_big":
            idx[b] = SLOTS + int(rng.integers(0, 100))
        elif kind == "slot_neg":
            idx[b] = -int(rng.integers(2, 100))
        elif kind == "dup":
            others = [o for o in range(b + 1, ROWS) if kinds[o] is None]
            if not others:
                continue
            o = int(rng.choice(others))
            idx[b] = idx[o]
            faults[o].add("dup")
        elif kind == "q_zero":
            q[b] = 0
        elif kind == "q_big":
            spec[b], q[b] = 1, 2 + S + int(rng.integers(0, 3))
        elif kind == "is_spec_2":  # (a query that is valid for a spec row: one fault only)
            spec[b], q[b] = 2, min(q[b], 1 + S)
            ns[b] = min(ns[b], q[b])
        elif kind == "faulty":
            state.acc[slot] = 0
        elif kind == "in_flight":
            state.acc[slot] = -1
        elif kind == "col_behind":  # a state_idx no step leaves: behind its tokens' column
            nc = state.num_computed[slot] = max(state.num_computed[slot], B + 1)
            state.state_idx[slot] = -(-nc // B) - 2 - int(rng.integers(0, 2))
        elif kind == "col_ahead":  # ... or past the column its drafts could reach
            nc = state.num_computed[slot]
            state.state_idx[slot] = -(-(nc + S) // B) + int(rng.integers(0, 2))
        elif kind == "ns_zero":
            spec[b], q[b], ns[b] = 1, min(q[b], 1 + S), 0
        elif kind == "ns_big":
            spec[b], q[b] = 1, min(q[b], 1 + S)
            ns[b] = q[b] + 1
        elif kind == "window_missing":  # a dropped write where postprocess re-bases the
            # state: a spec row of 2 or 3 tokens, all accepted, ending on a boundary of its
            # running column k - 1, the last candidate's column -1 (write-only at preprocess)
            n, k = int(rng.integers(2, 2 + S)), int(rng.integers(1, 3))
            spec[b], q[b], ns[b] = 1, n, n
            nc = k * B - n
            state.num_computed[slot], state.state_idx[slot], state.acc[slot] = \
                nc, (nc - 1) // B, 1
            bt[slot, k - 1 + n - 1] = -1
        faults[b].add(kind)
    return state, idx, q, spec, ns, bt, faults


def sentinel_pools():
    return {n: np.full(CFG.pool_shape(n, NB), SENTINEL, np.float32) for n in CFG.states}


def numbered(pools):
    """Distinct values in the good blocks, so that every copy shows."""
    out = {}
    for n, p in pools.items():
        p = p.copy()
        p[:, 1:] = np.arange(p[:, 1:].size, dtype=np.float32).reshape(p[:, 1:].shape)
        out[n] = p
    return out


def step(backend, state, idx, q, spec, ns, bt, pools, mode):
    """A whole step; returns the new state, the per-row results, pools and the error
    flag over the step (bits ORed, lowest row)."""
    s1, pre = backend.preprocess_resolve(state, idx, q, spec, bt, B, S, mode, num_blocks=NB)
    e1 = backend.last_errors
    if mode == "pre-copy":
        pools = backend.copy_pools(pools, CFG.copy_kinds(), {k: pre[k] for k in COPY_PLAN})
    s2, post = backend.postprocess(s1, idx, q, spec, ns, bt, B, S, num_blocks=NB)
    e2 = backend.last_errors
    pools = backend.copy_pools(pools, CFG.copy_kinds(), {k: post[k] for k in COPY_PLAN})
    return s2, pre, post, pools, (int(e1[0]) | int(e2[0]), min(int(e1[1]), int(e2[1])))


def core_step(state, pre_idx, post_idx, q, spec, ns, bt, pools, mode):
    """The core on the same step: preprocess of the rows ``pre_idx`` names, postprocess of
    those ``post_idx`` names (-1 elsewhere; both must be good rows)."""
    ref = Reference()
    s1, pre = ref.preprocess_resolve(state, pre_idx, q, spec, bt, B, S, mode)
    pools = {n: p.copy() for n, p in pools.items()}
    if mode == "pre-copy":
        apply_copy(pools, CFG, CopyPlan(*(pre[k] for k in COPY_PLAN)))
    s2, post = ref.postprocess(s1, post_idx, q, spec, ns, bt, B, S)
    apply_copy(pools, CFG, CopyPlan(*(post[k] for k in COPY_PLAN)))
    return s1, s2, pre, post, pools


def screened(backend, state, idx, q, spec, ns, bt, pre_idx, core_mid):
    """The reference's fault bits per row (core.screen) for preprocess and postprocess.
    Between them the device holds: the good rows' slots as the core's preprocess left them,
    acc negated; the slots of faulty rows faulty (acc 0); the others as they were."""
    dtype = "int32" if "32" in str(backend.index_dtype) else "int64"
    kw = dict(block_size=B, num_spec=S, num_blocks=NB, index_dtype=dtype)
    pre_bits = screen_preprocess(state.state_idx, state.acc, state.num_computed, idx, q, spec,
                                 bt, **kw)
    mid = state.copy()
    good = [int(r) for r in pre_idx if r >= 0]
    mid.state_idx[good] = core_mid.state_idx[good]
    mid.acc[good] = -core_mid.acc[good]
    bad = [int(r) for r, f in zip(idx, pre_bits) if f and 0 <= r < SLOTS]
    mid.acc[bad] = 0
    post_bits = screen_postprocess(mid.state_idx, mid.acc, mid.num_computed, idx, q, spec, ns,
                                   bt, **kw)
    return pre_bits, post_bits


#: a row is good about 6 times in 10: steps with one fault, several, or none
KIND = st.sampled_from([None] * 26 + ["pad"] + sorted(PRE_KINDS) + sorted(POST_KINDS))


@pytest.mark.parametrize("mode", ["pre-copy", "copy-free"])
def test_bad_values_never_reach_foreign_memory_or_the_cache(device_backend, mode):
    examples, seen = max(10, EXAMPLES // 2), []

    @settings(max_examples=examples, derandomize=True)
    @given(st.integers(0, 2**32 - 1), st.lists(KIND, min_size=ROWS, max_size=ROWS))
    def run(seed, kinds):
        seen.append(kinds)
        rng = np.random.default_rng(seed)
        good = good_step(rng)
        state, idx, q, spec, ns, bt, faults = inject(rng, kinds, *good)
        faulty_rows = {b for b in range(ROWS) if faults[b]}
        pre_faulty = {b for b in faulty_rows if faults[b] - set(POST_KINDS)}
        pools = numbered(sentinel_pools())
        s2, pre, post, out_pools, (bits, low) = step(device_backend, state, idx, q, spec, ns,
                                                      bt, pools, mode)

        # the core on the good rows alone (faulty rows padded, their slots untouched); a
        # row whose fault only postprocess sees is a good row of the preprocess
        pre_idx = np.where([b in pre_faulty for b in range(ROWS)], -1, idx)
        post_idx = np.where([b in faulty_rows for b in range(ROWS)], -1, idx)
        g_bt = good[5]
        # the core runs on the good state, with the states a post-only fault was given
        g_state = good[0].copy()
        for b in range(ROWS):
            if "window_missing" in faults[b]:
                r = idx[b]
                for f in ("state_idx", "acc", "num_computed"):
                    getattr(g_state, f)[r] = getattr(state, f)[r]
        w_mid, w_state, w_pre, w_post, w_pools = core_step(g_state, pre_idx, post_idx, q, spec,
                                                           ns, g_bt, pools, mode)
        for b in range(ROWS):
            if b in pre_faulty:
                assert pre["run_col"][b] == -1 and pre["temporal_read"][b] == -1, faults[b]
                assert (pre["temporal_write"][b] == -1).all() and pre["conv_write"][b] == -1
                assert pre["copy_dst"][b] == -1
            else:
                for k in pre:
                    want = w_pre[k][b]
                    if k == "temporal_write" and "window_missing" in faults[b]:
                        want = want.copy()
                        want[q[b] - 1] = -1  # the dropped write
                    assert np.array_equal(pre[k][b], want), (k, b)
            if b in faulty_rows:
                assert post["cache_col"][b] == -1, faults[b]
                assert all(post[k][b] == -1 for k in ("copy_tsrc", "copy_csrc", "copy_dst"))
            else:
                for k in post:
                    assert post[k][b] == w_post[k][b], (k, b)
        for n in out_pools:
            assert np.array_equal(out_pools[n], w_pools[n]), n  # untouched blocks included
            assert (out_pools[n][:, 0] == SENTINEL).all()  # the null block
        good_slots = {int(post_idx[b]) for b in range(ROWS) if post_idx[b] >= 0}
        bad_slots = {int(idx[b]) for b in faulty_rows if 0 <= idx[b] < SLOTS}
        for r in range(SLOTS):
            got = [s2.state_idx[r], s2.acc[r], s2.num_computed[r]]
            if r in bad_slots:
                assert s2.acc[r] == 0, (r, faults)  # faulty until re-admitted
                assert s2.num_computed[r] == state.num_computed[r]
                # preprocess moved a slot whose fault only postprocess saw
                assert s2.state_idx[r] in (state.state_idx[r], w_state.state_idx[r])
            elif r in good_slots:
                assert got == [w_state.state_idx[r], w_state.acc[r], w_state.num_computed[r]]
            else:
                assert got == [state.state_idx[r], state.acc[r], state.num_computed[r]]

        # the flag: every fault named (a fault in the slot's state or blocks only on a row
        # without another, post-process faults only on a slot preprocess left good),
        # nothing else, and the lowest faulty row
        allowed = Fault(0)
        required = Fault(0)
        for b in faulty_rows:
            for kind in faults[b]:
                bit = {**PRE_KINDS, **POST_KINDS}[kind]
                allowed |= bit
                if (kind in STATE_STAGE or kind in POST_KINDS) and len(faults[b]) > 1:
                    continue
                required |= bit
        assert required <= Fault(bits) <= allowed, (faults, Fault(bits))
        assert low == (min(faulty_rows) if faulty_rows else 2**31 - 1)
        # and exactly what the reference's screen says, row by row
        pre_bits, post_bits = screened(device_backend, state, idx, q, spec, ns, bt, pre_idx,
                                       w_mid)
        assert {b for b in range(ROWS) if pre_bits[b]} == pre_faulty, (faults, pre_bits)
        assert {b for b in range(ROWS) if pre_bits[b] | post_bits[b]} == faulty_rows
        assert Fault(bits) == Fault(int(np.bitwise_or.reduce(pre_bits | post_bits))), \
            (faults, pre_bits, post_bits)

        # the next step: the faulty slots are skipped (flagged), the good ones go on
        if bad_slots:
            nxt = np.array(sorted(bad_slots | good_slots))
            ones = np.ones(len(nxt), np.int64)
            _, pre3 = device_backend.preprocess_resolve(s2, nxt, ones, ones, g_bt, B, S, mode,
                                                         num_blocks=NB)
            assert Fault(int(device_backend.last_errors[0])) == Fault.FAULTY_SLOT
            for b, r in enumerate(nxt):
                assert (pre3["run_col"][b] == -1) == (r in bad_slots)

    run()
    faulty = sum(any(k is not None for k in kinds) for kinds in seen)
    print(f"fuzz {device_backend.name} {mode}: {len(seen)} examples, {faulty} with faults")
    assert len(seen) >= examples


def test_the_fuzz_draws_every_kind():
    # a guard on the generator itself: each kind is injected where asked
    rng = np.random.default_rng(0)
    for kind in list(PRE_KINDS) + list(POST_KINDS):
        good = good_step(rng)
        *_, faults = inject(rng, [kind] + [None] * (ROWS - 1), *good)
        assert kind in faults[0]


def test_in_flight_support_mark():
    s = slots([0, 1], [2, 0], [3, 5])
    assert in_flight(s, np.array([0, 1, -1])).acc.tolist() == [-2, 0]

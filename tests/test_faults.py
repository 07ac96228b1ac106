"""Bad input on the device path (docs/semantics.md §1, "Bad values"), both backends, op by
op: every fault is served as a skipped row (no bookkeeping, no block, no copy, no cache
column), the row's slot is left faulty (acc = 0) until re-admitted, the error flag names
the fault, and the good rows of the same step give exactly what they give alone. The
runners and the checked mode: test_fault_runners.py; the core's screen: test_screen.py."""

import numpy as np
import pytest
import torch
from fault_cases import (B, BT, NB, POST_CASES, PRE_CASES, S, assert_good_row_as_alone,
                         assert_skipped, bits, state_with, table_with)
from support import Torch, in_flight, make_backend, slots

from mamba_align.core import (Fault, decode_errors, error_row, new_errors, raise_errors,
                              screen_postprocess, screen_preprocess)
from mamba_align.core.faults import MESSAGES, NO_ROW
from mamba_align.kernels.bookkeeping import row_launch


# -- preprocess ---------------------------------------------------------------------------------
@pytest.mark.parametrize("slot0,q,spec,bt,nb,fault,why", PRE_CASES, ids=[c[-1] for c in PRE_CASES])
def test_preprocess_skips_a_faulty_row_and_flags_it(device_backend, slot0, q, spec, bt, nb,
                                                    fault, why):
    s = state_with(slot0)
    new, out = device_backend.preprocess_resolve(s, [0, 1], [q, 1], [spec, 1], bt, B, S,
                                                 num_blocks=nb)
    assert bits(device_backend) == fault and device_backend.last_errors[1] == 0, why
    assert_skipped(out, 0, why)
    assert (new.state_idx[0], new.acc[0], new.num_computed[0]) == (slot0[0], 0, slot0[2]), why
    assert_good_row_as_alone(device_backend, s, new, out, bt, nb)


def test_pools_smaller_than_the_block_table(device_backend):
    # pools of 12 blocks: slot 0 crosses into column 1 and writes columns 1-2 (blocks 11,
    # 12): block 12 is past the pools; slot 1 (blocks 2..5) is fine
    s = state_with((0, 1, 3))
    bt = BT.copy()
    bt[1] = [2, 3, 4, 5]
    new, out = device_backend.preprocess_resolve(s, [0, 1], [2, 1], [1, 1], bt, B, S,
                                                 num_blocks=12)
    assert bits(device_backend) == Fault.BAD_BLOCK
    assert_skipped(out, 0, "blocks past the smallest pool")
    assert_good_row_as_alone(device_backend, s, new, out, bt, 12)


def test_minus_one_where_a_row_only_writes_drops_the_write(device_backend):
    # -1 = no block (docs/semantics.md §1): a candidate written there is dropped, unflagged
    s = state_with((0, 1, 3))
    new, out = device_backend.preprocess_resolve(s, [0], [2], [1], table_with(0, 2, -1), B, S,
                                                 num_blocks=NB)
    assert bits(device_backend) == 0
    assert out["temporal_write"][0].tolist() == [11, -1, -1, -1]  # window columns 1, 2
    assert new.state_idx[0] == 1


def test_duplicate_rows_are_both_skipped(device_backend):
    s = state_with((0, 1, 3))
    new, out = device_backend.preprocess_resolve(s, [0, 1, 0], [1, 1, 1], [1, 1, 1], BT, B, S,
                                                 num_blocks=NB)
    assert bits(device_backend) == Fault.DUPLICATE_SLOT and device_backend.last_errors[1] == 0
    assert_skipped(out, 0, "duplicate")
    assert_skipped(out, 2, "duplicate")
    assert new.acc[0] == 0 and new.state_idx[0] == 0
    assert_good_row_as_alone(device_backend, s, new, out)


@pytest.mark.parametrize("slot0,bt,q2,why", [
    ((0, 1, 3), BT, 1, "a healthy slot"),
    ((0, 0, 3), BT, 1, "a faulty slot"),
    ((0, -2, 3), BT, 1, "a step in flight"),
    ((-3, 1, 3), BT, 1, "inconsistent bookkeeping"),
    ((0, 1, 3), table_with(0, 1, 99), 1, "a bad block in the row's window"),
    ((0, 1, 3), BT, 0, "a row of no tokens"),
])
def test_a_duplicated_slot_is_charged_with_the_duplicate_and_the_rows_own_faults(
        device_backend, slot0, bt, q2, why):
    # the kernels read a duplicated slot's state and blocks before they know it is
    # duplicated: what they find there must not reach the flag (core.screen's rule)
    s = state_with(slot0)
    idx, q, spec = [0, 1, 0], [1, 1, q2], [1, 1, 1]
    new, out = device_backend.preprocess_resolve(s, idx, q, spec, bt, B, S, num_blocks=NB)
    want = Fault.DUPLICATE_SLOT | (Fault.BAD_QUERY_LEN if q2 == 0 else Fault(0))
    assert bits(device_backend) == want and device_backend.last_errors[1] == 0, why
    screen = screen_preprocess(s.state_idx, s.acc, s.num_computed, idx, q, spec, bt,
                               block_size=B, num_spec=S, num_blocks=NB)
    assert screen.tolist() == [int(Fault.DUPLICATE_SLOT), 0, int(want)], why
    assert_skipped(out, 0, why)
    assert_skipped(out, 2, why)
    assert (new.state_idx[0], new.acc[0], new.num_computed[0]) == (slot0[0], 0, slot0[2]), why
    assert_good_row_as_alone(device_backend, s, new, out, bt, NB)


@pytest.mark.parametrize("slot0,ns2,why", [
    ((0, -1, 3), 1, "a slot in flight"),
    ((0, 0, 3), 1, "a faulty slot"),
    ((0, 2, 3), 1, "a slot not in flight"),
    ((-3, -1, 3), 1, "inconsistent bookkeeping"),
    ((0, -1, 3), 0, "a spec row that sampled nothing"),
])
def test_postprocess_charges_a_duplicated_slot_with_the_duplicate_and_the_rows_own_faults(
        device_backend, slot0, ns2, why):
    s = state_with(slot0, good=(0, -1, 3))
    idx, q, spec, ns = [0, 1, 0], [1, 1, 1], [1, 1, 1], [1, 1, ns2]
    new, out = device_backend.postprocess(s, idx, q, spec, ns, BT, B, S, num_blocks=NB)
    want = Fault.DUPLICATE_SLOT | (Fault.BAD_NUM_SAMPLED if ns2 == 0 else Fault(0))
    assert bits(device_backend) == want and device_backend.last_errors[1] == 0, why
    screen = screen_postprocess(s.state_idx, s.acc, s.num_computed, idx, q, spec, ns, BT,
                                block_size=B, num_spec=S, num_blocks=NB)
    assert screen.tolist() == [int(Fault.DUPLICATE_SLOT), 0, int(want)], why
    for b in (0, 2):
        assert out["cache_col"][b] == -1 and out["copy_dst"][b] == -1, why
    assert (new.state_idx[0], new.acc[0], new.num_computed[0]) == (slot0[0], 0, slot0[2]), why
    # the good row: 3 + 1 = 4 tokens, column 0's boundary, as alone
    assert (out["cache_col"][1], new.num_computed[1], new.acc[1]) == (0, 4, 1), why


@pytest.mark.parametrize("n,partner", [(80, 70), (300, 290), (1100, 1090)])
def test_duplicates_are_found_across_programs(device_backend, n, partner):
    # rows of several programs, compared in several tiles; past the unrolled width (the
    # last case) row 3 finds its partner in the loop, and the partner finds row 3 unrolled
    assert (row_launch(n)["constexprs"]["WIDTH"] < n) == (n > 1000)
    s = slots(np.zeros(n, np.int64), np.ones(n, np.int64), np.full(n, 3))
    bt = np.arange(1, 1 + n * 4).reshape(n, 4)
    idx = np.arange(n)
    idx[partner] = 3
    _, out = device_backend.preprocess_resolve(s, idx, np.ones(n), np.ones(n), bt, B, S)
    assert bits(device_backend) == Fault.DUPLICATE_SLOT and device_backend.last_errors[1] == 3
    assert out["run_col"][3] == out["run_col"][partner] == -1
    assert (np.delete(out["run_col"], [3, partner]) == 0).all()


def test_past_the_unrolled_width_pairs_are_found_and_int64_ids_do_not_alias():
    # rows 1050 and 1150 share a slot and both lie in the loop of the duplicate check; row
    # 1100's int64 id is slot 1070 plus 2^32 (the check compares in 32 bits after making
    # every id that names no slot -1): a bad slot, not a duplicate of row 1070
    backend, n = Torch(), 1200
    assert row_launch(n)["constexprs"]["WIDTH"] < 1050
    s = slots(np.zeros(n, np.int64), np.ones(n, np.int64), np.full(n, 3))
    idx = np.arange(n)
    idx[1150] = 1050
    idx[1100] = 2**32 + 1070
    _, out = backend.preprocess_resolve(s, idx, np.ones(n), np.ones(n),
                                        np.arange(1, 1 + n * 4).reshape(n, 4), B, S)
    assert bits(backend) == Fault.DUPLICATE_SLOT | Fault.BAD_SLOT
    assert backend.last_errors[1] == 1050
    assert (out["run_col"][[1050, 1100, 1150]] == -1).all()
    assert (np.delete(out["run_col"], [1050, 1100, 1150]) == 0).all()


@pytest.mark.parametrize("bad_slot", [7, -3])
def test_a_slot_outside_the_arrays_is_skipped_and_flagged(device_backend, bad_slot):
    s = state_with((0, 1, 3))
    new, out = device_backend.preprocess_resolve(s, [bad_slot, 1], [1, 1], [1, 1], BT, B, S,
                                                 num_blocks=NB)
    assert bits(device_backend) == Fault.BAD_SLOT
    assert_skipped(out, 0, "bad slot")
    assert new.acc.tolist()[0] == 1  # no slot to mark faulty
    assert_good_row_as_alone(device_backend, s, new, out)


def test_num_computed_near_the_int32_limit_is_flagged():
    # int32 per-slot arrays: 2^31 - 3 computed tokens plus 4 scheduled would wrap
    for name in ("torch", "jax"):
        backend = make_backend(name, index_dtype="int32")
        s = state_with(((2**31 - 4) // B, 1, 2**31 - 3))
        new, out = backend.preprocess_resolve(s, [0, 1], [4, 1], [1, 1], BT, B, S, num_blocks=NB)
        assert Fault.OVERFLOW in bits(backend), name
        assert_skipped(out, 0, "overflow")
        assert_good_row_as_alone(backend, s, new, out)


# -- postprocess --------------------------------------------------------------------------------
@pytest.mark.parametrize("slot0,q,spec,ns,bt,fault,why", POST_CASES,
                         ids=[c[-1] for c in POST_CASES])
def test_postprocess_skips_a_faulty_row_and_caches_nothing(device_backend, slot0, q, spec, ns,
                                                           bt, fault, why):
    s = state_with(slot0, good=(0, 1, 3))
    new, out = device_backend.postprocess(s, [0, 1], [q, 1], [spec, 1], [ns, 1], bt, B, S,
                                          num_blocks=NB)
    assert bits(device_backend) == fault and device_backend.last_errors[1] == 0, why
    assert out["cache_col"][0] == -1, why
    assert all(out[n][0] == -1 for n in ("copy_tsrc", "copy_csrc", "copy_dst")), why
    assert (new.state_idx[0], new.acc[0], new.num_computed[0]) == (slot0[0], 0, slot0[2]), why
    # the good row of the same step gives its result alone (3 + 1 = 4: column 0's boundary)
    alone, alone_out = device_backend.postprocess(s, [1], [1], [True], [1], bt, B, S,
                                                  num_blocks=NB)
    assert (out["cache_col"][1], new.num_computed[1], new.acc[1]) == (0, 4, 1)
    assert alone_out["cache_col"].tolist() == [0] and alone.num_computed[1] == 4


def test_a_cached_block_of_minus_one_gives_no_cache_column(device_backend):
    # the boundary at 8 tokens in the kept column 1 (the running one is 2); a -1 running
    # column is a fault (POST_CASES)
    s = state_with((2, 2, 7))
    _, out = device_backend.postprocess(s, [0], [2], [1], [2], table_with(0, 1, -1), B, S,
                                        num_blocks=NB)
    assert bits(device_backend) == 0 and out["cache_col"].tolist() == [-1]


def test_a_kept_column_snapshot_from_minus_one_gives_no_cache_column(device_backend):
    # 6 tokens, running column 2, three accepted (9): the boundary at 8 is the kept column
    # 1's snapshot, copied from window column 1 (block column 3), a dropped write. No
    # snapshot, but the row's state (temporal: column 4, acc 3; conv: column 2) is whole,
    # so no fault
    bt = np.arange(10, 30).reshape(4, 5)
    bt[0, 3] = -1
    s = state_with((2, 1, 6))
    new, out = device_backend.postprocess(s, [0], [3], [1], [3], bt, B, S, num_blocks=30)
    assert bits(device_backend) == 0 and out["cache_col"].tolist() == [-1]
    assert (new.state_idx[0], new.acc[0], new.num_computed[0]) == (2, 3, 9)
    assert out["copy_tsrc"].tolist() == [-1] and out["copy_csrc"].tolist() == [12]


def test_postprocess_skips_a_faulty_slot_silently(device_backend):
    # it was flagged when it became faulty; the step's postprocess changes nothing more
    s = state_with((1, 0, 6))
    new, out = device_backend.postprocess(s, [0], [2], [1], [2], BT, B, S, num_blocks=NB)
    assert bits(device_backend) == 0 and out["cache_col"].tolist() == [-1]
    assert (new.acc[0], new.num_computed[0]) == (0, 6)


# -- add_requests -------------------------------------------------------------------------------
@pytest.mark.parametrize("slots_,nc,fault,faulty", [
    ([7, 1], [5, 4], Fault.BAD_SLOT, []),
    ([-3, 1], [5, 4], Fault.BAD_SLOT, []),
    ([2, 1], [-4, 4], Fault.BAD_NUM_COMPUTED, [2]),
    ([2, 1, 2], [5, 4, 9], Fault.DUPLICATE_SLOT, [2]),
])
def test_add_requests_skips_bad_rows(device_backend, slots_, nc, fault, faulty):
    s = state_with((0, 1, 3))
    new = device_backend.add_requests(s, slots_, nc, B)
    assert bits(device_backend) == fault and device_backend.last_errors[1] == 0
    assert new.num_computed[1] == 4 and new.state_idx[1] == 0  # the good admission
    for r in range(4):
        if r in faulty:
            assert new.acc[r] == 0  # left faulty, not stale
        elif r != 1:
            assert [getattr(new, f)[r] for f in ("state_idx", "acc", "num_computed")] == \
                [getattr(s, f)[r] for f in ("state_idx", "acc", "num_computed")]


def test_add_requests_skips_minus_one_silently(device_backend):
    new = device_backend.add_requests(state_with((0, 1, 3)), [-1, 2], [5, 4], B)
    assert bits(device_backend) == 0 and new.num_computed.tolist() == [3, 3, 4, 0]


def test_int64_num_computed_past_int32_state_is_flagged():
    backend = Torch(index_dtype="int32")
    s = state_with((0, 1, 3))
    st = backend._state(s)
    backend.ops.add_requests_(*st, backend.ids([2]), torch.tensor([2**31], device=backend.device),
                              block_size=B)
    new = backend._back(st)
    assert bits(backend) == Fault.BAD_NUM_COMPUTED and new.acc[2] == 0


def test_re_admission_clears_a_faulty_slot(device_backend):
    s = state_with((0, 0, 3))  # slot 0 faulty
    new = device_backend.add_requests(s, [0], [4], B)
    assert bits(device_backend) == 0 and (new.state_idx[0], new.acc[0]) == (0, 1)
    _, out = device_backend.preprocess_resolve(new, [0], [1], [1], BT, B, S, num_blocks=NB)
    assert bits(device_backend) == 0 and out["run_col"].tolist() == [1]


# -- the error flag ---------------------------------------------------------------------------
def test_decoding_the_error_flag():
    assert decode_errors(new_errors()) == [] and error_row(new_errors()) is None
    raise_errors(new_errors())  # clear: nothing raised
    e = np.array([int(Fault.BAD_BLOCK | Fault.DUPLICATE_SLOT), 3], np.int32)
    assert decode_errors(e) == [MESSAGES[Fault.DUPLICATE_SLOT], MESSAGES[Fault.BAD_BLOCK]]
    assert error_row(e) == 3
    with pytest.raises(ValueError, match=r"lowest offending row: 3\): two rows of one step"):
        raise_errors(e)
    assert "unknown fault bits" in decode_errors(np.array([1 << 20, NO_ROW]))[0]
    with pytest.raises(ValueError, match="shape"):
        decode_errors(np.zeros(3))


def test_the_flag_is_sticky_and_keeps_the_lowest_row(device_backend):
    """Faults OR together across launches; the row is the lowest seen."""
    import jax.numpy as jnp

    s = state_with((0, 1, 3))
    if device_backend.name == "torch":
        st = device_backend._state(s)
        ops = device_backend.ops
        ops.add_requests_(*st, device_backend.ids([1, 9]), device_backend.ids([4, 4]), block_size=B)
        ops.add_requests_(*st, device_backend.ids([3, 3, 1]), device_backend.ids([0, 0, 0]),
                          block_size=B)
        e = device_backend.host(st[3])
    else:
        st = device_backend._state(s)
        out = device_backend.ops.add_requests(*st, jnp.array([1, 9]), jnp.array([4, 4]),
                                              block_size=B)
        out = device_backend.ops.add_requests(out["state_idx"], out["acc"], out["num_computed"],
                                              out["errors"], jnp.array([3, 3, 1]),
                                              jnp.array([0, 0, 0]), block_size=B)
        e = np.asarray(out["errors"])
    assert Fault(int(e[0])) == Fault.BAD_SLOT | Fault.DUPLICATE_SLOT and e[1] == 0


# -- found in review: aliasing ids, wrapping counts, missing read blocks ----------------------
def test_a_bad_int64_slot_does_not_alias_a_good_one():
    backend = Torch()  # int64 ids: 2^32 + 1 must not compare equal to slot 1
    s = state_with((0, 1, 3))
    new, out = backend.preprocess_resolve(s, [2**32 + 1, 1], [1, 1], [1, 1], BT, B, S,
                                          num_blocks=NB)
    assert bits(backend) == Fault.BAD_SLOT and out["run_col"][1] == 0 and new.acc[1] == 1


def test_a_count_that_would_wrap_int64_is_an_overflow():
    backend = Torch(index_dtype="int32")
    s = state_with((249, 1, 999))  # column 249 holds token 999
    st = backend._state(s)
    huge = torch.tensor([2**63 - 1], device=backend.device)
    backend.ops.preprocess_resolve_(*st, backend.ids([0]), huge, backend.ids([0]),
                                    backend.ids(BT), block_size=B, num_spec=S, num_blocks=NB,
                                    mode="pre-copy")
    backend._back(st)
    assert Fault(int(backend.last_errors[0])) == Fault.OVERFLOW
    st = backend._state(in_flight(s, [0]))
    backend.ops.postprocess_(*st, backend.ids([0]), huge, backend.ids([0]), backend.ids([1]),
                             backend.ids(BT), block_size=B, num_spec=S, num_blocks=NB)
    new = backend._back(st)
    assert Fault(int(backend.last_errors[0])) == Fault.OVERFLOW and new.num_computed[0] == 999


def test_a_count_that_fits_but_whose_column_sum_would_wrap_is_its_column():
    # 3 + (2**63 - 5) fits int64 (no overflow), but 3 + (2**63 - 5) + B - 1 does not: the
    # column, about 2**61, is past the table, as the core's screen says
    from mamba_align.core import screen_preprocess
    backend = Torch()  # int64 per-slot arrays
    s = state_with((0, 1, 3))
    q = [2**63 - 5, 1]
    want = screen_preprocess(s.state_idx, s.acc, s.num_computed, [0, 1], q, [0, 1], BT,
                             block_size=B, num_spec=S, num_blocks=NB, index_dtype="int64")
    new, out = backend.preprocess_resolve(s, [0, 1], q, [0, 1], BT, B, S, num_blocks=NB)
    assert Fault(int(want[0])) == Fault.BAD_COLUMN and bits(backend) == Fault.BAD_COLUMN
    assert_skipped(out, 0, "a column past the table")
    assert new.acc[0] == 0  # left faulty


@pytest.mark.parametrize("col,nc,fault", [(0, 2**63 - 3, 0), (0, 2**63 - 2, 0),
                                          (2, 2**63 - 2, Fault.INCONSISTENT)])
def test_the_state_idx_range_needs_no_sum_that_could_wrap(col, nc, fault):
    # B near 2**63: the range's upper end, cdiv(nc + S, B) - 1, is 0 or 1 here, and
    # nc + S would wrap int64 (columns 0 .. 7 in the table)
    from mamba_align.core import screen_preprocess
    backend = Torch()  # int64 per-slot arrays
    big, bt = 2**63 - 1, np.arange(5, 13)[None]
    s = slots([col], [1], [nc])
    want = screen_preprocess(s.state_idx, s.acc, s.num_computed, [0], [1], [1], bt,
                             block_size=big, num_spec=7, num_blocks=20, index_dtype="int64")
    backend.preprocess_resolve(s, [0], [1], [1], bt, big, 7, num_blocks=20)
    assert int(want[0]) == int(fault) and bits(backend) == fault


@pytest.mark.parametrize("mode", ["pre-copy", "copy-free"])
@pytest.mark.parametrize("col,why", [(0, "the old column: the temporal source of the crossing"),
                                     (1, "the new running block")])
def test_a_missing_block_a_row_reads_is_a_fault_in_both_modes(device_backend, mode, col, why):
    # slot 0 at column 0 crosses into column 1; a -1 where it reads its state would make
    # it compute from a zero or stale state and cache that later
    s = state_with((0, 1, 3))
    new, out = device_backend.preprocess_resolve(s, [0, 1], [2, 1], [0, 1],
                                                 table_with(0, col, -1), B, S, mode,
                                                 num_blocks=NB)
    assert bits(device_backend) == Fault.BAD_BLOCK, why
    assert_skipped(out, 0, why)
    assert new.acc[0] == 0


def test_postprocess_on_a_faulty_slot_stays_silent_with_huge_counts(device_backend):
    s = state_with((1, 0, 6))
    _, out = device_backend.postprocess(s, [0], [2**30], [0], [1], BT, B, S, num_blocks=NB)
    assert bits(device_backend) == 0 and out["cache_col"].tolist() == [-1]

"""What the bad-input tests share (test_faults.py, test_fault_runners.py, test_screen.py):
a small block table, states with one slot under test beside a good one, and the fault
cases of preprocess and postprocess with the bit each must raise."""

import numpy as np
from support import slots

from mamba_align.core import Fault

B, S = 4, 3
BT = np.arange(10, 26).reshape(4, 4)  # slot r owns blocks 10 + 4r .. 13 + 4r
NB = 26
PER_ROW_EMPTY = {"src_col": -1, "src_bias": 0, "run_col": -1, "copy_tsrc": -1, "copy_csrc": -1,
                 "copy_dst": -1, "copy_bias": 0, "temporal_read": -1, "conv_read": -1,
                 "conv_read_bias": 0, "conv_write": -1}
GOOD = (0, 1, 3)  # slot 1: column 0, acc 1, 3 tokens; one more token crosses into column 1


def bits(backend):
    return Fault(int(backend.last_errors[0]))


def state_with(slot0, good=GOOD):
    """Slot 0 as given (state_idx, acc, num_computed), slot 1 a good request, 2-3 unused."""
    cols = list(zip(slot0, good, (-1, 1, 0), (-1, 1, 0)))
    return slots(*cols)


def assert_skipped(out, b, what):
    for n, v in PER_ROW_EMPTY.items():
        assert out[n][b] == v, (what, n)
    assert (out["temporal_write"][b] == -1).all(), what


def assert_good_row_as_alone(backend, state, new, out, bt=BT, num_blocks=NB):
    alone_state, alone = backend.preprocess_resolve(state, [1], [1], [True], bt, B, S,
                                                    num_blocks=num_blocks)
    assert all(np.array_equal(out[n][1], alone[n][0]) for n in out)
    assert [getattr(new, f)[1] for f in ("state_idx", "acc", "num_computed")] == \
        [getattr(alone_state, f)[1] for f in ("state_idx", "acc", "num_computed")]


def table_with(r, c, block):
    bt = BT.copy()
    bt[r, c] = block
    return bt


PRE_CASES = [
    # (slot 0 state, its query_len, is_spec, block table, num_blocks, expected fault, why)
    ((0, 1, 3), 2, 1, table_with(0, 1, 99), NB, Fault.BAD_BLOCK, "block 99 in a pool of 26"),
    ((0, 1, 3), 2, 1, table_with(0, 1, -3), NB, Fault.BAD_BLOCK, "a negative id other than -1"),
    ((0, 1, 3), 2, 1, table_with(0, 1, 0), NB, Fault.BAD_BLOCK, "the null block"),
    ((0, 2, 3), 1, 1, table_with(0, 1, 99), NB, Fault.BAD_BLOCK, "read slot 99 (acc 2)"),
    ((1, 2, 7), 2, 1, table_with(0, 1, 99), NB, Fault.BAD_BLOCK, "pre-copy source 99"),
    ((3, 1, 15), 2, 1, BT, NB, Fault.BAD_COLUMN, "a window past the block table"),
    ((0, 1, 3), 5, 1, BT, NB, Fault.BAD_QUERY_LEN, "a spec row with query_len 5 > 1 + S"),
    ((0, 1, 3), 0, 0, BT, NB, Fault.BAD_QUERY_LEN, "a row without tokens"),
    ((0, 1, 3), 2, 2, BT, NB, Fault.BAD_IS_SPEC, "is_spec 2 (num_sampled passed instead?)"),
    ((0, 0, 3), 1, 1, BT, NB, Fault.FAULTY_SLOT, "a faulty slot"),
    ((0, -1, 3), 1, 1, BT, NB, Fault.STEP_ORDER, "a step in flight: never postprocessed"),
    ((0, 9, 3), 1, 1, BT, NB, Fault.INCONSISTENT, "acc past the window"),
    # state_idx must lie in [cdiv(nc, B) - 1, cdiv(nc + S, B) - 1]: [1, 2] at 8 tokens
    ((0, 1, 8), 1, 1, BT, NB, Fault.INCONSISTENT, "state_idx behind the computed tokens"),
    ((3, 1, 8), 1, 1, BT, NB, Fault.INCONSISTENT, "state_idx past the drafts' reach"),
    ((-1, 1, 5), 1, 1, BT, NB, Fault.INCONSISTENT, "no running column, 5 tokens computed"),
    ((1, 1, 0), 1, 1, BT, NB, Fault.INCONSISTENT, "column 1 with nothing computed"),
    # outside the range too, but for the reason its own fault names
    ((3, -1, 3), 1, 1, BT, NB, Fault.STEP_ORDER, "a step in flight whose column moved"),
    ((3, 0, 3), 1, 1, BT, NB, Fault.FAULTY_SLOT, "a slot left faulty after its column moved"),
]


POST_CASES = [
    # (slot 0 state, query_len, is_spec, num_sampled, table, expected fault, why)
    # column 1 recorded at 8 tokens, the state moved to column 2: num_sampled = 0 would
    # re-copy window column 0 over the recorded column 1
    ((2, 2, 8), 2, 1, 0, BT, Fault.BAD_NUM_SAMPLED, "num_sampled = 0 on a boundary"),
    ((1, 1, 6), 5, 1, 2, BT, Fault.BAD_QUERY_LEN, "query_len 5 > 1 + S: never-written candidates"),
    ((1, 1, 6), 2, 1, 3, BT, Fault.BAD_NUM_SAMPLED, "num_sampled > query_len"),
    ((1, 1, 8), 0, 0, 0, BT, Fault.BAD_QUERY_LEN, "a non-spec row without tokens, on a boundary"),
    ((1, 1, 6), 2, 3, 2, BT, Fault.BAD_IS_SPEC, "is_spec 3"),
    ((3, 1, 2), 2, 1, 2, BT, Fault.INCONSISTENT, "boundary column 0 far behind column 3"),
    ((1, 1, 6), 2, 1, 2, table_with(0, 1, 99), Fault.BAD_BLOCK, "cached block 99"),
    ((1, 2, 6), 2, 1, 2, table_with(0, 2, 99), Fault.BAD_BLOCK, "copy source 99"),
    # a boundary in the running column 1 (8 tokens): acc becomes 1, the row's state the
    # copy's; a write dropped into column 2 (the last accepted candidate) or column 1 (the
    # conv window) would leave it another state, and the next boundary would cache that
    ((1, 2, 6), 2, 1, 2, table_with(0, 2, -1), Fault.BAD_BLOCK,
     "running column's temporal source -1"),
    ((1, 2, 6), 2, 1, 2, table_with(0, 1, -1), Fault.BAD_BLOCK, "running column's block -1"),
    ((-1, 1, 0), 8, 0, 1, BT, Fault.INCONSISTENT, "postprocess with no running column"),
]

"""Resolution of the recurrent kernels' read and write blocks (docs/semantics.md §4 table),
checked three ways (core, torch, JAX) through the step's preprocess: both modes, spec and
non-spec rows, fresh rows, prefix hits."""

import numpy as np
import pytest

from mamba_align.core import (
    SlotState,
    add_requests,
    init_slots,
    preprocess,
    resolve_blocks,
    window_blocks,
)

B, S = 4, 2
# slot 0's block table: columns 0..5
BT = np.array([[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25]])


def state(st_idx, acc, nc):
    return SlotState(np.array(st_idx), np.array(acc), np.array(nc))


def test_window_blocks_and_skipped_rows():
    w = window_blocks(BT, [1, -1, 0], [2, 3, 0], S)
    assert w.tolist() == [[22, 23, 24], [-1, -1, -1], [10, 11, 12]]


def test_window_beyond_block_table_is_an_error():
    with pytest.raises(ValueError, match="outside the block table"):
        window_blocks(BT, [0], [4], S)


class Blocks:
    def __init__(self, out):
        self.__dict__.update(out)
        self.crossing = (out["src_col"] >= 0) & (out["src_col"] != out["run_col"])


def resolve(backend, st_idx, acc, nc, q, spec, mode):
    s0 = state([st_idx, 0], [acc, 1], [nc, 0])
    s1, out = backend.preprocess_resolve(s0, [0, -1], [q, 0], [spec, False], BT, B, S, mode)
    k = Blocks(out)
    return s1, k, k


@pytest.mark.parametrize("mode", ["pre-copy", "copy-free"])
def test_fresh_row_reads_zero_state(backend, mode):
    _, plan, k = resolve(backend, -1, 1, 0, 3, True, mode)
    assert plan.run_col[0] == 0
    assert (k.temporal_read[0], k.conv_read[0], k.conv_read_bias[0]) == (-1, -1, 0)
    assert k.temporal_write[0].tolist() == [10, 11, 12] and k.conv_write[0] == 10
    # the skipped row resolves to nothing
    assert (k.temporal_read[1], k.conv_read[1], k.conv_write[1]) == (-1, -1, -1)
    assert k.temporal_write[1].tolist() == [-1, -1, -1]


@pytest.mark.parametrize("mode", ["pre-copy", "copy-free"])
def test_same_column_reads_accepted_candidate(backend, mode):
    # Column 1, acc 3 from the last step, 5 computed + 2 scheduled stays in column 1.
    _, plan, k = resolve(backend, 1, 3, 5, 2, True, mode)
    assert not plan.crossing[0]
    assert (k.temporal_read[0], k.conv_read[0], k.conv_read_bias[0]) == (13, 11, 2)
    assert k.temporal_write[0].tolist() == [11, 12, -1]  # T = 2 candidates
    assert k.conv_write[0] == 11


def test_crossing_row_pre_copy_reads_new_window_column_zero(backend):
    s1, plan, k = resolve(backend, 1, 2, 6, 3, True, "pre-copy")
    assert plan.crossing[0] and plan.run_col[0] == 2 and s1.acc[0] == 1
    assert (k.temporal_read[0], k.conv_read[0], k.conv_read_bias[0]) == (12, 12, 0)
    assert k.temporal_write[0].tolist() == [12, 13, 14]


def test_crossing_row_copy_free_reads_old_column(backend):
    _, plan, k = resolve(backend, 1, 2, 6, 3, True, "copy-free")
    # temporal bt[src_col + src_bias] = bt[2], which is also write block 0 (read before write)
    assert (k.temporal_read[0], k.conv_read[0], k.conv_read_bias[0]) == (12, 11, 1)
    assert k.temporal_write[0].tolist() == [12, 13, 14]


@pytest.mark.parametrize("mode", ["pre-copy", "copy-free"])
def test_non_spec_prefill_writes_final_state_to_window_column_zero(backend, mode):
    # 4 computed (a boundary), chunk of 8: column 0 -> 2, bias 0.
    _, plan, k = resolve(backend, 0, 1, 4, 8, False, mode)
    assert plan.run_col[0] == 2 and plan.crossing[0]
    want_read = 12 if mode == "pre-copy" else 10
    assert (k.temporal_read[0], k.conv_read[0]) == (want_read, want_read)
    assert k.temporal_write[0].tolist() == [12, -1, -1] and k.conv_write[0] == 12


def test_prefix_hit_first_step_reads_the_hit_block(backend):
    # A hit of 2 blocks (8 tokens) seeds state_idx = 1; the first chunk crosses with bias 0.
    s = backend.add_requests(init_slots(2), [0], [8], B)
    _, cf = backend.preprocess_resolve(s, [0], [3], [False], BT, B, S, "copy-free")
    assert (cf["src_col"][0], cf["src_bias"][0], cf["run_col"][0]) == (1, 0, 2)
    assert (cf["temporal_read"][0], cf["conv_read"][0], cf["conv_read_bias"][0]) == (11, 11, 0)
    _, pc = backend.preprocess_resolve(s, [0], [3], [False], BT, B, S, "pre-copy")
    assert (pc["temporal_read"][0], pc["conv_read"][0]) == (12, 12)
    # pre-copy copies (never moves) the hit block into the new running block
    assert [pc[n][0] for n in ("copy_tsrc", "copy_csrc", "copy_dst", "copy_bias")] == [11, 11, 12, 0]


def test_spec_rows_longer_than_window_are_rejected():
    s0 = state([0], [1], [1])
    s1, plan = preprocess(s0, [0], [4], B)
    with pytest.raises(ValueError, match="query_len <= 1 \\+ num_spec"):
        resolve_blocks(BT, [0], s1, plan, [4], True, S)


def test_resolve_needs_the_preprocess_output():
    s0 = state([0], [1], [2])
    _, plan = preprocess(s0, [0], [3], B)  # 5 tokens: column 0 -> 1
    with pytest.raises(ValueError, match="pass the preprocess output"):
        resolve_blocks(BT, [0], s0, plan, [3], True, S)  # stale state

"""The core's non-raising screen of the fault rules (mamba_align.core.screen) names the
same faults as the kernels, case by case (the fuzz suite compares the two on random steps
too)."""

import numpy as np
import pytest
from fault_cases import B, BT, NB, POST_CASES, PRE_CASES, S, state_with
from support import in_flight

from mamba_align.core import Fault


@pytest.mark.parametrize("slot0,q,spec,bt,nb,fault,why", PRE_CASES, ids=[c[-1] for c in PRE_CASES])
def test_the_screen_agrees_on_preprocess(slot0, q, spec, bt, nb, fault, why):
    from mamba_align.core import screen_preprocess

    s = state_with(slot0)
    bits_ = screen_preprocess(s.state_idx, s.acc, s.num_computed, [0, 1], [q, 1], [spec, 1], bt,
                              block_size=B, num_spec=S, num_blocks=nb)
    assert bits_.tolist() == [int(fault), 0], why


@pytest.mark.parametrize("slot0,q,spec,ns,bt,fault,why", POST_CASES,
                         ids=[c[-1] for c in POST_CASES])
def test_the_screen_agrees_on_postprocess(slot0, q, spec, ns, bt, fault, why):
    from mamba_align.core import screen_postprocess

    s = in_flight(state_with(slot0, good=(0, 1, 3)), [0, 1])
    bits_ = screen_postprocess(s.state_idx, s.acc, s.num_computed, [0, 1], [q, 1], [spec, 1],
                               [ns, 1], bt, block_size=B, num_spec=S, num_blocks=NB)
    assert bits_.tolist() == [int(fault), 0], why


def test_the_screen_on_admissions_duplicates_and_overflow():
    from mamba_align.core import screen_add_requests, screen_preprocess

    assert screen_add_requests(4, [7, 1, 2, 2, -1], [5, -4, 0, 0, 3]).tolist() == [
        int(Fault.BAD_SLOT), int(Fault.BAD_NUM_COMPUTED), int(Fault.DUPLICATE_SLOT),
        int(Fault.DUPLICATE_SLOT), 0]
    assert screen_add_requests(4, [1], [2**31], index_dtype="int32").tolist() == [
        int(Fault.BAD_NUM_COMPUTED)]
    s = state_with(((2**31 - 4) // B, 1, 2**31 - 3))
    got = screen_preprocess(s.state_idx, s.acc, s.num_computed, [0, 1, 1], [4, 1, 1], [1, 1, 1],
                            BT, block_size=B, num_spec=S, num_blocks=NB, index_dtype="int32")
    assert got.tolist() == [int(Fault.OVERFLOW), int(Fault.DUPLICATE_SLOT),
                            int(Fault.DUPLICATE_SLOT)]


def test_the_screen_takes_a_batch_without_rows():
    # the kernels and the core's steps accept zero rows; so does their non-raising reference
    from mamba_align.core import screen_add_requests, screen_postprocess, screen_preprocess
    state = (np.array([-1, -1]), np.array([1, 1]), np.array([0, 0]))
    bt, none = np.arange(1, 9).reshape(2, 4), np.array([], np.int64)
    opts = dict(block_size=4, num_spec=2, num_blocks=9)
    assert screen_add_requests(2, none, none).shape == (0,)
    assert screen_preprocess(*state, none, none, none, bt, **opts).shape == (0,)
    assert screen_postprocess(*state, none, none, none, none, bt, **opts).shape == (0,)

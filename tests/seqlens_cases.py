"""Bad ``cu_seqlens`` entries for the recurrences' tests (test_conv1d.py, test_gdn.py,
test_selective_state.py): the cases, the ``cu_seqlens`` they make, and what a launch on
them must give."""

from __future__ import annotations

from typing import Dict

import numpy as np

from mamba_align.core.faults import NO_ROW


# bad cu_seqlens entries in a batch of 40 one-token rows (cu = 0, 1, ..., 40, T_total =
# 40), each as (entries changed, the rows that read a bad pair, worked out by hand): a row
# reads only its own two entries (docs/semantics.md §4)
SEQLENS_CASES = [
    ({}, []),
    ({4: 2}, [3]),  # row 3 runs backwards; row 4 then covers tokens 2-4 (row 2's too)
    ({16: 14}, [15]),
    ({17: 15}, [16]),
    ({40: 38}, [39]),  # the last row
    ({40: 41}, [39]),  # the last entry past T_total
    ({0: -1}, [0]),  # the first entry below 0
    ({0: -1, 1: 0}, [0]),  # a one-token row from -1 (row 1 then covers tokens 0-1)
    ({39: 40, 40: 41}, [39]),  # a one-token row from T_total (row 38 covers 38-39)
    ({10: 50, 11: 50}, [9, 10, 11]),  # rows 9 and 10 end past T_total, row 11 runs back
    ({1: 3}, [1]),  # row 0 covers tokens 0-2, row 2 covers token 2 again
    ({1: 5, 4: 99}, [1, 3, 4]),  # row 0 covers tokens 0-4, row 2 token 2 in their middle
]


def seqlens_case(n: int, changed: Dict[int, int]) -> np.ndarray:
    """``cu_seqlens`` of ``n`` one-token rows with the entries ``changed``."""
    cu = np.arange(n + 1)
    for i, value in changed.items():
        cu[i] = value
    return cu


def check_seqlens_launch(cu, bad, bits: int, pool, wb, got, ref, state_tol: float,
                         out_tol: float, shared_states: bool = True) -> np.ndarray:
    """What a recurrence's launch on one-token rows with bad ``cu_seqlens`` entries must
    give (``got``, against the reference's ``ref``: ``(outputs, pool, errors)``; ``wb``
    each row's write block in layer 1): the flag ``[bits, lowest bad row]``, the bad rows'
    blocks untouched, every good row's block written and the pool as the reference's
    (within ``state_tol``; 0: bit for bit), the outputs on the tokens one good row covers
    (within ``out_tol``). Without ``shared_states`` the states and outputs of good rows that
    share a token with another good row are not compared (the chunked gated delta rule's
    scratch is indexed by token, docs/semantics.md §4). The rows are one token each, so
    ``n`` is also the token count. Returns which rows are good."""
    (y, out, err), (ry, rout, rerr) = got, ref
    n = len(cu) - 1
    assert err.tolist() == ([bits, bad[0]] if bad else [0, NO_ROW])
    assert err.tolist() == rerr.tolist()
    # the good rows ran on their own ranges (overlapping ones too); the bad wrote nothing
    good = np.isin(np.arange(n), bad, invert=True)
    sole = sole_tokens(cu, good, n)
    exact = np.ones(out.shape[1], bool)  # layer 1's blocks compared
    if not shared_states:  # good rows that share a token: their blocks and tokens
        shared = [r for r in np.flatnonzero(good)
                  if not sole[max(cu[r], 0):min(cu[r + 1], n)].all()]
        exact[wb[shared]] = False
        for r in shared:
            sole[max(cu[r], 0):min(cu[r + 1], n)] = False
    np.testing.assert_allclose(out[0], rout[0], rtol=state_tol, atol=state_tol)
    np.testing.assert_allclose(out[1, exact], rout[1, exact], rtol=state_tol, atol=state_tol)
    np.testing.assert_array_equal(out[1, wb[bad]], pool[1, wb[bad]])
    assert (out[1, wb[good]] != pool[1, wb[good]]).reshape(good.sum(), -1).any(axis=1).all()
    np.testing.assert_allclose(y[sole], ry[sole], rtol=out_tol, atol=out_tol)
    return good


def sole_tokens(cu, good, num_tokens: int) -> np.ndarray:
    """The tokens exactly one ``good`` row covers (bool ``[num_tokens]``): elsewhere a
    launch's output is unwritten or unspecified (two good rows share it)."""
    count = np.zeros(num_tokens, np.int64)
    for r in np.flatnonzero(good):
        count[max(cu[r], 0):min(cu[r + 1], num_tokens)] += 1
    return count == 1

"""BlockPool: the null block is never handed out, references are counted, recorded blocks
stay cached after release and are evicted least recently used first when the pool runs dry."""

import pytest

from mamba_align.core import BlockPool


def test_allocation_order_and_null_block():
    pool = BlockPool(4)
    got = [pool.allocate() for _ in range(3)]
    assert got == [1, 2, 3] and pool.num_available() == 0
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.allocate()


def test_release_returns_uncached_blocks_to_the_free_list():
    pool = BlockPool(3)
    a = pool.allocate()
    pool.hold(a)  # a second reference (e.g. a prefix hit)
    pool.release(a)
    assert not pool.is_free(a) and pool.refcount(a) == 1
    pool.release(a)
    assert pool.is_free(a) and pool.num_available() == 2


def test_cached_blocks_are_evicted_least_recently_used_first():
    pool = BlockPool(4)
    a, b, c = (pool.allocate() for _ in range(3))
    assert pool.record(a, "A") and pool.record(b, "B") and pool.record(c, "C")
    assert not pool.record(a, "A2")  # a block holds one key
    assert not pool.record(b, "A")  # a key names one block
    for blk in (a, b, c):
        pool.release(blk)  # cached, no holder: evictable in release order a, b, c
    assert pool.num_available() == 3 and not pool.is_free(a)
    assert pool.lookup("A") == a  # a hit refreshes A: B is now the oldest
    assert pool.allocate() == b and pool.lookup("B") is None  # evicted and forgotten
    assert pool.allocate() == c  # then C: A was used after C was released
    assert pool.lookup("C") is None and pool.lookup("A") == a


def test_a_held_cached_block_is_never_evicted():
    pool = BlockPool(3)
    a, b = pool.allocate(), pool.allocate()
    pool.record(a, "A")
    pool.release(a)
    pool.hold(a)  # a prefix hit takes it back
    pool.release(b)
    assert pool.allocate() == b
    with pytest.raises(RuntimeError):
        pool.allocate()  # only the held cached block is left
    assert pool.lookup("A") == a

"""Physical state blocks: a free list, reference counts and the prefix cache.

Block 0 is the null block and is never handed out. A block is *free*, *held* (reference
count > 0) or *cached with no holder* (evictable, least recently used first). A cached
block is keyed by the token ids of the prefix whose state it holds.
"""

from __future__ import annotations

import numbers
from collections import OrderedDict, deque
from typing import Dict, Hashable, Optional

from .checks import hashable, positive_int


class BlockPool:
    """Allocator over blocks ``1 .. num_blocks - 1`` with an LRU prefix cache."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = positive_int("num_blocks", num_blocks, minimum=2)
        self._free: deque[int] = deque(range(1, self.num_blocks))
        self._refs: Dict[int, int] = {}
        self._cache: Dict[Hashable, int] = {}
        self._key_of: Dict[int, Hashable] = {}
        self._evictable: "OrderedDict[int, None]" = OrderedDict()

    # -- queries ---------------------------------------------------------------------
    def num_available(self) -> int:
        """Blocks an allocation can still get: free ones plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    def is_free(self, block: int) -> bool:
        """True when ``block`` is on the free list (neither held nor cached)."""
        return block in self._free

    def refcount(self, block: int) -> int:
        return self._refs.get(block, 0)

    def is_cached(self, block: int) -> bool:
        return block in self._key_of

    def cached_blocks(self) -> Dict[Hashable, int]:
        """A copy of the prefix cache: key -> block."""
        return dict(self._cache)

    def lookup(self, key: Hashable) -> Optional[int]:
        """The block cached under ``key`` (refreshing its LRU position), or ``None``."""
        block = self._cache.get(hashable("key", key))
        if block is not None and block in self._evictable:
            self._evictable.move_to_end(block)
        return block

    # -- transitions -----------------------------------------------------------------
    def allocate(self) -> int:
        """A block for exclusive use: from the free list, else the LRU evictable cached one."""
        if self._free:
            block = self._free.popleft()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            del self._cache[self._key_of.pop(block)]
        else:
            raise RuntimeError("block pool exhausted; check num_available() first")
        self._refs[block] = 1
        return block

    def hold(self, block: int) -> None:
        """Take one more reference (e.g. a prefix-cache hit)."""
        self._check_id(block)
        if self.refcount(block) == 0 and not self.is_cached(block):
            raise ValueError(f"block {block} is free; allocate it instead of holding it")
        self._evictable.pop(block, None)
        self._refs[block] = self.refcount(block) + 1

    def release(self, block: int) -> None:
        """Drop one reference; with none left the block is evictable if cached, else free."""
        self._check_id(block)
        n = self.refcount(block)
        if n <= 0:
            raise ValueError(f"block {block} is not held")
        if n > 1:
            self._refs[block] = n - 1
            return
        del self._refs[block]
        if self.is_cached(block):
            self._evictable[block] = None
        else:
            self._free.append(block)

    def record(self, block: int, key: Hashable) -> bool:
        """Cache a held block under ``key``. Returns False (and caches nothing) when the key
        is already cached or the block already holds another key."""
        self._check_id(block)
        hashable("key", key)
        if self.refcount(block) <= 0:
            raise ValueError(f"block {block} must be held to be recorded")
        if key in self._cache or block in self._key_of:
            return False
        self._cache[key] = block
        self._key_of[block] = key
        return True

    def _check_id(self, block: int) -> None:
        if isinstance(block, bool) or not isinstance(block, numbers.Integral):
            raise TypeError(f"block must be an int, got {type(block).__name__}")
        if not 1 <= block < self.num_blocks:
            raise ValueError(f"block id must be in [1, {self.num_blocks}), got {block}")

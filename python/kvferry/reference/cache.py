"""The reference engine's paged KV cache: one /dev/shm file per TP rank, and the block pool."""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict

from .model import Geometry

PAGE = 4096


class ShmKvCache:
    """One TP rank's KV cache: every layer in one shared-memory file (mode 0600), at page-aligned
    offsets, each in one of vLLM's layouts (``[2, num_blocks, block_size, heads, head_dim]``,
    FlashInfer's ``[num_blocks, 2, block_size, heads, head_dim]`` or MLA's
    ``[num_blocks, block_size, latent]``). The node maps the same file; the engine owns it."""

    def __init__(self, geometry: Geometry, rank: int, path: str):
        self.geometry = geometry
        self.rank = rank
        self.path = path
        self.layer_bytes = geometry.rank_layer_bytes
        self.layer_stride = -(-self.layer_bytes // PAGE) * PAGE
        self.total_bytes = self.layer_stride * geometry.layers
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)  # the umask cannot widen it, but be explicit
            os.ftruncate(fd, self.total_bytes)
            self.map = mmap.mmap(fd, self.total_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.view = memoryview(self.map)
        self._region_bytes = geometry.num_blocks * geometry.block_size * geometry.rank_token_bytes

    def port_memory(self) -> dict:
        return {
            "kind": "host",
            "layers": [
                {"path": self.path, "offset": layer * self.layer_stride, "length": self.layer_bytes}
                for layer in range(self.geometry.layers)
            ],
        }

    def offset(self, layer: int, region: int, block: int, slot: int) -> int:
        g = self.geometry
        if g.blocks_first:
            return layer * self.layer_stride + ((block * 2 + region) * g.block_size + slot) * g.rank_token_bytes
        return (layer * self.layer_stride + region * self._region_bytes
                + (block * g.block_size + slot) * g.rank_token_bytes)

    def write(self, layer: int, region: int, block: int, slot: int, data: bytes) -> None:
        o = self.offset(layer, region, block, slot)
        self.view[o:o + len(data)] = data

    def read(self, layer: int, region: int, block: int, slot: int) -> memoryview:
        o = self.offset(layer, region, block, slot)
        return self.view[o:o + self.geometry.rank_token_bytes]

    def close(self, remove: bool = True) -> None:
        try:
            self.view.release()
            self.map.close()
        except (BufferError, ValueError):
            pass
        if remove:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


class BlockPool:
    """vLLM-like block pool: reference counts, a prefix cache keyed by full blocks' chained
    hashes, and a free queue in eviction order (a cached block stays findable while free, until
    it is handed out again)."""

    def __init__(self, num_blocks: int, prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.prefix_caching = prefix_caching
        self.refcount = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}
        # free block id -> None, oldest first: allocation takes from the front.
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))

    @property
    def free_count(self) -> int:
        return len(self.free_queue)

    def lookup(self, hashes: list[bytes]) -> list[int]:
        """The cached blocks for the longest prefix of ``hashes`` (not yet referenced)."""
        found = []
        if not self.prefix_caching:
            return found
        for h in hashes:
            b = self.cached.get(h)
            if b is None:
                break
            found.append(b)
        return found

    def touch(self, blocks: list[int]) -> None:
        """References cached blocks a new request shares."""
        for b in blocks:
            if self.refcount[b] == 0:
                del self.free_queue[b]
            self.refcount[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        if n > len(self.free_queue):
            return None
        out = []
        for _ in range(n):
            b, _ = self.free_queue.popitem(last=False)
            h = self.block_hash[b]
            if h is not None:  # evict it from the prefix cache
                if self.cached.get(h) == b:
                    del self.cached[h]
                self.block_hash[b] = None
            self.refcount[b] = 1
            out.append(b)
        return out

    def cache_block(self, block: int, h: bytes) -> None:
        """Makes a full block findable by its hash (its KV is in place and correct)."""
        if not self.prefix_caching or self.block_hash[block] is not None:
            return
        if h in self.cached:
            return  # another block holds the same tokens; keep the first
        self.block_hash[block] = h
        self.cached[h] = block

    def free(self, blocks: list[int]) -> None:
        # Freed in reverse so a request's tail is evicted before its head, as vLLM does.
        for b in reversed(blocks):
            if self.refcount[b] <= 0:
                raise AssertionError(f"block {b} freed twice")
            self.refcount[b] -= 1
            if self.refcount[b] == 0:
                self.free_queue[b] = None

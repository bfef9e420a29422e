"""The reference engine's deterministic "model".

The KV of token position ``t`` at layer ``l`` is a function of the tokens ``0..t`` and ``l``: a
16-byte chained hash of the token prefix seeds SHAKE-128, whose output is the layer's full K and V
for that token (all KV heads, in vLLM's head order). A TP rank holds its slice of the heads (MLA:
every rank holds the whole latent). The next token is a hash of KV bytes read back from the cache,
so a wrong or missing block changes what the engine emits. Tokens are plain ids: a prompt string
is split on whitespace and each word is its id (a decimal below the vocabulary) or a hash of it.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

VOCAB_SIZE = 32000
_SEED0 = b"kvferry-reference-model-v1\x00\x00\x00\x00\x00\x00"[:16]


@dataclass(frozen=True)
class Geometry:
    """The engine's whole KV cache shape; ``kv_heads`` counts every head (all TP ranks)."""

    layers: int
    num_blocks: int
    block_size: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    tp_size: int = 1
    mla: bool = False
    latent: int = 0
    # [num_blocks, 2, block_size, heads, head_dim] (FlashInfer's) instead of [2, num_blocks, ...].
    blocks_first: bool = False

    def __post_init__(self) -> None:
        for name in ("layers", "num_blocks", "block_size", "dtype_bytes", "tp_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.mla and self.blocks_first:
            raise ValueError("mla and blocks_first are two layouts; choose one")
        if self.mla:
            if self.latent < 1:
                raise ValueError("MLA needs --latent of at least 1")
        else:
            if self.kv_heads < 1 or self.head_dim < 1:
                raise ValueError("kv_heads and head_dim must be at least 1")
            if self.kv_heads % self.tp_size:
                raise ValueError(f"kv_heads {self.kv_heads} is not divisible by tp_size {self.tp_size}")

    @property
    def regions(self) -> int:
        """K and V (standard) or one latent region (MLA) per layer."""
        return 1 if self.mla else 2

    @property
    def rank_heads(self) -> int:
        return 0 if self.mla else self.kv_heads // self.tp_size

    @property
    def rank_token_bytes(self) -> int:
        """Bytes one token occupies in one region of one rank's layer."""
        if self.mla:
            return self.latent * self.dtype_bytes
        return self.rank_heads * self.head_dim * self.dtype_bytes

    @property
    def full_region_token_bytes(self) -> int:
        """Bytes one token occupies in one region over all ranks (MLA: one latent)."""
        if self.mla:
            return self.latent * self.dtype_bytes
        return self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def rank_layer_bytes(self) -> int:
        return self.regions * self.num_blocks * self.block_size * self.rank_token_bytes

    def port_geometry(self) -> dict:
        """One rank's geometry as the port's worker hello names it."""
        layout = "mla" if self.mla else "blocks_first" if self.blocks_first else "standard"
        g = {"layout": layout, "num_blocks": self.num_blocks,
             "block_size": self.block_size, "dtype_bytes": self.dtype_bytes}
        if self.mla:
            g["latent"] = self.latent
        else:
            g["kv_heads"] = self.rank_heads
            g["head_dim"] = self.head_dim
        return g

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)


def next_seed(previous: bytes, token: int) -> bytes:
    return hashlib.blake2b(previous + token.to_bytes(4, "little"), digest_size=16).digest()


def prefix_seeds(tokens: list[int], start: list[bytes] | None = None) -> list[bytes]:
    """Per position, the chained hash of the tokens up to it; extends ``start`` in place."""
    seeds = start if start is not None else []
    prev = seeds[-1] if seeds else _SEED0
    for tok in tokens[len(seeds):]:
        prev = next_seed(prev, tok)
        seeds.append(prev)
    return seeds


def token_layer_kv(seed: bytes, layer: int, geometry: Geometry) -> bytes:
    """All of one token's KV at one layer, regions in order, each holding every head."""
    n = geometry.regions * geometry.full_region_token_bytes
    return hashlib.shake_128(seed + layer.to_bytes(2, "little")).digest(n)


def rank_slice(full: bytes, region: int, rank: int, geometry: Geometry) -> bytes:
    """One rank's part of one region of ``token_layer_kv``."""
    base = region * geometry.full_region_token_bytes
    if geometry.mla:
        return full[base:base + geometry.full_region_token_bytes]
    width = geometry.rank_token_bytes
    return full[base + rank * width: base + (rank + 1) * width]


def token_from_digest(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "little") % VOCAB_SIZE


def tokenize(prompt: str) -> list[int]:
    out = []
    for word in prompt.split():
        if word.isdigit() and int(word) < VOCAB_SIZE:
            out.append(int(word))
        else:
            h = hashlib.blake2b(word.encode(), digest_size=8).digest()
            out.append(int.from_bytes(h, "little") % VOCAB_SIZE)
    return out


def detokenize(tokens: list[int]) -> str:
    return "".join(f" {t}" for t in tokens)


def block_hashes(tokens: list[int], block_size: int) -> list[bytes]:
    """vLLM-style prefix-cache keys: each full block's hash chains its parent's and its tokens
    (each token as 4 little-endian bytes, packed once for the whole prompt rather than a token at
    a time: this runs on the admission of every request)."""
    out = []
    parent = b""
    full = len(tokens) // block_size * block_size
    raw = struct.pack(f"<{full}I", *tokens[:full])
    step = 4 * block_size
    for start in range(0, 4 * full, step):
        parent = hashlib.blake2b(parent + raw[start:start + step], digest_size=16).digest()
        out.append(parent)
    return out

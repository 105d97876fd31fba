"""Content keys for KV blocks: SHA-256 chained from the parent block, namespaced by an optional salt.

A full block's key covers every token before it (through the parent chain), so equal keys mean equal
prefixes, hence equal KV. Tokens are serialised as fixed-width little-endian int64 after a one-byte
kind tag and the parent's fixed 32-byte digest, so two different token lists never serialise alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

_FULL, _PARTIAL, _SALT = b"F", b"P", b"S"
ROOT = bytes(32)


def root_hash(salt: str | None) -> bytes:
    if salt is None:
        return ROOT
    return hashlib.sha256(_SALT + salt.encode("utf-8")).digest()


def _tokens(tokens: Sequence[int]) -> bytes:
    return np.asarray(tokens, dtype="<i8").tobytes()


def hash_full_block(parent: bytes, tokens: Sequence[int]) -> bytes:
    return hashlib.sha256(_FULL + parent + _tokens(tokens)).digest()


def hash_partial_block(parent: bytes, tokens: Sequence[int]) -> bytes:
    """Key of a partly filled last block; distinct from any full block's key by its tag."""
    return hashlib.sha256(_PARTIAL + parent + _tokens(tokens)).digest()


def extend_block_hashes(
    hashes: list[bytes], tokens: Sequence[int], block_size: int, salt: str | None
) -> None:
    """Append the keys of the full blocks of `tokens` that `hashes` does not cover yet (each `hash_full_block` of
    its block). The new blocks' tokens are serialised in one conversion and hashed from byte slices of it: per
    block, the conversion cost more than the hash (a 10k-token prompt's 640 keys: 1.4 -> 0.8 ms on a CI core)."""
    start, end = len(hashes), len(tokens) // block_size
    if start >= end:
        return
    parent = hashes[-1] if hashes else root_hash(salt)
    data = _tokens(tokens[start * block_size : end * block_size])
    width = block_size * 8  # bytes of a block's tokens as int64
    sha256 = hashlib.sha256
    for off in range(0, len(data), width):
        parent = sha256(_FULL + parent + data[off : off + width]).digest()
        hashes.append(parent)

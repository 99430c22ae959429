"""The order-independent state digest.

digest(state) = XOR over live keys of blake2b-128(len(key) || key || value). Updating it for one
record is O(1) (XOR out the old pair, XOR in the new one), two replicas holding the same pairs
agree whatever order they applied them in, and the Spark audit computes the same value.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

DIGEST_BYTES = 16


def pair_hash(key: str, value: bytes) -> int:
    """The 128-bit hash of one live (key, value) pair, as an int."""
    k = key.encode()
    h = hashlib.blake2b(struct.pack(">I", len(k)) + k + value, digest_size=DIGEST_BYTES)
    return int.from_bytes(h.digest(), "big")


def digest_hex(value: int) -> str:
    return value.to_bytes(DIGEST_BYTES, "big").hex()


def digest_of(pairs: Iterable[tuple[str, bytes]]) -> int:
    """Digest of an iterable of (key, value) pairs (a restore without a stamp, the check of a stamp, audits)."""
    d = 0
    for key, value in pairs:
        d ^= pair_hash(key, value)
    return d

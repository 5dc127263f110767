"""Deterministic tensor values from a tensor's name, shared by the fixture scripts (``scripts/make_*_fixtures.py``)
and the tests that rebuild their checkpoints: ``lmplex_model::testing::hashed_values`` in Rust computes the same
bits (murmur3's finalizer over the name's FNV-1a hash and the element index)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def fnv1a(name: str) -> int:
    h = 0x811C9DC5
    for b in name.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def hashed_values(name: str, n: int, std: float, mean: float) -> NDArray[np.float32]:
    """``mean + std * u`` for u uniform in [-sqrt(3), sqrt(3)) (unit variance), as float32."""
    with np.errstate(over="ignore"):
        h = (np.arange(n, dtype=np.uint32) * np.uint32(0x9E3779B9)) ^ np.uint32(fnv1a(name))
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    u = h.astype(np.float64) / 2.0**32 * 2.0 - 1.0
    values: NDArray[np.float32] = (mean + std * np.sqrt(3.0) * u).astype(np.float32)
    return values

"""How the ingress spreads requests over the server replicas: prefix affinity under a load bound.

A request's affinity key is its model and the start of its prompt (:func:`affinity_key`). Every
router ranks the replicas for a key by rendezvous hashing, so all ingress replicas send a prefix to
the same server replica, where its KV blocks are cached, without sharing any state. The preferred
replica is taken unless it is more than ``imbalance`` requests busier than the least busy one; then,
and for requests without a key, two random replicas are offered and Serve takes the one with the
shorter queue (power of two choices), the one whose KV cache is nearly full last.

Invariants: routing never fails a request (an empty ranking only makes Serve retry); the ranking
depends only on the key, the replica ids and their load, never on a router's history.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

__all__ = ["AFFINITY_CHARS", "LMPlexRouter", "affinity_key"]

# The prompt characters that make the key: about 16 tokens per KV block, so a few blocks' worth.
AFFINITY_CHARS = 256
# KV use above which a replica is offered last.
KV_FULL = 0.9


def affinity_key(path: str, body: bytes) -> str | None:
    """The model and the first :data:`AFFINITY_CHARS` characters of the prompt of an OpenAI request
    body (completions, chat or responses); ``None`` when the body says neither."""
    if not body or not path.startswith("/v1/"):
        return None
    try:
        request = json.loads(body)
    except ValueError:
        return None
    if not isinstance(request, dict):
        return None
    text = _prompt_text(request)
    if not text:
        return None
    return f"{request.get('model')}\x00{text[:AFFINITY_CHARS]}"


def _prompt_text(request: dict[str, Any]) -> str:
    parts: list[str] = []
    for field in ("instructions", "prompt", "input", "messages"):
        value = request.get(field)
        if isinstance(value, list):
            value = value[0] if value and field == "prompt" else json.dumps(value, sort_keys=True)
        if isinstance(value, str):
            parts.append(value)
        if sum(map(len, parts)) >= AFFINITY_CHARS:
            break
    return "\x00".join(parts)


def _rank(key: str, replica: RunningReplica) -> bytes:
    return hashlib.blake2b(f"{key}\x00{replica.replica_id.unique_id}".encode(), digest_size=8).digest()


class LMPlexRouter(FIFOMixin, RequestRouter):
    """Serve's request router for the server replicas: prefix affinity, else power of two choices."""

    def initialize_state(self, imbalance: int = 8, **_: Any) -> None:
        self._imbalance = imbalance

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        key = pending_request.kwargs.get("affinity") if pending_request is not None else None
        if isinstance(key, str) and len(candidate_replicas) > 1:
            ranked = sorted(candidate_replicas, key=lambda r: _rank(key, r), reverse=True)
            lightest = min(self._load(r) for r in candidate_replicas)
            if self._load(ranked[0]) <= lightest + getattr(self, "_imbalance", 8):
                return [[ranked[0]], *self._two_choices(ranked[1:])]
        return self._two_choices(candidate_replicas)

    def _two_choices(self, replicas: list[RunningReplica]) -> list[list[RunningReplica]]:
        pair = random.sample(replicas, min(2, len(replicas)))
        full = [r for r in pair if float(r.routing_stats.get("kv_usage", 0.0)) >= KV_FULL]
        if full and len(full) < len(pair):
            return [[r for r in pair if r not in full], full]
        return [pair] if pair else []

    def _load(self, replica: RunningReplica) -> float:
        """Requests at the replica: Serve's probed queue length if fresh, else its last stats."""
        queued = self.replica_queue_len_cache.get(replica.replica_id)
        if queued is not None:
            return float(queued)
        stats = replica.routing_stats
        return float(stats.get("running", 0)) + float(stats.get("waiting", 0))

"""Tenants across replicas: how several servers that share one set of tenants split each quota; what a
replica's refusal becomes for the caller; how long a retry waits out a dead replica's claim on its key.
``LMLiteBlock`` and the Ray Serve application use it.

Invariant: every replica enforces ``1/replicas`` of each quota (rounded down), so together they never
exceed it; a quota smaller than the replica count is refused rather than rounded to zero. Keys made up
here are random (``secrets``) and never logged.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from lmplex._core import InvalidRequest, RateLimited, Tenant

__all__ = ["CLAIM_LAPSE_S", "rate_limited", "tenant_keys", "tenant_shares"]

# How long a retry waits for a dead replica's claim on the call's Idempotency-Key to lapse (a server
# holds a claim 3 s past its last renewal: docs/server.md, "Retries").
CLAIM_LAPSE_S = 10.0

_QUOTAS = ("requests_per_minute", "tokens_per_minute", "max_concurrency")


def tenant_keys(
    tenants: Sequence[Tenant], replicas: int
) -> tuple[dict[str | None, str], list[dict[str, Any]]]:
    """Each tenant's key (``None``: the block's own) and its fields for a replica: a key made up where
    it has none, every quota divided by ``replicas``."""
    if not tenants:
        return {}, []
    keys: dict[str | None, str] = {None: secrets.token_urlsafe(24)}
    out = tenant_shares(tenants, replicas)
    for fields in out:
        if fields.get("api_key_sha256") and not fields.get("api_key"):
            raise InvalidRequest(
                f"tenant '{fields['name']}' has only api_key_sha256: a block calls as a tenant with its key, "
                "so give api_key (or none, and the block makes one up)"
            )
        fields["api_key"] = fields.get("api_key") or secrets.token_urlsafe(24)
        keys[fields["name"]] = fields["api_key"]
    return keys, out


def tenant_shares(tenants: Sequence[Tenant], replicas: int) -> list[dict[str, Any]]:
    """Each tenant's fields for one of ``replicas`` servers that share its quotas: every quota divided
    by ``replicas`` (rounded down, so together they never exceed it); :class:`InvalidRequest` where a
    quota is smaller than ``replicas``."""
    out = []
    for t in tenants:
        fields = t.to_dict()
        for q in _QUOTAS:
            if fields.get(q) is not None:
                if fields[q] < replicas:
                    raise InvalidRequest(
                        f"tenant '{t.name}': {q}={fields[q]} cannot be split over {replicas} replicas (each "
                        "enforces 1/replicas of it, so together they never exceed it); use fewer replicas"
                    )
                fields[q] //= replicas
        if fields.get("max_cost_per_day") is not None:
            fields["max_cost_per_day"] /= replicas
        out.append(fields)
    return out


def rate_limited(message: str, error: Mapping[str, Any], retry_after: str | None) -> RateLimited:
    """The :class:`RateLimited` a replica's 429 body and ``Retry-After`` header describe."""
    limit = {"insufficient_quota": "cost", "tokens": "tokens"}.get(str(error.get("type")), "requests")
    try:
        wait = float(retry_after) if retry_after else 1.0
    except ValueError:
        wait = 1.0
    return RateLimited(message, wait, limit)

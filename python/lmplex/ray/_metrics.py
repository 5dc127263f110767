"""``/metrics`` of a Ray app: every server replica's Prometheus metrics, not just the one that answers.

Each server replica reads its server's ``/metrics`` every ``STATS_PERIOD_S`` for the router
(:meth:`~lmplex.ray._replica.ServerReplica.record_routing_stats`) and hands the same text to
:class:`MetricsHub` (one replica). The ingress answers ``GET /metrics`` through a server replica, as
any route (so ``lmplex serve``'s own ``metrics_api_key`` check applies), then replaces the body with
:func:`merge` of that reply and the hub's texts of the other replicas.

Invariants: every sample carries a ``replica`` label naming the replica it came from, so counters of
different replicas are never added up here (Prometheus sums them with ``sum by``); a replica that has
not reported for :data:`STALE_S` (dead, or scaled down) is left out; the text is parsed and written by
``prometheus_client`` (OpenMetrics, as the servers write it), never by hand.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["STALE_S", "MetricsHub", "merge"]

# Seconds after which a replica that has not reported is left out (a few report periods).
STALE_S = 10.0


class MetricsHub:
    """The latest metrics text of each server replica, as they report it."""

    def __init__(self) -> None:
        self._texts: dict[str, tuple[float, str]] = {}

    def report(self, replica: str, text: str) -> None:
        self._texts[replica] = (time.monotonic(), text)

    def texts(self) -> dict[str, str]:
        """Each replica's latest text, for replicas heard from within :data:`STALE_S`."""
        now = time.monotonic()
        self._texts = {r: (t, x) for r, (t, x) in self._texts.items() if now - t <= STALE_S}
        return {r: x for r, (_, x) in self._texts.items()}


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merge(texts: Mapping[str, str]) -> bytes:
    """One OpenMetrics text of every replica's text in ``texts`` (by replica id), each sample
    labelled ``replica``; a family keeps its help and type, with the samples of every replica."""
    families: dict[str, Metric] = {}
    for replica, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text):  # type: ignore[no-untyped-call]
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            merged.samples += [s._replace(labels={**s.labels, "replica": replica}) for s in family.samples]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    out: bytes = generate_latest(registry)  # type: ignore[no-untyped-call]
    return out

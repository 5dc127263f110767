"""lmplex on Ray Serve: one LM Lite block per replica, the same OpenAI API as ``lmplex serve``.

``pip install "lmplex[ray]"``, then::

    from ray import serve
    from lmplex import ModelConfig
    from lmplex.ray import build_app

    serve.run(build_app(models=[ModelConfig("smollm2-135m-instruct")], num_replicas=2))

or ``serve run config.yaml`` with ``import_path: lmplex.ray:app`` and the same keywords as ``args``
(docs/scale-out.md). :func:`build_app` returns three deployments: ``LMPlexServer``, whose replicas
each host every model of the block in one process (``lmplex serve``'s own server), ``LMPlexIngress``,
the HTTP entry that spreads requests over them (:mod:`lmplex.ray._router`), and ``LMPlexMetrics``,
which keeps every server replica's latest metrics for ``/metrics`` (:mod:`lmplex.ray._metrics`).

Invariants: the API is ``lmplex serve``'s, never re-implemented here; tenants' quotas are split over
the most replicas the deployment may have, so together the replicas never exceed a quota, unless they
share a usage store (``usage_store``: Redis, or SQLite on one machine), which holds each quota whole; Ray is imported only by
this package.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ray import serve
from ray.serve import Application

from lmplex._core import InvalidRequest, ModelConfig, Tenant, TierSet
from lmplex.ray._metrics import MetricsHub
from lmplex.ray._replica import Ingress, ServerReplica
from lmplex.ray._router import LMPlexRouter, affinity_key
from lmplex.replicas import tenant_shares
from lmplex.server_toml import server_toml

__all__ = ["LMPlexRouter", "affinity_key", "app", "build_app"]

# Seconds between a replica's load reports to the routers.
STATS_PERIOD_S = 2.0


def build_app(
    models: Sequence[ModelConfig | str],
    *,
    num_replicas: int | None = None,
    autoscaling_config: Mapping[str, Any] | None = None,
    ray_actor_options: Mapping[str, Any] | None = None,
    tenants: Sequence[Tenant] | None = None,
    tiers: TierSet | None = None,
    memory_budget_bytes: int | None = None,
    max_ongoing_requests: int | None = None,
    api_keys: Sequence[str] = (),
    ingress_replicas: int = 1,
    start_timeout_s: float = 600.0,
    usage_store: str | None = None,
    usage_store_fail_open: bool = False,
) -> Application:
    """A Ray Serve application serving ``models`` (one LM Lite block) over the OpenAI API.

    Each replica of the ``LMPlexServer`` deployment loads every model; ``num_replicas`` (default 1)
    or ``autoscaling_config`` (Serve's, e.g. ``{"min_replicas": 1, "max_replicas": 4}``) say how many
    run, and ``ray_actor_options`` what each asks of Ray (``{"num_cpus": 2}``, ``{"num_gpus": 0.5}``).
    ``max_ongoing_requests`` (default: twice the models' summed ``max_model_concurrency``) is how many
    requests a replica holds at once, so its batches stay full. ``tenants``, ``tiers``,
    ``memory_budget_bytes`` and ``api_keys`` mean what they mean to ``lmplex serve``. Where tenants'
    usage lives: by default each replica's memory, and each tenant quota is divided by the replica count
    (``max_replicas`` when autoscaling); with a shared store, ``usage_store="redis://HOST:PORT/DB"`` or
    ``"sqlite:PATH"`` (a file every replica can open: one machine), the replicas share it and every
    quota holds whole for the app (docs/tenants.md); ``usage_store_fail_open`` lets calls through
    unmetered while the store cannot be reached instead of answering 503. ``GET /metrics`` answers
    with every server replica's metrics, each sample labelled ``replica``.
    """
    configs = [ModelConfig(m) if isinstance(m, str) else m for m in models]
    if not configs:
        raise InvalidRequest("build_app needs at least one model")
    if num_replicas is not None and autoscaling_config is not None:
        raise InvalidRequest("give num_replicas or autoscaling_config, not both")
    most = int((autoscaling_config or {}).get("max_replicas", num_replicas or 1))
    top: dict[str, object] = {"port": 0}
    if usage_store is not None and usage_store.startswith("sqlite:"):
        top["usage_store"] = "sqlite:" + os.path.abspath(usage_store.removeprefix("sqlite:"))
        most = 1  # one store: nothing to split
    elif usage_store is not None and usage_store.startswith("redis://"):
        top["usage_store"] = usage_store
        most = 1
    elif usage_store not in (None, "memory"):
        raise InvalidRequest('usage_store must be "memory", "sqlite:PATH" or "redis://HOST:PORT/DB"')
    if usage_store_fail_open:
        top["usage_store_fail_open"] = True
    shares = tenant_shares(tenants or [], most)
    if memory_budget_bytes is not None:
        top["memory_budget_bytes"] = memory_budget_bytes
    if api_keys:
        top["api_keys"] = list(api_keys)
    config = server_toml(configs, shares, tiers, **top)
    ongoing = max_ongoing_requests or 2 * sum(c.max_model_concurrency for c in configs)
    router = {
        "request_router_class": "lmplex.ray._router:LMPlexRouter",
        "request_routing_stats_period_s": STATS_PERIOD_S,
    }
    scale: dict[str, Any] = (
        {"autoscaling_config": dict(autoscaling_config)}
        if autoscaling_config is not None
        else {"num_replicas": num_replicas or 1}
    )
    server = serve.deployment(
        name="LMPlexServer",
        **scale,
        ray_actor_options=dict(ray_actor_options or {}),
        max_ongoing_requests=ongoing,
        request_router_config=router,
        health_check_period_s=5,
        graceful_shutdown_timeout_s=30,
    )(ServerReplica)
    ingress = serve.deployment(
        name="LMPlexIngress",
        num_replicas=ingress_replicas,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=100_000,
    )(Ingress)
    hub = serve.deployment(name="LMPlexMetrics", num_replicas=1, ray_actor_options={"num_cpus": 0})(
        MetricsHub
    ).bind()
    api_key = api_keys[0] if api_keys else None
    return ingress.bind(server.bind(config, api_key, start_timeout_s, hub), hub)


def app(args: dict[str, Any]) -> Application:
    """The application builder for ``serve run`` and Serve's config files (``import_path:
    lmplex.ray:app``): ``args`` holds :func:`build_app`'s keywords, with models, tenants and tiers as
    plain data: ``models`` a list of model ids or ``ModelConfig`` field dicts, ``tenants`` a list of
    ``Tenant`` field dicts, ``tiers`` a dict of tier name to served model names."""
    known = set(inspect.signature(build_app).parameters)
    unknown = sorted(set(args) - known)
    if unknown:
        raise InvalidRequest(f"unknown lmplex.ray:app args {unknown}; known: {sorted(known)}")
    kwargs = dict(args)
    kwargs["models"] = [m if isinstance(m, str) else ModelConfig.from_dict(m) for m in args.get("models", [])]
    if "tenants" in args:
        kwargs["tenants"] = [Tenant.from_dict(t) for t in args["tenants"]]
    if "tiers" in args:
        kwargs["tiers"] = TierSet.from_dict(args["tiers"])
    return build_app(**kwargs)

"""The two Ray Serve deployments of :func:`lmplex.ray.build_app`.

- :class:`ServerReplica` hosts one LM Lite block: ``lmplex serve``'s own Rust server, started in the
  replica's process on a loopback port (``_core.start_server``), with every model of the block. It
  forwards each request to that server and streams the answer back, so the API (routes, JSON, SSE,
  errors, tenants, tiers) is the one implementation ``lmplex serve`` has.
- :class:`Ingress` receives the HTTP requests from Serve's proxy and hands each one whole (method,
  path below the app's route prefix, headers, body) to a server replica through a streaming handle,
  with its prefix-affinity key for :class:`~lmplex.ray._router.LMPlexRouter`; ``GET /metrics``
  answers with every replica's metrics (:mod:`lmplex.ray._metrics`).

Invariants: a server replica counts as started only once every model has loaded (``/ready``), and as
healthy while its server runs and answers ``/ready`` with 200, or with a 503 that only says the usage
store is unavailable (a store outage is every replica's; replacing replicas would not end it); a request whose replica dies before the
client has seen any of the reply is sent again, to another replica, at most :data:`RETRIES` times: a
whole reply (JSON) is read from the replica before any of it is sent on, so a replica dying between
the head and the body is retried too; every attempt carries the call's ``Idempotency-Key`` (the
client's, else one made here), so a replica that sees it again, or any replica on a shared usage
store, does not run it twice (docs/server.md, "Retries"); a reply
already streaming to the client (SSE) cannot be moved: if its replica dies, the client gets the
events sent whole so far and then an error event (:func:`cut_event`), never a cut-off event or a hang.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
from ray import serve
from ray.serve.exceptions import RayServeException
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from lmplex import _core, models
from lmplex.ray._metrics import MetricsHub, merge
from lmplex.ray._router import affinity_key
from lmplex.replicas import CLAIM_LAPSE_S

__all__ = ["RETRIES", "Ingress", "ServerReplica", "cut_event"]

RETRIES = 2
_KEY = "idempotency-key"
_SEQUENCE = re.compile(rb'"sequence_number":(\d+)')
# Headers that describe one connection, not the message: never forwarded.
_HOP = frozenset(
    (
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "upgrade",
        "host",
        "content-length",
        "date",
        "server",
    )
)
_log = logging.getLogger("lmplex.ray")


class ServerReplica:
    """One replica: the block's models behind ``lmplex serve``'s server on a loopback port."""

    def __init__(
        self,
        config_toml: str,
        api_key: str | None,
        start_timeout_s: float,
        metrics: DeploymentHandle[MetricsHub] | None = None,
    ) -> None:
        self._metrics = metrics
        self._server = _core.start_server(config_toml, models.resolve, host="127.0.0.1", port=0)
        self._url = self._server.url
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client: httpx.AsyncClient | None = None
        self.replica = _replica_id()
        deadline = time.monotonic() + start_timeout_s
        while httpx.get(f"{self._url}/ready", timeout=10).status_code != 200:
            if not self._server.running():
                self._server.shutdown()  # raises the load error
                raise RuntimeError("the lmplex server stopped while loading")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the models did not load within {start_timeout_s} s")
            time.sleep(0.1)
        _log.info("lmplex replica %s serving at %s", self.replica, self._url)

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:  # made on the replica's event loop, on first use
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
            self._client = httpx.AsyncClient(base_url=self._url, timeout=None, limits=limits)
        return self._client

    async def handle(
        self,
        method: str,
        path: str,
        query: str,
        headers: list[tuple[str, str]],
        body: bytes,
        affinity: str | None,
    ) -> AsyncIterator[dict[str, Any] | bytes]:
        """Forwards one request; yields the head (status, headers, replica) first, then body chunks.
        ``affinity`` is only read by the router."""
        del affinity
        request = self._http().build_request(
            method, path, params=query or None, headers=headers, content=body
        )
        response = await self._http().send(request, stream=True)
        try:
            head = [(k, v) for k, v in response.headers.items() if k.lower() not in _HOP]
            yield {"status": response.status_code, "headers": head, "replica": self.replica}
            async for chunk in response.aiter_raw():
                yield chunk
        finally:
            await response.aclose()

    async def record_routing_stats(self) -> dict[str, float]:
        """Requests running and waiting over the block's models, and the fullest KV cache, from the
        server's own metrics, which go to the app's metrics hub too."""
        text = (await self._http().get("/metrics", headers=self._auth)).text
        if self._metrics is not None:
            try:
                await self._metrics.report.remote(self.replica, text)
            except Exception as err:  # noqa: BLE001 - the routing stats do not depend on the hub
                _log.warning("lmplex replica %s could not report its metrics: %r", self.replica, err)
        stats = {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0}
        for line in text.splitlines():
            name, value = line.partition("{")[0], line.rsplit(" ", 1)[-1]
            if name.startswith("lmplex_num_requests_running"):
                stats["running"] += float(value)
            elif name.startswith("lmplex_num_requests_waiting"):
                stats["waiting"] += float(value)
            elif name.startswith("lmplex_kv_cache_usage_ratio"):
                stats["kv_usage"] = max(stats["kv_usage"], float(value))
        return stats

    async def check_health(self) -> None:
        """Raises unless the server runs and says it is ready, or unready only for its usage store
        (Serve replaces the replica)."""
        if not self._server.running():
            raise RuntimeError("the lmplex server stopped")
        ready = await self._http().get("/ready", timeout=10)
        if ready.status_code == 503 and ready.json().get("status") == "usage store unavailable":
            return
        if ready.status_code != 200:
            raise RuntimeError(f"the lmplex server is not ready (/ready answered {ready.status_code})")

    def __del__(self) -> None:
        server = getattr(self, "_server", None)
        if server is not None:
            server.shutdown()  # drains: open requests finish


class Ingress:
    """The HTTP entry: every path goes to a server replica chosen by the router."""

    def __init__(
        self, server: DeploymentHandle[ServerReplica], metrics: DeploymentHandle[MetricsHub] | None = None
    ) -> None:
        self._server = server
        self._metrics = metrics

    async def __call__(self, request: Request) -> Response:
        body = await request.body()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        if request.method == "POST" and not any(k.lower() == _KEY for k, _ in headers):
            # One key for every attempt: a replica that sees it again does not run the call twice.
            headers.append((_KEY, f"ingress-{secrets.token_hex(16)}"))
        path = _app_path(request)
        affinity = affinity_key(path, body)
        args = (request.method, path, request.url.query, headers, body)
        failure: BaseException | None = None
        settle_by = time.monotonic() + CLAIM_LAPSE_S
        attempt = 0
        while attempt <= RETRIES:
            attempt += 1
            # A streaming handle's call returns a generator (`stream=True`).
            stream = cast(
                DeploymentResponseGenerator[Any],
                self._server.options(stream=True).handle.remote(*args, affinity=affinity),
            )
            try:
                head = await stream.__anext__()
                out_headers = dict(head["headers"])
                out_headers["x-lmplex-replica"] = head["replica"]
                if not _streams(out_headers):
                    # Read whole before anything reaches the client, so that it can still move.
                    content = b"".join([chunk async for chunk in stream])
                    code = _error_code(head["status"], out_headers, content)
                    if code == "draining":
                        # The replica is shutting down and ran nothing: another one takes the call.
                        failure = RuntimeError("the replica is draining")
                        continue
                    in_progress = code == "request_in_progress"
                    if attempt > 1 and in_progress and time.monotonic() < settle_by:
                        # The replica that died during an earlier attempt holds the key until its
                        # claim lapses (seconds); then this call runs.
                        await asyncio.sleep(1.0)
                        attempt -= 1
                        continue
                    if path == "/metrics" and head["status"] == 200:
                        content = await self._every_replica(head["replica"], content)
                    return Response(content, status_code=head["status"], headers=out_headers)
            except (asyncio.CancelledError, StopAsyncIteration):
                raise
            except Exception as err:  # noqa: BLE001 - the replica died or failed before the client saw a byte
                _log.warning("lmplex request failed before its reply (attempt %d): %r", attempt, err)
                failure = err
                settle_by = time.monotonic() + CLAIM_LAPSE_S
                continue
            return StreamingResponse(_body(stream, path), status_code=head["status"], headers=out_headers)
        return _unavailable(failure)

    async def _every_replica(self, replica: str, text: bytes) -> bytes:
        """The metrics of every live replica: ``text`` (``replica``'s, just read) and the hub's of
        the others; ``text`` alone if the hub cannot answer."""
        if self._metrics is None:
            return text
        try:
            texts: dict[str, str] = await self._metrics.texts.remote()
            texts[replica] = text.decode()
            return merge(texts)
        except Exception as err:  # noqa: BLE001 - one replica's metrics beat none
            _log.warning("lmplex metrics of the other replicas are unavailable: %r", err)
            return text


def _app_path(request: Request) -> str:
    """The request's path below the app's route prefix (Serve's ``root_path``): what the server
    replica routes on."""
    path: str = request.scope["path"]
    root: str = request.scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :] or "/"
    return path


def _streams(headers: dict[str, str]) -> bool:
    """Whether a reply with these headers is a stream (server-sent events) rather than one body."""
    kind = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    return kind.split(";")[0].strip().lower() == "text/event-stream"


def _replica_id() -> str:
    """This Serve replica's id; the process id outside Serve (a replica built directly, in tests)."""
    try:
        return str(serve.get_replica_context().replica_id.unique_id)
    except RayServeException:
        return f"pid-{os.getpid()}"


def _error_code(status: int, headers: dict[str, str], content: bytes) -> str | None:
    """The ``code`` of an error reply: ``request_in_progress`` (a 409 for a key another attempt still
    holds), ``draining`` (a 503 from a replica shutting down), ...; ``None`` for anything else. The
    server repeats the codes a client acts on in ``x-lmplex-error-code`` (Anthropic's body has none)."""
    if status < 400:
        return None
    named = next((v for k, v in headers.items() if k.lower() == "x-lmplex-error-code"), None)
    if named:
        return named
    try:
        code = json.loads(content)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return code if isinstance(code, str) else None


async def _body(stream: DeploymentResponseGenerator[Any], path: str) -> AsyncIterator[bytes]:
    """The stream's events as they come, each whole; if the replica dies mid-stream, the partial
    event is dropped and the stream ends with an error event in the route's own shape."""
    pending = b""
    numbered = path.startswith("/v1/responses")
    sequence = 0  # the Responses API's next `sequence_number`
    try:
        async for chunk in stream:
            pending += chunk
            whole, sep, pending = pending.rpartition(b"\n\n")
            if sep:
                numbers = _SEQUENCE.findall(whole) if numbered else []
                sequence = int(numbers[-1]) + 1 if numbers else sequence
                yield whole + sep
    except (asyncio.CancelledError, GeneratorExit):
        raise
    except Exception as err:  # noqa: BLE001 - the replica died or failed with the stream open
        _log.warning("lmplex stream cut by its replica: %r", err)
        yield cut_event(path, sequence)
        return
    if pending:
        yield pending


def cut_event(path: str, sequence: int = 0) -> bytes:
    """The event that ends a stream whose replica was lost: OpenAI's error chunk (then ``[DONE]``),
    the Responses API's ``error`` event (numbered ``sequence``), or Anthropic's."""
    message = "the lmplex replica serving this stream was lost; the reply is incomplete: retry the request"
    event: dict[str, Any]
    if path.startswith("/v1/messages"):
        event = {"type": "error", "error": {"type": "overloaded_error", "message": message}}
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"
    if path.startswith("/v1/responses"):
        event = {"type": "error", "code": "replica_lost", "message": message, "param": None}
        event["sequence_number"] = sequence
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"
    error = {"message": message, "type": "service_unavailable", "param": None, "code": "replica_lost"}
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\ndata: [DONE]\n\n"


def _unavailable(err: BaseException | None) -> JSONResponse:
    message = f"no lmplex replica could answer: {type(err).__name__}"
    error = {"message": message, "type": "service_unavailable", "param": None, "code": "service_unavailable"}
    return JSONResponse({"error": error}, status_code=503, headers={"Retry-After": "1"})

"""lmplex.ray on a local Ray instance: two server replicas behind Serve's proxy, through the openai client.

The cluster is ``ray.init(num_cpus=2, num_gpus=1)``: the GPU is a resource Ray counts, not a device, so
each replica's ``num_gpus=0.5`` is scheduled as in production while the engines run on the CPU.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import lora_util
import pytest

pytest.importorskip("ray.serve", reason="lmplex[ray] is not installed (Ray needs Python 3.10+)")

import openai
import ray
import yaml
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from ray import serve

from lmplex import Engine, InvalidRequest, ModelConfig, SamplingParams, Tenant
from lmplex.ray import STATS_PERIOD_S, affinity_key, app, build_app
from lmplex.ray._replica import ServerReplica, cut_event
from lmplex.server_toml import server_toml

MODEL = "smol"
ADAPTER = "smol-qv"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> str:
    return lora_util.write_adapter(tmp_path_factory.mktemp("lora") / "qv", lora_util.fixture()["adapters"][0])


@pytest.fixture(scope="module")
def ray_url(smollm2_path: str, adapter: str) -> Iterator[str]:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(
        num_cpus=2, num_gpus=1, include_dashboard=False, object_store_memory=100 << 20, log_to_driver=False
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        config = ModelConfig(
            smollm2_path,
            served_model_name=MODEL,
            max_model_len=512,
            max_model_concurrency=4,
            lora_modules={ADAPTER: adapter},
        )
        options = {"num_cpus": 0, "num_gpus": 0.5}
        serve.run(build_app([config], num_replicas=2, ray_actor_options=options), route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()


@pytest.fixture
def client(ray_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{ray_url}/v1", api_key="unused", max_retries=0)


def _server_replicas() -> set[str]:
    """The ids of the LMPlexServer deployment's live replicas, once all of them run."""
    status = serve.status().applications["default"].deployments["LMPlexServer"]
    if set(status.replica_states) != {"RUNNING"}:
        return set()
    prefix = "SERVE_REPLICA::default#LMPlexServer#"
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    return {n[len(prefix) :] for n in names if n.startswith(prefix)}


def test_openai_client_plain_and_streaming(client: openai.OpenAI, engine: Engine) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=16)
    prompts: list[Any] = [[dict(m) for m in CHAT], "The capital of France is"]
    local = engine.generate(prompts, greedy)
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0)
    assert reply.choices[0].message.content == local[0].text  # batch invariance: the same tokens
    assert reply.usage is not None and reply.usage.completion_tokens == len(local[0].token_ids)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert len(chunks) > 3 and chunks[-1].usage is not None
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == local[0].text
    text = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=16, temperature=0
    )
    assert text.choices[0].text == local[1].text
    assert [m.id for m in client.models.list()] == [MODEL, ADAPTER]


def test_an_adapter_is_served_as_a_model(client: openai.OpenAI, smollm2_path: str, adapter: str) -> None:
    config = ModelConfig(smollm2_path, max_model_len=512, lora_modules={ADAPTER: adapter})
    want = Engine(config).chat(
        [dict(m) for m in CHAT], SamplingParams(temperature=0, max_tokens=16), lora=ADAPTER
    )
    reply = client.chat.completions.create(model=ADAPTER, messages=CHAT, max_tokens=16, temperature=0)
    assert reply.choices[0].message.content == want.text
    assert reply.model == ADAPTER


def test_errors_are_lmplex_serves_own(ray_url: str) -> None:
    missing = httpx.post(f"{ray_url}/v1/completions", json={"model": "nope", "prompt": "a"})
    assert missing.status_code == 404 and "does not exist" in missing.json()["error"]["message"]
    wrong = httpx.post(f"{ray_url}/v1/chat/completions", json={"model": MODEL, "messages": "hi"})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "messages"
    assert httpx.get(f"{ray_url}/ready").status_code == 200
    assert "lmplex_num_requests_running" in httpx.get(f"{ray_url}/metrics").text


def test_a_prefix_stays_on_one_replica(ray_url: str) -> None:
    seen: dict[int, set[str]] = {}
    for p in range(16):
        prefix = f"Document {p}: " + "lorem ipsum dolor sit amet " * 12
        for i in range(3):
            body = {"model": MODEL, "prompt": f"{prefix}\nQuestion {i}?", "max_tokens": 1}
            reply = httpx.post(f"{ray_url}/v1/completions", json=body, timeout=60)
            assert reply.status_code == 200
            seen.setdefault(p, set()).add(reply.headers["x-lmplex-replica"])
    assert all(len(replicas) == 1 for replicas in seen.values()), seen
    assert len(set().union(*seen.values())) == 2  # the prefixes spread over both replicas


def _by_replica(text: str, name: str) -> dict[str, float]:
    """The samples ``name`` of the model in a merged ``/metrics`` text, summed per replica."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):  # type: ignore[no-untyped-call]
        for sample in family.samples:
            if sample.name == name and sample.labels.get("model") == MODEL:
                replica = sample.labels["replica"]
                out[replica] = out.get(replica, 0.0) + sample.value
    return out


def test_metrics_cover_every_replica(ray_url: str) -> None:
    replicas = _server_replicas()
    assert len(replicas) == 2
    deadline = time.monotonic() + 30  # each replica reports every STATS_PERIOD_S
    while set(_by_replica(httpx.get(f"{ray_url}/metrics").text, "lmplex_num_requests_running")) != replicas:
        assert time.monotonic() < deadline, httpx.get(f"{ray_url}/metrics").text[:2000]
        time.sleep(0.5)
    # The hub's copies lag by up to a report period: wait until they hold still (earlier tests' calls).
    before: dict[str, float] = {}
    while before != (now := _by_replica(httpx.get(f"{ray_url}/metrics").text, "lmplex_requests_total")):
        before = now
        time.sleep(STATS_PERIOD_S + 0.5)
    sent: dict[str, int] = dict.fromkeys(replicas, 0)
    for i in range(8):  # distinct prompts: spread over both replicas
        body = {"model": MODEL, "prompt": f"Metric {i} " * (i + 1), "max_tokens": 1}
        reply = httpx.post(f"{ray_url}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200
        sent[reply.headers["x-lmplex-replica"]] += 1
    deadline = time.monotonic() + 30
    while True:  # every replica's count, whichever replica answered the scrape
        after = _by_replica(httpx.get(f"{ray_url}/metrics").text, "lmplex_requests_total")
        grew = {r: after.get(r, 0.0) - before.get(r, 0.0) for r in replicas}
        if grew == sent or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert grew == sent and sum(sent.values()) == 8


def test_replicas_on_one_usage_store_hold_a_quota_whole(
    ray_url: str, smollm2_path: str, tmp_path: Any
) -> None:
    """Two replicas of a second app (under a route prefix) share a SQLite usage store: 24 concurrent
    calls of a tenant allowed 10 a minute get exactly 10 answers, and any replica reports 10."""
    key = "sk-ray-quota-0123456789"
    config = ModelConfig(smollm2_path, served_model_name=MODEL, max_model_len=256)
    quota_app = build_app(
        [config],
        num_replicas=2,
        ray_actor_options={"num_cpus": 0},
        tenants=[Tenant("q", api_key=key, requests_per_minute=10)],
        usage_store=f"sqlite:{tmp_path / 'usage.sqlite'}",
    )
    serve.run(quota_app, name="quota", route_prefix="/quota")
    url, auth = f"{ray_url}/quota", {"Authorization": f"Bearer {key}"}
    try:

        def call(i: int) -> httpx.Response:
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"Say {i}."}], "max_tokens": 2}
            return httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth, timeout=120)

        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            replies = list(pool.map(call, range(24)))
        codes = [r.status_code for r in replies]
        assert codes.count(200) == 10 and codes.count(429) == 14, codes
        assert len({r.headers["x-lmplex-replica"] for r in replies}) == 2
        seen = {}
        for _ in range(6):
            usage = httpx.get(f"{url}/v1/usage", headers=auth)
            seen[usage.headers["x-lmplex-replica"]] = usage.json()["requests"]
        assert set(seen.values()) == {10}, seen
    finally:
        serve.delete("quota")


def test_replica_health_and_load_come_from_its_server(smollm2_path: str) -> None:
    """A server replica built directly (no cluster): healthy while its server is ready, its load read
    from the server's metrics, unhealthy once the server stopped (Serve would replace it)."""
    config = server_toml([ModelConfig(smollm2_path, served_model_name=MODEL, max_model_len=256)], port=0)
    replica = ServerReplica(config, None, 120)

    async def probe() -> None:  # one event loop, as in a replica
        await replica.check_health()
        assert await replica.record_routing_stats() == {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0}
        metrics = (await replica._http().get("/metrics")).text  # the names the stats are read from
        for name in (
            "lmplex_num_requests_running{",
            "lmplex_num_requests_waiting{",
            "lmplex_kv_cache_usage_ratio{",
        ):
            assert name in metrics
        replica._server.shutdown()
        with pytest.raises(RuntimeError, match="server stopped"):
            await replica.check_health()

    asyncio.run(probe())


def test_affinity_key_reads_the_prompt_start() -> None:
    long = "x" * 1000
    a = affinity_key(
        "/v1/chat/completions",
        f'{{"model": "m", "messages": [{{"role": "user", "content": "{long}"}}]}}'.encode(),
    )
    b = affinity_key(
        "/v1/chat/completions",
        f'{{"model": "m", "messages": [{{"role": "user", "content": "{long}y"}}]}}'.encode(),
    )
    assert a is not None and a == b
    assert affinity_key("/v1/completions", b'{"model": "m", "prompt": ["abc"]}') == "m\x00abc"
    assert affinity_key("/v1/completions", b"not json") is None
    assert affinity_key("/metrics", b"") is None


def test_killed_replica_is_replaced_and_requests_still_served(ray_url: str, client: openai.OpenAI) -> None:
    before = _server_replicas()
    assert len(before) == 2
    failures: list[BaseException] = []
    served: list[str] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:  # distinct prompts, so the router spreads them (one prefix stays on one replica)
                ask: list[ChatCompletionMessageParam] = [
                    {"role": "user", "content": f"Count to {len(served)}."}
                ]
                raw = client.chat.completions.with_raw_response.create(
                    model=MODEL, messages=ask, max_tokens=8
                )
                served.append(raw.headers["x-lmplex-replica"])
            except Exception as err:  # noqa: BLE001 - every failure counts
                failures.append(err)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        time.sleep(1.0)
        victim = min(before)
        ray.kill(
            ray.get_actor(f"SERVE_REPLICA::default#LMPlexServer#{victim}", namespace="serve"), no_restart=True
        )
        killed_at = len(served)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            now = _server_replicas()
            if len(now) == 2 and victim not in now:  # replaced, and the new one runs
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"the killed replica was not replaced: {_server_replicas()}")
        replacement = (set(now) - set(before)).pop()
        deadline = time.monotonic() + 60
        while replacement not in served[killed_at:] and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        worker.join()
    assert not failures, failures[:3]
    assert victim not in served[killed_at + 1 :]
    assert replacement in served[killed_at:]


def test_the_config_file_builder(tmp_path: Any) -> None:
    config = yaml.safe_load(
        """
applications:
  - name: lmplex
    import_path: lmplex.ray:app
    route_prefix: /
    args:
      models:
        - model_id: smollm2-135m-instruct
          max_model_len: 2048
      num_replicas: 2
      ray_actor_options: {num_cpus: 2, num_gpus: 0.5}
      tenants:
        - {name: acme, api_key: sk-acme, requests_per_minute: 600}
      tiers: {fast: [smollm2-135m-instruct]}
"""
    )
    args = config["applications"][0]["args"]
    assert isinstance(app(args), serve.Application)
    with pytest.raises(InvalidRequest, match="unknown lmplex.ray:app args \\['replicas'\\]"):
        app({"models": ["m"], "replicas": 2})
    with pytest.raises(InvalidRequest, match="cannot be split over 4 replicas"):
        build_app(["m"], num_replicas=4, tenants=[Tenant("t", requests_per_minute=3)])
    with pytest.raises(InvalidRequest, match="cannot be split over 4 replicas"):  # the most there may be
        build_app(["m"], autoscaling_config={"max_replicas": 4}, tenants=[Tenant("t", requests_per_minute=3)])
    with pytest.raises(InvalidRequest, match="num_replicas or autoscaling_config"):
        build_app(["m"], num_replicas=2, autoscaling_config={"max_replicas": 2})
    # Replicas sharing a SQLite usage store hold each quota whole: nothing to split.
    shared = f"sqlite:{tmp_path / 'usage.sqlite'}"
    tenants = [Tenant("t", requests_per_minute=3)]
    assert isinstance(
        build_app(["m"], num_replicas=4, tenants=tenants, usage_store=shared), serve.Application
    )
    with pytest.raises(InvalidRequest, match="cannot be split over 4 replicas"):
        build_app(["m"], num_replicas=4, tenants=tenants, usage_store="memory")
    redis = "redis://127.0.0.1:6379/0"
    assert isinstance(build_app(["m"], num_replicas=4, tenants=tenants, usage_store=redis), serve.Application)
    with pytest.raises(InvalidRequest, match="usage_store must be"):
        build_app(["m"], usage_store="postgres://db")


class _FakeStream:
    """A replica's reply as the ingress reads it: items in turn, an exception raised where it sits."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __aiter__(self) -> _FakeStream:
        return self

    async def __anext__(self) -> Any:
        if not self.items:
            raise StopAsyncIteration
        item = self.items.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item


class _FakeHandle:
    """A server deployment's handle whose calls answer with the given streams in turn."""

    def __init__(self, streams: list[_FakeStream]) -> None:
        self.streams = streams
        self.handle = self
        self.keys: list[str | None] = []  # each attempt's Idempotency-Key

    def options(self, **_: Any) -> _FakeHandle:
        return self

    def remote(self, *args: Any, affinity: str | None) -> _FakeStream:
        headers = dict(args[3])
        self.keys.append(headers.get("idempotency-key"))
        return self.streams.pop(0)


def _ingress_call(
    streams: list[_FakeStream], handle: _FakeHandle | None = None, path: str = "/v1/chat/completions"
) -> Any:
    from starlette.requests import Request

    from lmplex.ray._replica import Ingress

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "query_string": b"",
        "headers": [],
    }
    ingress = Ingress(handle or _FakeHandle(streams))  # type: ignore[arg-type]
    response: Any = asyncio.run(ingress.__call__(Request(scope, receive)))
    if hasattr(response, "body_iterator"):  # a stream: read it whole, as the client would

        async def read() -> bytes:
            return b"".join([bytes(c) async for c in response.body_iterator])

        response.read = asyncio.run(read())
    return response


def test_ingress_moves_a_reply_whose_replica_died_after_its_head() -> None:
    def head(replica: str, kind: str) -> dict[str, Any]:
        return {"status": 200, "headers": [("content-type", kind)], "replica": replica}

    died = RuntimeError("replica a died")
    json_kind = "application/json"
    # A whole (JSON) reply is read before the client sees any of it, so it moves to another replica.
    response = _ingress_call(
        [_FakeStream([head("a", json_kind), died]), _FakeStream([head("b", json_kind), b'{"ok":', b"true}"])]
    )
    assert (response.status_code, response.body) == (200, b'{"ok":true}')
    assert response.headers["x-lmplex-replica"] == "b"
    # Replicas that keep dying: a 503 in OpenAI's error shape, never a dropped connection.
    response = _ingress_call([_FakeStream([head(r, json_kind), died]) for r in "abc"])
    assert response.status_code == 503 and b"service_unavailable" in response.body
    # A stream (SSE) goes to the client as it comes: it cannot move once started.
    from starlette.responses import StreamingResponse

    response = _ingress_call([_FakeStream([head("a", "text/event-stream; charset=utf-8"), b"data: 1\n\n"])])
    assert isinstance(response, StreamingResponse)
    assert getattr(response, "read") == b"data: 1\n\n"  # noqa: B009 - set by _ingress_call


def test_a_retry_carries_the_calls_key_and_waits_out_a_dead_replicas_claim() -> None:
    def head(replica: str, status: int = 200) -> dict[str, Any]:
        return {"status": status, "headers": [("content-type", "application/json")], "replica": replica}

    in_progress = json.dumps({"error": {"code": "request_in_progress"}}).encode()
    handle = _FakeHandle(
        [
            _FakeStream([head("a"), RuntimeError("replica a died")]),
            _FakeStream([head("b", 409), in_progress]),  # a's claim has not lapsed yet
            _FakeStream([head("b"), b'{"ok":true}']),
        ]
    )
    start = time.monotonic()
    response = _ingress_call([], handle)
    assert (response.status_code, response.body) == (200, b'{"ok":true}')
    assert time.monotonic() - start >= 1.0, "waited before asking again"
    assert len(handle.keys) == 3 and handle.keys[0] and len(set(handle.keys)) == 1, handle.keys
    # A replica shutting down ran nothing: its 503 `draining` moves the call on.
    draining = json.dumps({"type": "error", "error": {"type": "overloaded_error"}}).encode()  # Anthropic's
    drained = {
        **head("a", 503),
        "headers": [("content-type", "application/json"), ("x-lmplex-error-code", "draining")],
    }
    handle = _FakeHandle([_FakeStream([drained, draining]), _FakeStream([head("b"), b"{}"])])
    response = _ingress_call([], handle)
    assert response.status_code == 200 and response.headers["x-lmplex-replica"] == "b"
    # A 409 on the first attempt is the caller's own key in use elsewhere: answered as it is.
    handle = _FakeHandle([_FakeStream([head("a", 409), in_progress])])
    assert _ingress_call([], handle).status_code == 409


def test_a_stream_cut_by_its_replica_ends_with_an_error_event() -> None:
    sse = {"status": 200, "headers": [("content-type", "text/event-stream")], "replica": "a"}
    died = RuntimeError("replica a died")
    # The whole events come through; the half event is dropped; the error event ends the stream.
    response = _ingress_call([_FakeStream([sse, b"data: 1\n\ndata: 2\n\nda", b"ta: 3", died])])
    assert response.read.startswith(b"data: 1\n\ndata: 2\n\ndata: {")
    events = [e for e in response.read.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "replica_lost" and "retry" in error["message"]
    for path, kind in (("/v1/messages", "overloaded_error"), ("/v1/responses", "replica_lost")):
        event, data = cut_event(path).decode().strip().split("\n")
        assert event == "event: error" and kind in data
    # The Responses API's events are numbered: the error event goes on from the last one sent.
    numbered = b'event: response.output_text.delta\ndata: {"sequence_number":7}\n\n'
    response = _ingress_call([_FakeStream([sse, numbered, died])], path="/v1/responses")
    last = response.read.decode().strip().split("\n\n")[-1]
    assert json.loads(last.split("data: ", 1)[1])["sequence_number"] == 8


def test_metrics_of_replicas_merge_into_one_family_each() -> None:
    from lmplex.ray._metrics import MetricsHub, merge

    def text(running: int, done: int) -> str:
        return (
            "# HELP lmplex_requests Finished requests by outcome.\n"
            "# TYPE lmplex_requests counter\n"
            f'lmplex_requests_total{{model="m",outcome="stop"}} {done}\n'
            "# HELP lmplex_num_requests_running Requests in the running batch.\n"
            "# TYPE lmplex_num_requests_running gauge\n"
            f'lmplex_num_requests_running{{model="m"}} {running}\n'
            "# EOF\n"
        )

    hub = MetricsHub()
    hub.report("a", text(1, 5))
    hub.report("b", text(2, 7))
    merged = merge(hub.texts()).decode()
    assert merged.count("# TYPE lmplex_requests counter") == 1
    assert 'lmplex_requests_total{model="m",outcome="stop",replica="a"} 5.0' in merged
    assert 'lmplex_requests_total{model="m",outcome="stop",replica="b"} 7.0' in merged
    assert 'lmplex_num_requests_running{model="m",replica="b"} 2.0' in merged
    assert merged.endswith("# EOF\n")
    hub._texts["a"] = (time.monotonic() - 60, text(1, 5))  # not heard from for a minute: dropped
    assert set(hub.texts()) == {"b"}

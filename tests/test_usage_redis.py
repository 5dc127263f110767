"""Tenants' usage in Redis (``usage_store = "redis://..."``), shared by servers that may run on any
machine, with real ``lmplex serve`` processes on SmolLM2 and a real ``redis-server`` (``redis_util``):

* two servers on one Redis admit exactly a tenant's ``requests_per_minute`` under 24 concurrent calls;
* a server killed mid-stream holds its tenant's only concurrency slot until its lease passes, then the
  other server admits again, and the cut call is charged its reservation once;
* Redis stopped mid-load: calls get a 503 with ``Retry-After`` (fail closed), ``/ready`` says the store
  is unavailable, and both recover by themselves when Redis is back;
* with ``usage_store_fail_open``, calls pass unmetered while Redis is down (counted in ``/metrics``,
  logged once), and are metered again once it is back;
* ``lmplex usage --store redis://...`` reads what the servers' ``/v1/usage`` say;
* a response stored through one server is read, continued and deleted through the other.
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from redis_util import RedisServer
from server_util import CUT_TOKENS, Server, chat_as, cut_stream_body, usage_as

KEY = "sk-usage-redis-0123456789"
PRICES = {"price_per_million_input_tokens": 1e6, "price_per_million_output_tokens": 2e6}  # 1 and 2 a token
CHAT = [{"role": "user", "content": "Count from one to fifty."}]


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    r = RedisServer(tmp_path)
    yield r
    r.stop()


def _servers(
    tmp: Path, path: str, n: int, store: str, fail_open: bool = False, **tenant: object
) -> list[Server]:
    models: list[dict[str, object]] = [
        {"model_id": path, "served_model_name": "small", "max_model_len": 4096, **PRICES}
    ]
    tenants = [{"name": "a", "api_key": KEY, "quota_window_s": 600.0, **tenant}]
    out = []
    for i in range(n):
        folder = tmp / f"s{i}"
        folder.mkdir()
        out.append(
            Server(
                folder,
                models,
                tenants=tenants,
                usage_store=store,
                usage_lease_s=1.0,
                usage_store_fail_open=fail_open,
            )
        )
    for s in out:
        s.wait_ready()
    return out


def _chat(url: str, max_tokens: int) -> httpx.Response:
    return chat_as(url, KEY, CHAT, max_tokens)


def _usage(url: str) -> dict[str, Any]:
    return usage_as(url, KEY)


def test_two_servers_on_one_redis_admit_exactly_the_quota(
    tmp_path: Path, smollm2_path: str, redis: RedisServer
) -> None:
    servers = _servers(tmp_path, smollm2_path, 2, redis.url, requests_per_minute=10)
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        codes = list(pool.map(lambda i: _chat(servers[i % 2].url, 2).status_code, range(24)))
    assert codes.count(200) == 10 and codes.count(429) == 14, codes
    assert [_usage(s.url)["requests"] for s in servers] == [10, 10]
    assert httpx.get(f"{servers[0].url}/ready").json()["usage_store"] == "redis"
    # `lmplex usage` reads the same Redis, from outside any server.
    cmd = [sys.executable, "-m", "lmplex", "usage", "--store", redis.url, "--json"]
    (row,) = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    now = _usage(servers[1].url)
    assert row["tenant"] == "a" and row["requests"] == 10
    for k in ("prompt_tokens", "completion_tokens", "cost", "cost_today", "in_flight"):
        assert row[k] == pytest.approx(now[k]), k
    for s in servers:
        assert s.stop() == 0


def test_a_killed_server_frees_its_slot_at_lease_expiry(
    tmp_path: Path, smollm2_path: str, redis: RedisServer
) -> None:
    dying, other = _servers(tmp_path, smollm2_path, 2, redis.url, max_concurrency=1)
    first = _chat(other.url, 1).json()["usage"]
    prompt = first["prompt_tokens"]
    body = cut_stream_body(CHAT)
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream(
        "POST", f"{dying.url}/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as r:
        lines = r.iter_lines()
        for _ in range(5):
            next(lines)
        refused = _chat(other.url, 1)  # the tenant's one slot is taken on the other server
        assert refused.status_code == 429 and "max_concurrency" in refused.text
        dying.proc.send_signal(signal.SIGKILL)
        dying.proc.wait(10)
    deadline = time.monotonic() + 10
    while (r2 := _chat(other.url, 1)).status_code == 429 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert r2.status_code == 200, r2.text
    u = _usage(other.url)
    spent = sum(x["prompt_tokens"] + 2 * x["completion_tokens"] for x in (first, r2.json()["usage"]))
    assert u["requests"] == 3 and u["in_flight"] == 0
    assert u["cost"] == pytest.approx(
        spent + prompt + 2 * CUT_TOKENS
    )  # the cut call at its reservation, once
    assert other.stop() == 0


def test_redis_down_is_a_503_and_the_server_recovers(
    tmp_path: Path, smollm2_path: str, redis: RedisServer
) -> None:
    (s,) = _servers(tmp_path, smollm2_path, 1, redis.url)
    assert _chat(s.url, 2).status_code == 200
    redis.stop()
    t0 = time.monotonic()
    down = _chat(s.url, 2)
    assert down.status_code == 503 and down.headers["retry-after"] == "1", down.text
    assert "usage store" in down.json()["error"]["message"] and time.monotonic() - t0 < 10
    ready = httpx.get(f"{s.url}/ready")
    assert ready.status_code == 503 and ready.json()["status"] == "usage store unavailable"
    assert httpx.get(f"{s.url}/health").status_code == 200
    redis.start()
    deadline = time.monotonic() + 10
    while (up := _chat(s.url, 2)).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert up.status_code == 200, up.text
    assert httpx.get(f"{s.url}/ready").status_code == 200
    assert s.stop() == 0


def _unmetered(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("lmplex_usage_unmetered_requests_total "):
            return float(line.split()[1])
    raise AssertionError("no lmplex_usage_unmetered_requests_total")


def test_fail_open_passes_calls_unmetered_while_redis_is_down(
    tmp_path: Path, smollm2_path: str, redis: RedisServer
) -> None:
    (s,) = _servers(tmp_path, smollm2_path, 1, redis.url, fail_open=True, requests_per_minute=3)
    assert [_chat(s.url, 2).status_code for _ in range(2)] == [200, 200]
    redis.stop()
    # Past the quota (3) and no 503: each passes unmetered, counted, logged once.
    assert [_chat(s.url, 2).status_code for _ in range(4)] == [200] * 4
    assert _unmetered(s.url) == 4
    ready = httpx.get(f"{s.url}/ready")
    assert ready.status_code == 200 and ready.json()["unmetered"] is True
    assert ready.json()["usage_store"] == "redis" and "usage store" in ready.json()["usage_store_error"]
    assert sum("pass unmetered" in line for line in s.log) == 1, s.log
    redis.start()  # no persistence: it comes back empty, and metering starts afresh
    codes = [_chat(s.url, 2).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429], codes
    assert _unmetered(s.url) == 4 and _usage(s.url)["requests"] == 3
    assert "unmetered" not in httpx.get(f"{s.url}/ready").json()
    assert s.stop() == 0


def test_servers_on_one_redis_share_stored_responses(
    tmp_path: Path, smollm2_path: str, redis: RedisServer
) -> None:
    one, two = _servers(tmp_path, smollm2_path, 2, redis.url)
    client_one, client_two = (
        openai.OpenAI(base_url=f"{s.url}/v1", api_key=KEY, max_retries=0) for s in (one, two)
    )
    first = client_one.responses.create(model="small", input="Say hi.", max_output_tokens=4, temperature=0)
    assert client_two.responses.retrieve(first.id).output_text == first.output_text
    follow = client_two.responses.create(
        model="small", input="Again.", previous_response_id=first.id, max_output_tokens=4
    )
    assert follow.previous_response_id == first.id
    client_two.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client_one.responses.retrieve(first.id)
    for s in (one, two):
        assert s.stop() == 0

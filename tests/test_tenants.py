"""Tenants through the real ``openai`` client against ``lmplex serve``: API keys (401/200), a model a
tenant may not use (404), quotas exhausted then recovered (429 with OpenAI's headers), concurrency
never above ``max_concurrency``, the daily cost ceiling, ``/v1/usage`` and per-tenant metrics."""

from __future__ import annotations

import concurrent.futures
import hashlib
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from server_util import Server

KEYS = {"acme": "sk-acme-1", "tiny": "sk-tiny-2", "pricey": "sk-pricey-3", "busy": "sk-busy-4"}
WINDOW_S = 1.5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_path: str) -> Iterator[Server]:
    tenants: list[dict[str, object]] = [
        # The key as its SHA-256, as an operator should write it.
        {"name": "acme", "api_key_sha256": hashlib.sha256(KEYS["acme"].encode()).hexdigest(), "weight": 2},
        {
            "name": "tiny",
            "api_key": KEYS["tiny"],
            "models": ["small"],
            "requests_per_minute": 2,
            "tokens_per_minute": 400,
            "quota_window_s": WINDOW_S,
        },
        {"name": "pricey", "api_key": KEYS["pricey"], "max_cost_per_day": 0.0005},
        {"name": "busy", "api_key": KEYS["busy"], "max_concurrency": 2},
    ]
    models: list[dict[str, object]] = [
        {
            "model_id": smollm2_path,
            "served_model_name": "small",
            "max_model_len": 1024,
            "max_model_concurrency": 8,
            # 1 per input token and 10 per output token, per million.
            "price_per_million_input_tokens": 1.0,
            "price_per_million_output_tokens": 10.0,
        },
        {"model_id": smollm2_path, "served_model_name": "other", "max_model_len": 512},
    ]
    s = Server(
        tmp_path_factory.mktemp("tenants"),
        models,
        log_args=["--api-key", "sk-plain"],
        tenants=tenants,
        metrics_api_key="sk-prom",
    )
    s.wait_ready()
    yield s
    assert s.stop() == 0


def _client(server: Server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def _ask(c: openai.OpenAI, model: str = "small", max_tokens: int = 4) -> str:
    r = c.completions.create(
        model=model, prompt="The capital of France is", temperature=0, max_tokens=max_tokens
    )
    return r.choices[0].text


def test_keys_authenticate_and_a_wrong_or_missing_key_is_401(server: Server) -> None:
    for key in ("wrong", "sk-acme-1x"):
        with pytest.raises(openai.AuthenticationError) as e:
            _ask(_client(server, key))
        assert e.value.code == "invalid_api_key"
    r = httpx.post(f"{server.url}/v1/completions", json={"model": "small", "prompt": "hi"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert "sk-" not in r.text
    # The tenant's key and a plain --api-key both work; /health and /ready stay open.
    assert _ask(_client(server, KEYS["acme"])) == _ask(_client(server, "sk-plain"))
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/ready").status_code == 200
    # No key ever reaches the log.
    assert not any(k in line for line in server.log for k in [*KEYS.values(), "sk-plain", "sk-prom"])


def test_a_model_the_tenant_may_not_use_does_not_exist_for_it(server: Server) -> None:
    tiny = _client(server, KEYS["tiny"])
    with pytest.raises(openai.NotFoundError) as e:
        _ask(tiny, model="other")
    assert e.value.code == "model_not_found"
    assert [m.id for m in tiny.models.list()] == ["small"]
    assert sorted(m.id for m in _client(server, KEYS["acme"]).models.list()) == ["other", "small"]


def test_quota_exhaustion_is_429_with_headers_then_recovers(server: Server) -> None:
    tiny = _client(server, KEYS["tiny"])
    time.sleep(WINDOW_S)  # a fresh window
    prompt = "The capital of France is"
    ok = tiny.completions.with_raw_response.create(model="small", prompt=prompt, temperature=0, max_tokens=4)
    assert ok.headers["x-ratelimit-limit-requests"] == "2"
    assert ok.headers["x-ratelimit-remaining-requests"] == "1"
    assert ok.headers["x-ratelimit-limit-tokens"] == "400"
    assert re.fullmatch(r"\d+(\.\d+)?(ms|s)", ok.headers["x-ratelimit-reset-requests"])
    _ask(tiny)
    with pytest.raises(openai.RateLimitError) as e:
        _ask(tiny)
    assert e.value.code == "rate_limit_exceeded"
    h = e.value.response.headers
    assert h["x-ratelimit-remaining-requests"] == "0" and 1 <= int(h["retry-after"]) <= 2
    time.sleep(WINDOW_S)
    assert _ask(tiny)  # recovered
    # A request no window can hold is a 400, not a 429 to retry forever.
    with pytest.raises(openai.BadRequestError, match="tokens"):
        _ask(tiny, max_tokens=500)


def test_tokens_are_reserved_at_admission_and_the_unused_part_returned(server: Server) -> None:
    time.sleep(WINDOW_S)
    tiny = _client(server, KEYS["tiny"])
    r = tiny.completions.with_raw_response.create(
        model="small", prompt="The capital of France is", temperature=0, max_tokens=300, stop=[" "]
    )
    out = r.parse()
    assert out.usage is not None
    used = out.usage.total_tokens
    assert used < 50, "stopped at the first space"
    # At admission prompt + 300 tokens were reserved; at the end only the used ones stay counted.
    assert int(r.headers["x-ratelimit-remaining-tokens"]) == 400 - used


def test_concurrency_never_exceeds_max_concurrency(server: Server) -> None:
    busy = _client(server, KEYS["busy"])
    in_flight, peak, lock = 0, 0, threading.Lock()

    def one(i: int) -> str:
        nonlocal in_flight, peak
        try:
            stream = busy.completions.create(
                model="small", prompt="Count:", max_tokens=40, stream=True, extra_body={"ignore_eos": True}
            )
        except openai.RateLimitError as e:
            assert e.code == "rate_limit_exceeded"
            return "429"
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        for _ in stream:
            pass
        with lock:
            in_flight -= 1
        return "200"

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(one, range(8)))
    usage = httpx.get(f"{server.url}/v1/usage", headers={"Authorization": f"Bearer {KEYS['busy']}"}).json()
    assert peak <= 2 and outcomes.count("200") >= 2 and "429" in outcomes, outcomes
    assert usage["in_flight"] == 0 and usage["requests"] == outcomes.count("200")
    # Sequential calls never trip over their own previous call.
    for _ in range(4):
        _ask(busy)


def test_daily_cost_ceiling_is_insufficient_quota(server: Server) -> None:
    pricey = _client(server, KEYS["pricey"])
    # Worst case 1 + 40 * 10 = ~400 per million: 0.0004 fits 0.0005 once, not twice at once.
    r = pricey.completions.create(
        model="small", prompt="Hi", temperature=0, max_tokens=40, extra_body={"ignore_eos": True}
    )
    assert r.usage is not None and r.usage.completion_tokens == 40
    with pytest.raises(openai.RateLimitError) as e:
        pricey.completions.create(model="small", prompt="Hi", max_tokens=40)
    assert e.value.code == "insufficient_quota"
    usage = httpx.get(f"{server.url}/v1/usage", headers={"Authorization": f"Bearer {KEYS['pricey']}"}).json()
    assert usage["cost"] == pytest.approx((r.usage.prompt_tokens * 1.0 + 40 * 10.0) / 1e6, rel=1e-6)
    assert usage["limits"]["max_cost_per_day"] == 0.0005


def test_usage_and_metrics_per_tenant(server: Server) -> None:
    acme = {"Authorization": f"Bearer {KEYS['acme']}"}
    before = httpx.get(f"{server.url}/v1/usage", headers=acme).json()
    _ask(_client(server, KEYS["acme"]))
    after = httpx.get(f"{server.url}/v1/usage", headers=acme).json()
    assert after["tenant"] == "acme" and after["requests"] == before["requests"] + 1
    assert after["completion_tokens"] == before["completion_tokens"] + 4
    assert httpx.get(f"{server.url}/v1/usage").status_code == 401
    assert httpx.get(f"{server.url}/metrics").status_code == 401
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": "Bearer sk-prom"}).text

    def value(pattern: str) -> float:
        return sum(float(v) for v in re.findall(pattern + r" (\S+)$", text, re.MULTILINE))

    assert value(r'^lmplex_requests_total\{model="small",tenant="acme",outcome="length"\}') >= 2
    assert value(r'^lmplex_requests_total\{model="",tenant="",outcome="401"\}') >= 3
    assert value(r'^lmplex_requests_total\{model="small",tenant="tiny",outcome="429"\}') >= 1
    assert value(r'^lmplex_generation_tokens_total\{model="small",tenant="acme"\}') >= 8
    assert value(r'^lmplex_request_queue_time_seconds_count\{model="small",tenant="acme"\}') >= 2
    assert value(r'^lmplex_time_to_first_token_seconds_count\{model="small",tenant="busy"\}') >= 2
    assert 400 / 1e6 < value(r'^lmplex_cost_total\{model="small",tenant="pricey"\}') < 450 / 1e6


def test_bad_tenant_configs_refuse_to_start(tmp_path: Path, smollm2_path: str) -> None:
    model: list[dict[str, object]] = [{"model_id": smollm2_path}]
    cases: list[tuple[list[dict[str, object]], str]] = [
        ([{"name": "a", "requests_per_minute": -1}], "line"),
        ([{"name": "a", "api_key": "k"}, {"name": "b", "api_key": "k"}], "same API key"),
        ([{"name": "a"}, {"name": "a"}], "two tenants are named 'a'"),
        ([{"name": "a", "wieght": 2}], "wieght"),
        ([{"name": "a", "models": ["nope"]}], "'nope', which is not served"),
    ]
    for tenants, message in cases:
        s = Server(tmp_path, model, tenants=tenants)
        assert s.proc.wait(60) == 2
        assert message in "".join(s.log), "".join(s.log)

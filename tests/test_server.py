"""``lmplex serve`` with two models (SmolLM2-135M and Qwen2.5-Coder-0.5B) against the real ``openai``
client: sync, async and streaming calls match the in-process engine token for token, bad requests get
OpenAI error bodies and 4xx while the server keeps serving, a 200-request load ends with no error and
every KV pool free, structured output (``response_format``, pydantic ``parse``, vLLM's guided fields)
validates against its schema, metrics count it all, SIGTERM drains, and a model over the memory budget is
refused with the numbers."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest
from conftest import fetched_model
from openai.types.chat import ChatCompletionMessageParam
from server_util import Server

import lmplex
from lmplex import ModelConfig, SamplingParams

QWEN = "qwen2.5-coder-0.5b-instruct"
HELLO = [{"role": "user", "content": "Say hello in five words."}]
HELLO_API: list[ChatCompletionMessageParam] = [{"role": "user", "content": HELLO[0]["content"]}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_path: str) -> Iterator[Server]:
    qwen = fetched_model(QWEN)
    models: list[dict[str, object]] = [
        {"model_id": smollm2_path, "name": "smollm2", "max_model_len": 1024},
        {"model_id": qwen, "name": "qwen", "max_model_len": 512, "max_model_concurrency": 8},
    ]
    srv = Server(tmp_path_factory.mktemp("serve"), models)
    srv.wait_ready()
    yield srv
    assert srv.stop() == 0, "".join(srv.log)


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def qwen_engine() -> lmplex.Engine:
    return lmplex.Engine(ModelConfig(fetched_model(QWEN), max_model_len=512))


def test_models_lists_both(client: openai.OpenAI) -> None:
    assert sorted(m.id for m in client.models.list()) == ["qwen", "smollm2"]


def test_chat_and_completions_match_the_engine(
    client: openai.OpenAI, engine: lmplex.Engine, qwen_engine: lmplex.Engine
) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    for name, local in [("smollm2", engine), ("qwen", qwen_engine)]:
        chat = client.chat.completions.create(model=name, messages=HELLO_API, temperature=0, max_tokens=10)
        want = local.generate([HELLO], greedy)[0]
        assert chat.choices[0].message.content == want.text
        assert chat.choices[0].finish_reason == want.finish_reason
        assert chat.usage is not None and chat.usage.completion_tokens == len(want.token_ids)
        assert chat.usage.prompt_tokens == want.usage.prompt_tokens
        comp = client.completions.create(model=name, prompt="def add(a, b):", temperature=0, max_tokens=10)
        assert comp.choices[0].text == local.generate("def add(a, b):", greedy)[0].text


def test_streaming_concatenates_to_the_whole_reply(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="smollm2", messages=HELLO_API, temperature=0, max_tokens=12)
    stream = client.chat.completions.create(
        model="smollm2",
        messages=HELLO_API,
        temperature=0,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    # Completions stream too, with logprobs that match the whole reply's.
    kw: dict[str, object] = {
        "model": "qwen",
        "prompt": "x =",
        "temperature": 0,
        "max_tokens": 6,
        "logprobs": 2,
    }
    comp = client.completions.create(**kw)  # type: ignore[call-overload]
    parts = list(client.completions.create(stream=True, **kw))  # type: ignore[call-overload]
    assert "".join(p.choices[0].text for p in parts) == comp.choices[0].text
    streamed = [lp for p in parts for lp in p.choices[0].logprobs.token_logprobs]
    assert streamed == comp.choices[0].logprobs.token_logprobs and len(streamed) == 6


def test_async_client_serves_both_models_at_once(client: openai.OpenAI, server: Server) -> None:
    names = ["smollm2", "qwen", "smollm2", "qwen"]
    sync = [
        client.completions.create(model=n, prompt=f"Item {i}:", temperature=0, max_tokens=6).choices[0].text
        for i, n in enumerate(names)
    ]

    async def run() -> list[str]:
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        outs = await asyncio.gather(
            *[
                aclient.completions.create(model=n, prompt=f"Item {i}:", temperature=0, max_tokens=6)
                for i, n in enumerate(names)
            ]
        )
        await aclient.close()
        return [o.choices[0].text for o in outs]

    assert asyncio.run(run()) == sync


def test_n_samples_are_seed_plus_index_and_count_the_prompt_once(
    client: openai.OpenAI, qwen_engine: lmplex.Engine
) -> None:
    r = client.chat.completions.create(
        model="qwen", messages=HELLO_API, n=3, temperature=1.0, seed=5, max_tokens=8
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    want = [
        qwen_engine.chat(HELLO, SamplingParams(temperature=1.0, seed=5 + i, max_tokens=8)) for i in range(3)
    ]
    assert [c.message.content for c in r.choices] == [w.text for w in want]
    assert r.usage is not None and r.usage.prompt_tokens == want[0].usage.prompt_tokens
    assert r.usage.completion_tokens == sum(len(w.token_ids) for w in want)
    # Streamed, each index concatenates to its whole sample; the usage chunk counts the prompt once.
    stream = client.chat.completions.create(
        model="qwen",
        messages=HELLO_API,
        n=3,
        temperature=1.0,
        seed=5,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts = ["", "", ""]
    last_usage = None
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
        last_usage = chunk.usage or last_usage
    assert texts == [w.text for w in want]
    assert last_usage is not None and last_usage.prompt_tokens == want[0].usage.prompt_tokens
    # Several prompts: choice k is sample k % n of prompt k // n.
    comp = client.completions.create(model="qwen", prompt=["a", "b"], n=2, temperature=0, max_tokens=3)
    assert [c.index for c in comp.choices] == [0, 1, 2, 3]
    assert comp.choices[0].text == comp.choices[1].text  # greedy: both samples agree
    with pytest.raises(openai.BadRequestError, match="between 1 and 128"):
        client.completions.create(model="qwen", prompt="a", n=0)


def _error(resp: httpx.Response, status: int) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    return str(body["message"])


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(
    server: Server, client: openai.OpenAI
) -> None:
    url = f"{server.url}/v1"
    assert "not valid JSON" in _error(httpx.post(f"{url}/completions", content=b"{bad json"), 400)
    assert "does not exist" in _error(
        httpx.post(f"{url}/completions", json={"model": "x", "prompt": "a"}), 404
    )
    neg = {"model": "qwen", "prompt": "a", "max_tokens": -3}
    assert "at least 1" in _error(httpx.post(f"{url}/completions", json=neg), 400)
    long = {"model": "qwen", "prompt": "word " * 600}
    assert "max_model_len" in _error(httpx.post(f"{url}/completions", json=long), 400)
    wrong = {"model": "smollm2", "messages": "hi"}
    assert "invalid request body" in _error(httpx.post(f"{url}/chat/completions", json=wrong), 400)
    temp = {"model": "smollm2", "prompt": "a", "temperature": "hot"}
    _error(httpx.post(f"{url}/completions", json=temp), 400)
    no_text = {"model": "smollm2", "messages": [{"role": "user", "content": [{"type": "text"}]}]}
    assert "needs its `text` field" in _error(httpx.post(f"{url}/chat/completions", json=no_text), 400)
    image = {"model": "smollm2", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}
    assert "needs its `image_url` field" in _error(httpx.post(f"{url}/chat/completions", json=image), 400)
    png = "data:image/png;base64,iVBORw0KGgo="
    image = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": png}}]}],
    }
    assert "is a text model: it takes no images" in _error(
        httpx.post(f"{url}/chat/completions", json=image), 400
    )
    audio = {"model": "smollm2", "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}
    assert "'input_audio' is not supported" in _error(httpx.post(f"{url}/chat/completions", json=audio), 400)
    schema = {"model": "smollm2", "messages": HELLO, "response_format": {"type": "json_schema"}}
    assert "response_format" in _error(httpx.post(f"{url}/chat/completions", json=schema), 400)
    _error(httpx.get(f"{server.url}/v2/nothing"), 404)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="missing", prompt="a")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="qwen", prompt="a", max_tokens=-1)
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    assert client.completions.create(model="qwen", prompt="a", max_tokens=2).choices[0].text


class Book(pydantic.BaseModel):
    title: str = pydantic.Field(max_length=40)
    year: int = pydantic.Field(ge=1400, le=2030)
    genres: list[Literal["fiction", "history", "science", "poetry"]] = pydantic.Field(
        min_length=1, max_length=2
    )


BOOK_SCHEMA: dict[str, object] = {
    "type": "object",
    # Bounded, so a draw at temperature 1 cannot spend the tokens on one long number.
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "pages": {"type": "integer", "minimum": 1, "maximum": 5000},
    },
    "required": ["title", "pages"],
    "additionalProperties": False,
}


def test_structured_output_through_the_openai_client(client: openai.OpenAI, server: Server) -> None:
    ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Recommend a book, as JSON."}]
    for name in ["smollm2", "qwen"]:
        # The client's own pydantic path: it sends a strict json_schema and parses the reply.
        parsed = client.chat.completions.parse(
            model=name, messages=ask, response_format=Book, temperature=0.7, seed=1, max_tokens=120
        )
        assert isinstance(parsed.choices[0].message.parsed, Book), parsed.choices[0].message.content
        for seed in range(2):
            r = client.chat.completions.create(
                model=name,
                messages=ask,
                temperature=1.0,
                seed=seed,
                max_tokens=120,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "book", "schema": BOOK_SCHEMA},
                },
            )
            assert r.choices[0].finish_reason == "stop", (name, seed, r.choices[0].message.content)
            jsonschema.validate(json.loads(r.choices[0].message.content or ""), BOOK_SCHEMA)
    # Free-form JSON is unbounded: SmolLM2-135M tends to write one endless key; Qwen answers briefly.
    short: list[ChatCompletionMessageParam] = [{"role": "user", "content": 'Reply with {"ok": true}.'}]
    obj = client.chat.completions.create(
        model="qwen", messages=short, temperature=0, max_tokens=120, response_format={"type": "json_object"}
    )
    assert obj.choices[0].finish_reason == "stop", obj.choices[0].message.content
    assert isinstance(json.loads(obj.choices[0].message.content or ""), dict)
    # vLLM's extras, streamed and on completions.
    stream = client.chat.completions.create(
        model="qwen",
        messages=[{"role": "user", "content": "Is water wet?"}],
        max_tokens=10,
        stream=True,
        extra_body={"guided_choice": ["certainly yes", "certainly not"]},
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) in (
        "certainly yes",
        "certainly not",
    )
    comp = client.completions.create(
        model="smollm2",
        prompt="The date today is",
        max_tokens=20,
        extra_body={"structured_outputs": {"regex": r" 20[0-9]{2}-[01][0-9]-[0-3][0-9]"}},
    )
    assert re.fullmatch(r" 20[0-9]{2}-[01][0-9]-[0-3][0-9]", comp.choices[0].text), comp.choices[0].text
    url = f"{server.url}/v1/chat/completions"
    bad = {
        "model": "qwen",
        "messages": HELLO,
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "x",
                "schema": {"type": "object", "properties": {"a": {"type": "bogus"}}},
            },
        },
    }
    assert "structured output" in _error(httpx.post(url, json=bad), 400)
    two = {
        "model": "qwen",
        "messages": HELLO,
        "guided_regex": "a",
        "response_format": {"type": "json_object"},
    }
    assert "only one output constraint" in _error(httpx.post(url, json=two), 400)


def _metric(text: str, name: str, model: str) -> float:
    m = re.search(rf'^{name}\{{model="{model}"[^}}]*\}} (\S+)$', text, re.MULTILINE)
    assert m, f"{name} for {model} not in /metrics"
    return float(m.group(1))


def _outcomes(text: str, errors: bool) -> float:
    """Sum of ``lmplex_requests_total`` for the two models: error outcomes (4xx/5xx) or finished ones."""
    pattern = r'^lmplex_requests_total\{model="(?:qwen|smollm2)",tenant="[^"]*",outcome="([^"]+)"\} (\S+)$'
    return sum(float(v) for o, v in re.findall(pattern, text, re.MULTILINE) if o[0].isdigit() == errors)


def test_load_of_200_requests_ends_with_no_error_and_free_pools(server: Server) -> None:
    before = httpx.get(f"{server.url}/metrics").text

    async def run() -> list[int]:
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        gate = asyncio.Semaphore(32)

        async def one(i: int) -> int:
            async with gate:
                out = await aclient.completions.create(
                    model="smollm2" if i % 2 else "qwen", prompt=f"Request {i} says", max_tokens=4, seed=i
                )
                return out.usage.completion_tokens if out.usage else 0

        try:
            return await asyncio.gather(*[one(i) for i in range(200)])
        finally:
            await aclient.close()

    tokens = asyncio.run(run())
    assert len(tokens) == 200 and all(1 <= t <= 4 for t in tokens)
    deadline = time.monotonic() + 10
    while True:
        text = httpx.get(f"{server.url}/metrics").text
        usage = [_metric(text, "lmplex_kv_cache_usage_ratio", m) for m in ("qwen", "smollm2")]
        if usage == [0.0, 0.0] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert usage == [0.0, 0.0], "a KV pool still holds blocks"
    for m in ("qwen", "smollm2"):
        assert _metric(text, "lmplex_num_requests_running", m) == 0
        assert _metric(text, "lmplex_time_to_first_token_seconds_count", m) >= 100
        assert _metric(text, "lmplex_generation_tokens_total", m) >= 100
    assert _outcomes(text, errors=True) == _outcomes(before, errors=True)
    assert _outcomes(text, errors=False) == _outcomes(before, errors=False) + 200
    # Memory by model and category, and the CPU's budget and what the two plans reserve of it.
    rows = re.findall(
        r'^lmplex_model_memory_bytes\{model="(\w+)",category="(\w+)"\} (\d+)$', text, re.MULTILINE
    )
    held = {(m, c): int(v) for m, c, v in rows}
    categories = {"weights", "kv_cache", "kv_swap", "workspace", "graphs", "other", "lora_adapters"}
    assert {c for _, c in held} == categories, rows
    assert all(held[(m, "weights")] > 1e7 and held[(m, "workspace")] == 0 for m in ("qwen", "smollm2"))
    found = re.search(r'^lmplex_memory_reserved_bytes\{device="cpu"\} (\S+)$', text, re.MULTILINE)
    assert found, text
    reserved = float(found[1])
    plans = sum(held[(m, c)] for m in ("qwen", "smollm2") for c in ("weights", "kv_cache"))
    assert abs(reserved - plans) < 0.01 * plans, (reserved, plans)  # the plan estimates the weights
    assert re.search(r'^lmplex_memory_budget_bytes\{device="cpu"\} \d+$', text, re.MULTILINE)
    assert all(0 < _metric(text, "lmplex_model_ready_seconds", m) < 60 for m in ("qwen", "smollm2"))


def test_sigterm_drains_in_flight_streams(tmp_path: Path, smollm2_path: str) -> None:
    """Also: with ``--log-format json`` every log line is one JSON object, and each request is logged
    once with its id (the client's ``x-request-id``, echoed in the response)."""
    model = {"model_id": smollm2_path, "name": "s", "max_model_len": 512}
    srv = Server(tmp_path, [model], log_args=["--log-format", "json"])
    srv.wait_ready()
    tagged = httpx.get(f"{srv.url}/v1/models", headers={"x-request-id": "tenant-a-42"})
    assert tagged.headers["x-request-id"] == "tenant-a-42"
    assert httpx.get(f"{srv.url}/health").headers["x-request-id"].startswith("req-")
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)
    stream = client.completions.create(
        model="s", prompt="Once upon a time", max_tokens=48, stream=True, extra_body={"ignore_eos": True}
    )
    first = next(iter(stream))
    srv.proc.send_signal(15)
    rest = list(stream)
    text = first.choices[0].text + "".join(c.choices[0].text for c in rest)
    assert rest[-1].choices[0].finish_reason == "length" and text
    assert srv.proc.wait(30) == 0
    records = [json.loads(line) for line in srv.log]
    assert any(r["message"] == "draining" for r in records)
    assert any(r["message"].startswith("listening on http://") for r in records)
    requests = [r for r in records if r["message"].startswith("request ") and "tenant-a-42" in r["message"]]
    assert len(requests) == 1 and "status=200" in requests[0]["message"], requests
    assert requests[0]["logger"] == "lmplex_server.trace"


def _rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE).group(1)) * 1024  # type: ignore[union-attr]


def test_keep_alive_unloads_an_idle_model_and_a_request_reloads_it(tmp_path: Path, smollm2_path: str) -> None:
    srv = Server(
        tmp_path, [{"model_id": smollm2_path, "name": "s", "max_model_len": 512, "keep_alive_s": 1.0}]
    )
    srv.wait_ready()
    try:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)

        def ask() -> str:
            r = client.chat.completions.create(model="s", messages=HELLO_API, temperature=0, max_tokens=8)
            return r.choices[0].message.content or ""

        def gauge(name: str) -> float:
            return _metric(httpx.get(f"{srv.url}/metrics").text, name, "s")

        first = ask()
        loaded_rss = _rss(srv.proc.pid)
        assert (gauge("lmplex_model_loaded"), gauge("lmplex_model_loads")) == (1, 1)
        deadline = time.monotonic() + 10
        while gauge("lmplex_model_loaded") == 1:
            assert time.monotonic() < deadline, "not unloaded after 10 s idle"
            time.sleep(0.2)
        assert any("unloaded idle model model=s" in line for line in srv.log), srv.log
        # Its memory goes back to the OS (the engine thread ends, then trims the heap): most of
        # the 98 MB of weights must leave the resident set.
        while _rss(srv.proc.pid) > loaded_rss - 60e6:
            assert time.monotonic() < deadline, f"RSS {loaded_rss} -> {_rss(srv.proc.pid)} after unloading"
            time.sleep(0.2)
        # Still served by name, and ready: the next request reloads it.
        assert httpx.get(f"{srv.url}/ready").status_code == 200
        assert [m.id for m in client.models.list()] == ["s"]
        assert ask() == first
        assert (gauge("lmplex_model_loaded"), gauge("lmplex_model_loads")) == (1, 2)
        assert any("reloaded model model=s seconds=" in line for line in srv.log), srv.log
    finally:
        assert srv.stop() == 0, "".join(srv.log)


def test_a_model_over_the_memory_budget_is_refused_with_numbers(tmp_path: Path, smollm2_path: str) -> None:
    srv = Server(tmp_path, [{"model_id": smollm2_path, "name": "s"}], memory_budget_bytes=50_000_000)
    status = srv.proc.wait(60)
    log = "".join(srv.log)
    assert status == 2, log
    assert re.search(r"model 's' needs [\d.]+ GiB \([\d.]+ GiB weights \+ [\d.]+ GiB KV pool\)", log), log
    assert "0.05 GiB budget" in log


def test_serve_flags_set_each_models_device_and_the_gpu_share(smollm2_path: str) -> None:
    import argparse

    from lmplex import serve

    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    flags = ["serve", smollm2_path, "--device", "cuda:1", "--dtype", "bfloat16", "--enforce-eager"]
    lines = serve.config_toml(parser.parse_args([*flags, "--gpu-memory-utilization", "0.5"])).splitlines()
    assert lines[0] == "gpu_memory_utilization = 0.5" and lines[1] == "[[models]]", lines
    for line in ('device = "cuda:1"', 'dtype = "bfloat16"', "enforce_eager = true"):
        assert line in lines[2:], lines
    plain = serve.config_toml(parser.parse_args(["serve", smollm2_path])).splitlines()
    assert plain[0] == "[[models]]" and 'device = "auto"' in plain, plain

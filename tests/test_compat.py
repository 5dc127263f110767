"""OpenAI compatibility details through the real ``openai`` client against ``lmplex serve`` with one model:
``model`` may be left out, ``GET /v1/models/{id}``, ``stream_options`` only with ``stream``,
``system_fingerprint``, ``usage.prompt_tokens_details.cached_tokens`` from the prefix cache, the
``context_length_exceeded`` code, CORS for the allowed origins only, ``logit_bias`` and ``seed: -1``."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import openai
import pytest
from server_util import Server

import lmplex

ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_path: str) -> Iterator[Server]:
    model = {"model_id": smollm2_path, "served_model_name": "smol", "max_model_len": 256}
    s = Server(tmp_path_factory.mktemp("compat"), [model], allowed_origins=[ORIGIN])
    s.wait_ready()
    yield s
    assert s.stop() == 0


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)


def test_model_may_be_left_out_when_one_model_is_served(server: Server) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.json()["model"] == "smol"
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == "smol"


def test_one_model_by_id_or_404(server: Server) -> None:
    m = _client(server).models.retrieve("smol")
    assert (m.id, m.object, m.owned_by) == ("smol", "model", "lmplex")
    with pytest.raises(openai.NotFoundError) as e:
        _client(server).models.retrieve("nope/with-slash")
    assert e.value.code == "model_not_found"


def test_stream_options_need_stream(server: Server) -> None:
    body = {"model": "smol", "prompt": "Hi", "max_tokens": 2, "stream_options": {"include_usage": True}}
    r = httpx.post(f"{server.url}/v1/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options", r.text


def test_system_fingerprint_and_cached_tokens(server: Server) -> None:
    c = _client(server)
    long = " ".join(["The quick brown fox jumps over the lazy dog."] * 8)
    first = c.completions.create(model="smol", prompt=long, max_tokens=2, temperature=0)
    second = c.completions.create(model="smol", prompt=long, max_tokens=2, temperature=0)
    fp = first.system_fingerprint
    assert fp is not None and fp.startswith("fp_") and len(fp) == 13 and second.system_fingerprint == fp
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens_details is not None and second.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # Every whole block of the prompt but the last token's is found in the cache the second time.
    n = second.usage.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens == (n - 1) // 16 * 16 > 0
    chunks = list(c.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Hi"}], max_tokens=2, stream=True
    ))  # fmt: skip
    assert {ch.system_fingerprint for ch in chunks} == {fp}


def test_an_overlong_prompt_is_context_length_exceeded(server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        _client(server).completions.create(model="smol", prompt="hello " * 400, max_tokens=2)
    assert e.value.code == "context_length_exceeded"
    assert re.search(r"the prompt has \d{3} tokens but max_model_len is 256", str(e.value)), str(e.value)


def test_cors_only_for_the_allowed_origins(server: Server) -> None:
    pre = httpx.options(
        f"{server.url}/v1/chat/completions",
        headers={
            "origin": ORIGIN,
            "access-control-request-method": "POST",
            "access-control-request-headers": "content-type",
        },
    )
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in pre.headers["access-control-allow-methods"]
    r = httpx.get(f"{server.url}/v1/models", headers={"origin": ORIGIN})
    assert r.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.get(f"{server.url}/v1/models", headers={"origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers


def test_logit_bias_and_random_seed(server: Server, engine: lmplex.Engine) -> None:
    c = _client(server)
    forced = c.completions.create(
        model="smol", prompt="Hi", max_tokens=3, temperature=0, logit_bias={"42": 100}
    )
    assert forced.choices[0].text == engine.detokenize([42, 42, 42])
    # A bias of -100 bans the greedy choice.
    greedy = engine.generate("Hi", lmplex.SamplingParams(temperature=0, max_tokens=1))[0]
    plain = c.completions.create(model="smol", prompt="Hi", max_tokens=1, temperature=0)
    assert plain.choices[0].text == greedy.text
    ban = {str(greedy.token_ids[0]): -100}
    banned = c.completions.create(model="smol", prompt="Hi", max_tokens=1, temperature=0, logit_bias=ban)
    assert banned.choices[0].text != greedy.text
    seeded = c.completions.create(model="smol", prompt="Hi", max_tokens=2, seed=-1)
    assert seeded.choices[0].finish_reason in ("stop", "length")
    for bad in (
        {"logit_bias": {"x": 1}},
        {"logit_bias": {"42": 101}},
        {"logit_bias": {"99999999": 1}},
        {"seed": -2},
    ):
        r = httpx.post(
            f"{server.url}/v1/completions", json={"model": "smol", "prompt": "Hi", "max_tokens": 1, **bad}
        )
        assert r.status_code == 400, (bad, r.text)

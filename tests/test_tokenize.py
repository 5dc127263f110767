"""vLLM's ``/tokenize`` and ``/detokenize`` on ``lmplex serve``: the ids are the engine's own (text
with its special tokens, chat messages through the model's template as a chat call renders them),
and bad bodies get OpenAI-style errors."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from server_util import Server

import lmplex

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_path: str) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp("tokenize"),
        [{"model_id": smollm2_path, "name": "smollm2", "max_model_len": 2048}],
    )
    srv.wait_ready()
    yield srv
    assert srv.stop() == 0, "".join(srv.log)


def test_tokenize_text_and_chat_as_the_engine_does(server: Server, engine: lmplex.Engine) -> None:
    text = "The capital of France is"
    r = httpx.post(f"{server.url}/tokenize", json={"model": "smollm2", "prompt": text}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    ids = engine.tokenize(text)
    assert body == {
        "count": len(ids),
        "max_model_len": engine.max_model_len,
        "tokens": ids,
        "token_strs": None,
    }
    # Chat: the template's text, no extra special tokens, with the generation prompt.
    r = httpx.post(f"{server.url}/tokenize", json={"messages": CHAT, "return_token_strs": True}, timeout=30)
    assert r.status_code == 200, r.text
    chat = engine.tokenize(engine.apply_chat_template(CHAT), add_special_tokens=False)
    assert r.json()["tokens"] == chat and r.json()["count"] == len(chat)
    assert "".join(r.json()["token_strs"]) == engine.detokenize(chat, skip_special_tokens=False)
    # The prompt a chat call runs on has exactly these tokens.
    out = engine.generate([CHAT], lmplex.SamplingParams(max_tokens=1, temperature=0))[0]
    assert out.usage.prompt_tokens == len(chat)
    plain = {"messages": CHAT, "add_generation_prompt": False}
    no_gen = httpx.post(f"{server.url}/tokenize", json=plain, timeout=30).json()["tokens"]
    assert no_gen == engine.tokenize(engine.apply_chat_template(CHAT, False), add_special_tokens=False)
    assert len(no_gen) < len(chat)


def test_continue_final_message_ends_inside_the_last_turn(server: Server, engine: lmplex.Engine) -> None:
    turns = [*CHAT, {"role": "assistant", "content": "The capital is"}]
    body = {"messages": turns, "add_generation_prompt": False, "continue_final_message": True}
    r = httpx.post(f"{server.url}/tokenize", json=body, timeout=30)
    assert r.status_code == 200, r.text
    closed = engine.apply_chat_template(turns, False)
    cut = closed[: closed.rindex("The capital is") + len("The capital is")]
    assert len(cut) < len(closed)
    assert r.json()["tokens"] == engine.tokenize(cut, add_special_tokens=False)
    both = httpx.post(f"{server.url}/tokenize", json={**body, "add_generation_prompt": True}, timeout=30)
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"


def test_detokenize_round_trips(server: Server, engine: lmplex.Engine) -> None:
    ids = engine.tokenize("Paris is the capital of France.")
    r = httpx.post(f"{server.url}/detokenize", json={"model": "smollm2", "tokens": ids}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": engine.detokenize(ids, skip_special_tokens=False)}
    assert r.json()["prompt"] == "Paris is the capital of France."


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"prompt": "a", "messages": CHAT}, 400, "messages"),
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"model": "nope", "prompt": "a"}, 404, "model"),
        ("/tokenize", {"model": "lmplex:auto", "prompt": "a"}, 400, "model"),
        ("/detokenize", {"tokens": [1, 10_000_000]}, 400, "tokens"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ],
)
def test_bad_bodies_are_openai_errors(
    server: Server, path: str, body: dict[str, object], status: int, param: str | None
) -> None:
    r = httpx.post(f"{server.url}{path}", json=body, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"], error

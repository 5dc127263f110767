"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` on Qwen2.5-Coder-0.5B-Instruct through the
real ``anthropic`` client, with a tenant's key sent as ``x-api-key``: the oracle is the chat endpoint on
the same conversation (greedy, through the real ``openai`` client with the same key as a bearer), so a
message's text, token counts and tool calls must equal chat's; the client's own stream accumulator
(``messages.stream``, which checks the event sequence) must rebuild the whole message; errors come in
Anthropic's shape, as the client's own exception classes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import openai
import pytest
from server_util import Server

KEY = "sk-messages"
WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TOOL: dict[str, Any] = {"name": "get_weather", "description": "Current weather", "input_schema": WEATHER}
CHAT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather", "parameters": WEATHER},
}
SYSTEM = "You are a terse assistant."
QUESTION = "Name three primary colors."
ASK_WEATHER = "What is the weather in Paris right now?"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, qwen_coder_path: str) -> Iterator[Server]:
    model = {"model_id": qwen_coder_path, "served_model_name": "qwen", "max_model_len": 2048}
    s = Server(tmp_path_factory.mktemp("messages"), [model], tenants=[{"name": "team", "api_key": KEY}])
    s.wait_ready()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def claude(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def oai(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)


GREEDY = {"temperature": 0}  # the client (2.x) sends sampling fields only through extra_body


def _message(claude: Any, **kw: Any) -> Any:
    return claude.messages.create(**{"model": "qwen", "extra_body": GREEDY, **kw})


def _chat(oai: openai.OpenAI, messages: list[Any], **kw: Any) -> Any:
    return oai.chat.completions.create(model="qwen", messages=messages, temperature=0, **kw)


def _prompt(u: Any) -> int:
    """The prompt tokens of an Anthropic ``usage``: those read from the prefix cache, those written
    to it, and the rest (``input_tokens``)."""
    total: int = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
    return total


def test_a_message_is_what_chat_answers(claude: Any, oai: openai.OpenAI) -> None:
    m = _message(claude, system=SYSTEM, messages=[{"role": "user", "content": QUESTION}], max_tokens=24)
    chat = _chat(
        oai, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}], max_tokens=24
    )
    assert m.type == "message" and m.role == "assistant" and m.model == "qwen" and m.id.startswith("msg_")
    [block] = m.content
    assert block.type == "text" and block.text == chat.choices[0].message.content and block.text
    assert (
        _prompt(m.usage) == chat.usage.prompt_tokens and m.usage.output_tokens == chat.usage.completion_tokens
    )
    # The prefix cache, Anthropic's way: the same message again reads what the first one wrote.
    again = _message(claude, system=SYSTEM, messages=[{"role": "user", "content": QUESTION}], max_tokens=1)
    assert again.usage.cache_read_input_tokens > 0
    assert _prompt(again.usage) == chat.usage.prompt_tokens
    finish = chat.choices[0].finish_reason
    assert m.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[finish] and m.stop_sequence is None
    # Text blocks in the system prompt and in a user turn read as the strings they hold.
    blocks = _message(
        claude,
        system=[{"type": "text", "text": SYSTEM}],
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Name three "},
                    {"type": "text", "text": "primary colors."},
                ],
            }
        ],
        max_tokens=24,
    )
    assert blocks.content[0].text == block.text


def test_the_stream_rebuilds_the_message(claude: Any) -> None:
    kw: Any = {
        "model": "qwen",
        "extra_body": GREEDY,
        "max_tokens": 24,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    whole = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as s:
        events: list[Any] = list(s)
        final = s.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds
    deltas = [
        e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
    ]
    assert len(deltas) > 1 and "".join(deltas) == whole.content[0].text, deltas
    assert final.content[0].type == "text" and final.content[0].text == whole.content[0].text, (final, whole)
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    assert _prompt(final.usage) == _prompt(whole.usage)


def test_a_stop_sequence_is_named(claude: Any) -> None:
    first = _message(claude, messages=[{"role": "user", "content": QUESTION}], max_tokens=24).content[0].text
    word = first.split()[1]  # a word the answer holds, not at its very start
    m = _message(
        claude, messages=[{"role": "user", "content": QUESTION}], max_tokens=24, stop_sequences=[word]
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word
    assert m.content[0].text == first[: first.index(word)]


def test_a_tool_use_round_trip_matches_chat(claude: Any, oai: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": ASK_WEATHER}]
    m = _message(claude, messages=ask, tools=[TOOL], tool_choice={"type": "any"}, max_tokens=80)
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert [u.name for u in uses] == ["get_weather"]
    jsonschema.validate(uses[0].input, WEATHER)
    chat = _chat(oai, ask, tools=[CHAT_TOOL], tool_choice="required", max_tokens=80)
    (call,) = chat.choices[0].message.tool_calls
    assert uses[0].input == json.loads(call.function.arguments)
    with claude.messages.stream(
        model="qwen",
        extra_body=GREEDY,
        messages=ask,
        tools=[TOOL],
        tool_choice={"type": "any"},
        max_tokens=80,
    ) as s:
        streamed = s.get_final_message()
    assert [(b.type, getattr(b, "input", None)) for b in streamed.content] == [
        (b.type, getattr(b, "input", None)) for b in m.content
    ]
    # The tool's answer goes back as a tool_result block; the reply is chat's to the same turns.
    args = json.dumps(uses[0].input, separators=(",", ":"))
    result = '{"temperature": 21, "sky": "clear"}'
    turns: Any = [
        *ask,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": uses[0].input}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}]},
    ]
    reply = _message(claude, messages=turns, tools=[TOOL], max_tokens=40)
    chat_turns: Any = [
        *ask,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": result},
    ]
    chat_reply = _chat(oai, chat_turns, tools=[CHAT_TOOL], max_tokens=40)
    assert reply.content[0].text == chat_reply.choices[0].message.content and "21" in reply.content[0].text
    assert _prompt(reply.usage) == chat_reply.usage.prompt_tokens


def test_count_tokens_is_the_prompt_a_message_runs_on(claude: Any) -> None:
    kw: Any = {"model": "qwen", "system": SYSTEM, "messages": [{"role": "user", "content": ASK_WEATHER}]}
    counts = []
    for extra in ({}, {"tools": [TOOL]}, {"tools": [TOOL], "tool_choice": {"type": "none"}}):
        counted = claude.messages.count_tokens(**kw, **extra)
        ran = claude.messages.create(**kw, **extra, max_tokens=1, extra_body=GREEDY)
        assert counted.input_tokens == _prompt(ran.usage) > 10
        counts.append(counted.input_tokens)
    # The tools are shown to the model, unless tool_choice is none.
    assert counts[1] > counts[0] == counts[2], counts


def test_errors_come_in_anthropics_shape(server: Server, claude: Any) -> None:
    ask = [{"role": "user", "content": QUESTION}]
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model="qwen", messages=ask, max_tokens=0)
    bad_body: Any = bad.value.body
    assert bad_body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": bad_body["error"]["message"]},
    }
    assert "max_tokens must be at least 1" in bad_body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError, match="image"):
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
        claude.messages.create(model="qwen", messages=[{"role": "user", "content": [image]}], max_tokens=4)
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(model="nope", messages=ask, max_tokens=4)
    missing_body: Any = missing.value.body
    assert missing_body["error"]["type"] == "not_found_error"
    wrong: Any = anthropic.Anthropic(base_url=server.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as denied:
        wrong.messages.create(model="qwen", messages=ask, max_tokens=4)
    denied_body: Any = denied.value.body
    assert denied_body["error"]["type"] == "authentication_error"
    assert "sk-wrong" not in str(denied_body)

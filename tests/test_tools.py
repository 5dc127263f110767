"""Tool calling on Qwen2.5-Coder-0.5B-Instruct (its template teaches the Hermes format), through
the real ``openai`` client against ``lmplex serve`` and through the Python API: ``required`` and a
named function give calls whose arguments follow the schema, a streamed reply's tool-call deltas
add up to the whole one, tool results round-trip, and bad tool input is a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from server_util import Server

import lmplex

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Current weather", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a timezone",
            "parameters": {
                "type": "object",
                "properties": {"timezone": {"type": "string"}},
                "required": ["timezone"],
            },
        },
    },
]
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, qwen_coder_path: str) -> Iterator[Server]:
    model = {"model_id": qwen_coder_path, "served_model_name": "qwen", "max_model_len": 2048}
    s = Server(tmp_path_factory.mktemp("tools"), [model])
    s.wait_ready()
    yield s
    assert s.stop() == 0


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)


def test_required_call_follows_the_schema(server: Server) -> None:
    r = _client(server).chat.completions.create(
        model="qwen", messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=80
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls and calls[0].type == "function" and calls[0].id.startswith("call_")
    assert calls[0].function.name == "get_weather"
    args = json.loads(calls[0].function.arguments)
    jsonschema.validate(args, WEATHER)
    assert "Paris" in args["city"]


def test_named_function_is_called(server: Server) -> None:
    r = _client(server).chat.completions.create(
        model="qwen",
        messages=[{"role": "user", "content": "Tell me a joke."}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0,
        max_tokens=60,
    )
    calls = r.choices[0].message.tool_calls
    assert calls is not None and len(calls) == 1 and calls[0].type == "function"
    assert calls[0].function.name == "get_time"
    assert isinstance(json.loads(calls[0].function.arguments)["timezone"], str)


def test_streamed_tool_calls_add_up_to_the_whole_reply(server: Server) -> None:
    c = _client(server)
    kw: dict[str, Any] = {
        "model": "qwen",
        "messages": ASK,
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 80,
    }
    whole = c.chat.completions.create(tool_choice="required", **kw).choices[0]
    calls: dict[int, dict[str, str]] = {}
    finish = None
    content = ""
    for chunk in c.chat.completions.create(tool_choice="required", stream=True, **kw):
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"name": "", "arguments": ""})
                assert d.function is not None
                call["name"] += d.function.name or ""
                call["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls" and content == ""
    assert whole.message.tool_calls is not None
    want = [
        {"name": t.function.name, "arguments": t.function.arguments}
        for t in whole.message.tool_calls
        if t.type == "function"
    ]
    assert len(want) == len(whole.message.tool_calls)
    assert [calls[i] for i in sorted(calls)] == want


def test_tool_results_round_trip(server: Server) -> None:
    c = _client(server)
    first = c.chat.completions.create(
        model="qwen", messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=80
    ).choices[0]
    assert first.message.tool_calls is not None
    call = first.message.tool_calls[0]
    assert call.type == "function"
    messages: list[Any] = [
        *ASK,
        first.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees Celsius and sunny"},
    ]
    r = c.chat.completions.create(model="qwen", messages=messages, tools=TOOLS, temperature=0, max_tokens=40)
    reply = r.choices[0]
    assert reply.finish_reason in ("stop", "length", "tool_calls")
    if reply.finish_reason == "stop":
        assert "18" in (reply.message.content or ""), reply.message.content


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strnig"}}}]},
            "tools",
        ),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
        ({"messages": [*ASK, {"role": "tool", "tool_call_id": "call_x", "content": "1"}]}, "messages"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    ],
)
def test_bad_tool_input_is_a_400_naming_the_field(server: Server, change: dict[str, Any], param: str) -> None:
    body: dict[str, Any] = {"model": "qwen", "messages": ASK, "tools": TOOLS, "max_tokens": 4, **change}
    with pytest.raises(openai.BadRequestError) as e:
        _client(server).chat.completions.create(**body)
    assert e.value.param == param, e.value.message


def test_python_api_takes_the_same_tools(qwen_coder_path: str) -> None:
    e = lmplex.Engine(lmplex.ModelConfig(qwen_coder_path, max_model_len=2048))
    params = lmplex.SamplingParams(temperature=0, max_tokens=80)
    out = e.chat(ASK, params, tools=TOOLS, tool_choice="required")
    assert out.finish_reason == "tool_calls" and out.text == ""
    (call,) = out.tool_calls
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)
    # The call goes back into the chat unchanged, with the tool's answer.
    messages: list[Any] = [*ASK, {"role": "assistant", "content": None, "tool_calls": out.tool_calls}]
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": "18 degrees"})
    again = e.chat(messages, lmplex.SamplingParams(temperature=0, max_tokens=8), tools=TOOLS)
    assert "<tool_response>\n18 degrees\n</tool_response>" in again.prompt
    chunks = list(e.stream(ASK, params, tools=TOOLS, tool_choice="required"))
    assert [c["function"] for ch in chunks for c in ch.tool_calls] == [call["function"]]
    with pytest.raises(lmplex.InvalidRequest, match="tool_choice"):
        e.chat(ASK, params, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})

"""``POST /v1/responses`` on Qwen2.5-Coder-0.5B-Instruct through the real ``openai`` client: the
oracle is the chat endpoint on the same conversation (greedy), so a response's text, token counts
and tool calls must equal chat's; the client's own stream accumulator (``responses.stream``, which
checks the event order) must rebuild the whole reply. Stored responses (``store``, the default) are read
back, deleted, and continued with ``previous_response_id``, whose oracle is chat on the whole conversation;
one tenant cannot read another's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from server_util import Server

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather",
    "parameters": WEATHER,
}
CHAT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {k: v for k, v in TOOL.items() if k != "type"},
}
INSTRUCTIONS = "You are a terse assistant."
QUESTION = "Name three primary colors."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, qwen_coder_path: str) -> Iterator[Server]:
    model = {"model_id": qwen_coder_path, "served_model_name": "qwen", "max_model_len": 2048}
    s = Server(tmp_path_factory.mktemp("responses"), [model])
    s.wait_ready()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)


def _respond(client: openai.OpenAI, **kw: Any) -> Any:
    """``responses.create`` on the served model, greedy unless told (typed ``Any``: the client's
    output and event unions are wider than what these tests read)."""
    return client.responses.create(**{"model": "qwen", "temperature": 0, **kw})


def _chat(client: openai.OpenAI, messages: list[Any], **kw: Any) -> Any:
    return client.chat.completions.create(model="qwen", messages=messages, temperature=0, **kw)


def test_text_input_matches_chat(client: openai.OpenAI) -> None:
    r = _respond(client, input=QUESTION, instructions=INSTRUCTIONS, max_output_tokens=24)
    chat = _chat(
        client,
        [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}],
        max_tokens=24,
    )
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == chat.choices[0].message.content and r.output_text
    assert r.usage is not None and chat.usage is not None
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    done = chat.choices[0].finish_reason == "stop"
    assert r.status == ("completed" if done else "incomplete")
    assert r.instructions == INSTRUCTIONS and r.max_output_tokens == 24 and r.store is True
    [item] = r.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")


def test_message_items_equal_text_input(client: openai.OpenAI) -> None:
    items: Any = [
        {"role": "developer", "content": INSTRUCTIONS},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
    ]
    a = _respond(client, input=items, max_output_tokens=16)
    b = _respond(client, input=QUESTION, instructions=INSTRUCTIONS, max_output_tokens=16)
    assert a.output_text == b.output_text
    assert a.usage is not None and b.usage is not None and a.usage.input_tokens == b.usage.input_tokens


def test_max_output_tokens_makes_it_incomplete(client: openai.OpenAI) -> None:
    r = _respond(client, input="Count from 1 to 100.", max_output_tokens=5)
    assert r.status == "incomplete"
    assert r.incomplete_details is not None and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage is not None and r.usage.output_tokens == 5
    assert r.output[0].status == "incomplete"


def test_stream_rebuilds_the_whole_reply(client: openai.OpenAI) -> None:
    kw: Any = {"model": "qwen", "input": QUESTION, "temperature": 0, "max_output_tokens": 24}
    whole = client.responses.create(**kw)
    with client.responses.stream(**kw) as s:
        events: list[Any] = list(s)
        final: Any = s.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        f"response.{whole.status}",
    ]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == final.output_text
    assert final.id == events[0].response.id


def test_required_tool_call(client: openai.OpenAI) -> None:
    ask = "What is the weather in Paris right now?"
    r = _respond(client, input=ask, tools=[TOOL], tool_choice="required", max_output_tokens=80)
    calls = [o for o in r.output if o.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"]
    assert calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_")
    args = json.loads(calls[0].arguments)
    jsonschema.validate(args, WEATHER)
    chat = _chat(
        client, [{"role": "user", "content": ask}], tools=[CHAT_TOOL], tool_choice="required", max_tokens=80
    )
    tool_calls = chat.choices[0].message.tool_calls
    assert tool_calls is not None and calls[0].arguments == tool_calls[0].function.arguments
    assert r.tools[0].name == "get_weather"  # the tools are echoed in Responses' shape

    kw: Any = {"model": "qwen", "input": ask, "tools": [TOOL], "tool_choice": "required", "temperature": 0}
    with client.responses.stream(**kw, max_output_tokens=80) as s:
        done: list[Any] = [e for e in s if e.type == "response.function_call_arguments.done"]
        final: Any = s.get_final_response()
    assert [e.arguments for e in done] == [calls[0].arguments]
    assert [o.type for o in final.output] == ["function_call"]


def test_tool_results_round_trip_like_chat(client: openai.OpenAI) -> None:
    call = {"call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}
    items: Any = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", **call},
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": '{"temperature": 21, "sky": "clear"}',
        },
    ]
    r = _respond(client, input=items, tools=[TOOL], max_output_tokens=40)
    messages: Any = [
        items[0],
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": items[2]["output"]},
    ]
    chat = _chat(client, messages, tools=[CHAT_TOOL], max_tokens=40)
    assert r.output_text == chat.choices[0].message.content
    assert "21" in r.output_text
    assert r.usage is not None and chat.usage is not None and r.usage.input_tokens == chat.usage.prompt_tokens


def test_json_schema_format_and_logprobs(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"colors": {"type": "array", "items": {"type": "string"}}}}
    r = _respond(
        client,
        input=QUESTION + " Answer in JSON.",
        text={"format": {"type": "json_schema", "name": "colors", "schema": schema}},
        include=["message.output_text.logprobs"],
        top_logprobs=2,
        max_output_tokens=60,
    )
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)
    part = r.output[0].content[0]
    assert part.type == "output_text" and part.logprobs
    assert "".join(t.token for t in part.logprobs) == r.output_text
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in part.logprobs)


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
        ({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "1"}]}, "input"),
        ({"input": []}, "input"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"truncation": "auto"}, "truncation"),
        ({"text": {"format": {"type": "yaml"}}}, "text"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    client: openai.OpenAI, change: dict[str, Any], param: str
) -> None:
    body: dict[str, Any] = {"model": "qwen", "input": "hi", "max_output_tokens": 4, **change}
    with pytest.raises(openai.BadRequestError) as e:
        _respond(client, **body)
    assert e.value.param == param, e.value.message


def test_a_follow_up_continues_the_stored_conversation(client: openai.OpenAI, server: Server) -> None:
    first = _respond(client, input=QUESTION, instructions=INSTRUCTIONS, max_output_tokens=24)
    follow = "Now name two secondary colors."
    # Instructions do not carry over (OpenAI's rule): the follow-up runs without them.
    second = _respond(client, input=follow, previous_response_id=first.id, max_output_tokens=24)
    messages: Any = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": follow},
    ]
    chat = _chat(client, messages, max_tokens=24)
    assert second.output_text == chat.choices[0].message.content and second.output_text
    assert second.usage is not None and chat.usage is not None
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.previous_response_id == first.id and second.store is True
    # Each response lists its own input items (not the earlier turns), newest first.
    items = client.responses.input_items.list(first.id)
    (only,) = [i.model_dump(exclude_none=True) for i in items.data]
    want = ("message", "user", [{"type": "input_text", "text": QUESTION}])
    assert (only["type"], only["role"], only["content"]) == want
    assert only["id"].startswith("msg_") and not items.has_more
    turn = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": follow},
    ]
    third = _respond(client, input=turn, previous_response_id=second.id, max_output_tokens=2)
    listed = client.responses.input_items.list(third.id, order="asc", limit=2)
    parts = [i.model_dump()["content"][0] for i in listed.data]
    assert [(p["type"], p["text"]) for p in parts] == [("input_text", "first"), ("output_text", "ok")]
    assert listed.has_more
    rest = client.responses.input_items.list(third.id, order="asc", after=listed.data[-1].id)
    assert [i.model_dump()["content"][0]["text"] for i in rest.data] == [follow] and not rest.has_more
    with pytest.raises(openai.BadRequestError):
        client.responses.input_items.list(third.id, limit=0)
    # Read back, as it was answered; deleted, it is gone for reads and follow-ups alike.
    got = client.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text and got.status == first.status
    deleted = httpx.delete(f"{server.url}/v1/responses/{first.id}")
    assert deleted.json() == {"id": first.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as e:
        _respond(client, input=follow, previous_response_id=first.id, max_output_tokens=4)
    assert e.value.body is not None and "not found" in str(e.value.body)
    # With store false nothing is kept.
    unkept = _respond(client, input=QUESTION, max_output_tokens=4, store=False)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)


def test_a_tool_result_continues_the_stored_call(client: openai.OpenAI) -> None:
    ask = "What is the weather in Paris right now?"
    first = _respond(client, input=ask, tools=[TOOL], tool_choice="required", max_output_tokens=80)
    (call,) = [o for o in first.output if o.type == "function_call"]
    result = '{"temperature": 21, "sky": "clear"}'
    output: Any = [{"type": "function_call_output", "call_id": call.call_id, "output": result}]
    second = _respond(client, input=output, previous_response_id=first.id, tools=[TOOL], max_output_tokens=40)
    messages: Any = [
        {"role": "user", "content": ask},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": result},
    ]
    chat = _chat(client, messages, tools=[CHAT_TOOL], max_tokens=40)
    assert second.output_text == chat.choices[0].message.content and "21" in second.output_text


def test_a_streamed_response_is_stored_once_it_ends(client: openai.OpenAI) -> None:
    kw: Any = {"model": "qwen", "input": QUESTION, "temperature": 0, "max_output_tokens": 12}
    with client.responses.stream(**kw) as s:
        final: Any = s.get_final_response()
    got = client.responses.retrieve(final.id)
    assert got.output_text == final.output_text and got.status == final.status


def test_a_tenant_cannot_read_another_tenants_response(tmp_path: Any, smollm2_path: str) -> None:
    tenants: list[dict[str, object]] = [
        {"name": "a", "api_key": "sk-resp-a-0123456789"},
        {"name": "b", "api_key": "sk-resp-b-0123456789"},
    ]
    model = {"model_id": smollm2_path, "served_model_name": "smol", "max_model_len": 512}
    s = Server(tmp_path, [model], tenants=tenants)
    s.wait_ready()
    a, b = (openai.OpenAI(base_url=f"{s.url}/v1", api_key=str(t["api_key"]), max_retries=0) for t in tenants)
    mine = a.responses.create(model="smol", input="hi", max_output_tokens=4)
    assert a.responses.retrieve(mine.id).id == mine.id
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.create(model="smol", input="hi", max_output_tokens=4, previous_response_id=mine.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.input_items.list(mine.id)
    assert a.responses.retrieve(mine.id).id == mine.id  # untouched
    assert s.stop() == 0

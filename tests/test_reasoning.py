"""A reasoning model's reasoning apart from its answer (``reasoning``, ``reasoning_content``, Messages'
``thinking`` blocks, Responses' ``reasoning`` items), on SmolLM2 made a "thinking" model: exported as an
HF folder whose tokenizer names two unused added tokens ``<think>`` and ``</think>`` (Qwen3's are added,
non-special tokens too), with a chat template that opens ``<think>`` in the prompt (as DeepSeek-R1's and
Qwen3-Thinking's do) unless ``enable_thinking`` is false (Qwen3's switch: an empty, closed block).
Where a test needs the model to write a tag, a logit bias of +-100 decides it, so every expectation holds
on any machine; the split is checked against the raw text the same model gives with
``reasoning_parser="none"``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from server_util import Server

from lmplex import Engine, ModelConfig, SamplingParams, StructuredOutputsParams

THINK, END = 8, 9  # the ids of <think> and </think>
TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{% else %}{{ '<think>\\n' }}{% endif %}{% endif %}"
)
CHAT = [{"role": "user", "content": "What is 2+2?"}]
OFF = {"enable_thinking": False}
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def folder(smollm2_path: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("thinking") / "model"
    export = [
        sys.executable,
        "-m",
        "lmplex",
        "models",
        "export",
        smollm2_path,
        str(out),
        "--dtype",
        "bfloat16",
    ]
    subprocess.run(export, check=True, capture_output=True)
    names = {"<issue_start>": "<think>", "<issue_comment>": "</think>"}
    tok = json.loads((out / "tokenizer.json").read_text())
    for added in tok["added_tokens"]:
        if added["content"] in names:
            added["content"], added["special"] = names[added["content"]], False
    for old, new in names.items():
        tok["model"]["vocab"][new] = tok["model"]["vocab"].pop(old)
    (out / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TEMPLATE
    for added in cfg.get("added_tokens_decoder", {}).values():
        if added["content"] in names:
            added["content"], added["special"] = names[added["content"]], False
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    return str(out)


@pytest.fixture(scope="module")
def engines(folder: str) -> tuple[Engine, Engine]:
    """The model with its reasoning read from the template, and the same model reading none."""
    return (
        Engine(ModelConfig(folder, max_model_len=512)),
        Engine(ModelConfig(folder, max_model_len=512, reasoning_parser="none")),
    )


def _params(n: int, bias: dict[int, float] | None = None, **more: Any) -> SamplingParams:
    return SamplingParams(max_tokens=n, min_tokens=n, temperature=0, logit_bias=bias or {}, **more)


def test_the_template_tells_and_the_tags_are_single_tokens(engines: tuple[Engine, Engine]) -> None:
    thinking, plain = engines
    assert thinking.tokenize("<think></think>", add_special_tokens=False) == [THINK, END]
    assert thinking.config.reasoning_parser is None and plain.config.reasoning_parser == "none"
    off = thinking.chat(CHAT, _params(8), chat_template_kwargs=OFF)
    assert off.prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert thinking.chat(CHAT, _params(8)).prompt.endswith("assistant\n<think>\n")


def test_an_answer_without_reasoning_passes_unchanged(engines: tuple[Engine, Engine]) -> None:
    split, raw = (e.chat(CHAT, _params(24), chat_template_kwargs=OFF) for e in engines)
    assert split.reasoning is None and split.text == raw.text and split.token_ids == raw.token_ids
    assert raw.text.strip() and "<think>" not in raw.text


def test_a_reasoning_the_prompt_opened_ends_at_its_tag(engines: tuple[Engine, Engine]) -> None:
    thinking, plain = engines
    # No end tag: the whole reply is reasoning.
    split, raw = (e.chat(CHAT, _params(24, {END: -100})) for e in engines)
    assert split.reasoning == raw.text.strip() and split.text == "" and raw.reasoning is None
    assert split.usage.reasoning_tokens == 24 and raw.usage.reasoning_tokens == 0
    # The end tag first: no reasoning, and what follows it is the answer (later tags are its text).
    split, raw = (e.chat(CHAT, _params(6, {END: 100})) for e in engines)
    assert raw.text == "</think>" * 6
    assert split.reasoning is None and split.text == "</think>" * 5
    assert split.usage.reasoning_tokens == 1  # the end tag
    # Streamed, the pieces add up to the same split.
    chunks = list(thinking.stream(CHAT, _params(24, {END: -100})))
    assert "".join(c.reasoning or "" for c in chunks) == raw_reasoning(plain) and not any(
        c.text for c in chunks
    )


def raw_reasoning(plain: Engine) -> str:
    return plain.chat(CHAT, _params(24, {END: -100})).text.strip()


def test_a_guide_constrains_the_answer_only(engines: tuple[Engine, Engine]) -> None:
    thinking, plain = engines
    guided = StructuredOutputsParams(json=SCHEMA)
    # The reasoning ends at once: the answer follows the schema (the guide forbids a second tag).
    out = thinking.chat(CHAT, _params(40, {END: 100}, structured_outputs=guided))
    assert out.reasoning is None and isinstance(json.loads(out.text)["n"], int), out
    assert out.token_ids[0] == END and out.finish_reason == "stop"
    # The reasoning never ends: the guide never applies, so the tokens are the unguided ones.
    bias: dict[int, float] = {END: -100}
    waiting = thinking.chat(CHAT, _params(24, bias, structured_outputs=guided))
    free = plain.chat(CHAT, _params(24, bias))
    assert waiting.token_ids == free.token_ids and waiting.reasoning == free.text.strip()
    # A reply may open its reasoning under a guide (Qwen3): <think> is allowed as its first token.
    opened = thinking.chat(
        CHAT, _params(5, {THINK: 100}, structured_outputs=guided), chat_template_kwargs=OFF
    )
    assert opened.token_ids == [THINK] * 5 and opened.reasoning == "<think>" * 4 and opened.text == ""
    assert opened.usage.reasoning_tokens == 5


def test_the_server_sends_reasoning_content(folder: str, tmp_path: Path) -> None:
    server = Server(tmp_path, [{"model_id": folder, "served_model_name": "thinker", "max_model_len": 512}])
    server.wait_ready()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    plain = Engine(ModelConfig(folder, max_model_len=512, reasoning_parser="none"))
    want = raw_reasoning(plain)
    extra: dict[str, Any] = {"min_tokens": 24}
    ask: dict[str, Any] = {
        "model": "thinker",
        "messages": CHAT,
        "max_tokens": 24,
        "temperature": 0,
        "logit_bias": {str(END): -100},
        "extra_body": extra,
    }
    whole = client.chat.completions.create(**ask)
    assert whole.usage is not None and whole.usage.completion_tokens_details is not None
    assert whole.usage.completion_tokens_details.reasoning_tokens == 24
    message = whole.choices[0].message
    assert (message.model_extra or {})["reasoning_content"] == want and message.content == ""
    deltas = [c.choices[0].delta for c in client.chat.completions.create(**ask, stream=True) if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == want
    assert not any(d.content for d in deltas)
    # Without reasoning, no reasoning_content at all.
    body = {"model": "thinker", "messages": CHAT, "max_tokens": 4, "chat_template_kwargs": OFF}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
    assert "reasoning_content" not in reply["choices"][0]["message"]
    bad = httpx.post(
        f"{server.url}/v1/chat/completions", json={**body, "chat_template_kwargs": [1]}, timeout=60
    )
    assert bad.status_code == 400 and "chat_template_kwargs" in bad.text
    _messages_and_responses(server.url, plain)
    assert server.stop() == 0


def _messages_and_responses(url: str, plain: Engine) -> None:
    """Messages' thinking blocks and Responses' reasoning items, whole and streamed, against the raw
    text of the same greedy call (it writes no end tag: all of it is reasoning)."""
    raw = plain.chat(CHAT, SamplingParams(max_tokens=24, temperature=0)).text
    want = raw.strip()
    assert want and "</think>" not in raw
    claude = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    ask: dict[str, Any] = {
        "model": "thinker",
        "max_tokens": 24,
        "messages": CHAT,
        "extra_body": {"temperature": 0},
    }
    whole = claude.messages.create(**ask)
    assert [b.type for b in whole.content] == ["thinking", "text"]
    assert whole.content[0].thinking == want and whole.content[1].text == ""
    with claude.messages.stream(**ask) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == want  # type: ignore[union-attr]
    kinds = [e.type for e in events]
    assert "thinking" in kinds and "signature" in kinds
    off = claude.messages.create(
        **{**ask, "extra_body": {"temperature": 0, "thinking": {"type": "disabled"}}}
    )
    assert [b.type for b in off.content] == ["text"]
    gpt = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    r = gpt.responses.create(model="thinker", input="What is 2+2?", max_output_tokens=24, temperature=0)
    assert [i.type for i in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == want and r.output_text == ""  # type: ignore[union-attr,index]
    assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens == r.usage.output_tokens
    streamed = list(
        gpt.responses.create(
            model="thinker", input="What is 2+2?", max_output_tokens=24, temperature=0, stream=True
        )
    )
    deltas = "".join(getattr(e, "delta", "") for e in streamed if e.type == "response.reasoning_text.delta")
    assert deltas == want
    done = next(e for e in streamed if e.type == "response.completed")
    assert done.response.output[0].content[0].text == want  # type: ignore[union-attr,index]

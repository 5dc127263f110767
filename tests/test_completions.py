"""The completions endpoint's scoring and sampling extras through the real ``openai`` client:
``echo`` (with ``max_tokens: 0`` it only scores the prompt, as lm-evaluation-harness asks), the
sampled token in legacy ``top_logprobs``, vLLM's ``prompt_logprobs``, ``best_of``, and ``suffix``
on a fill-in-the-middle model (Qwen2.5-Coder) or a 400 on one without (SmolLM2). The prompt's
logprobs are checked against the Python API's and transformers' elsewhere (test_hf_fixtures)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from server_util import Server

import lmplex
from lmplex import SamplingParams

PROMPT = "The capital of France is Paris. The capital of Italy is"


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: str, qwen_coder_path: str
) -> Iterator[Server]:
    models = [
        {"model_id": smollm2_path, "served_model_name": "smol", "max_model_len": 512},
        {"model_id": qwen_coder_path, "served_model_name": "qwen", "max_model_len": 512},
    ]
    s = Server(tmp_path_factory.mktemp("completions"), models)
    s.wait_ready()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)


def _complete(client: openai.OpenAI, **kw: Any) -> Any:
    return client.completions.create(**{"model": "smol", "prompt": PROMPT, "temperature": 0, **kw})


def test_echo_with_no_tokens_scores_the_prompt(client: openai.OpenAI, engine: lmplex.Engine) -> None:
    r = _complete(client, echo=True, max_tokens=0, logprobs=1)
    [c] = r.choices
    assert c.text == PROMPT and r.usage.completion_tokens == 0
    lp = c.logprobs
    assert "".join(lp.tokens) == PROMPT
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    # The same numbers as the Python API's prompt logprobs on the same weights.
    out = engine.generate(PROMPT, SamplingParams(max_tokens=0, prompt_logprobs=1))[0]
    assert out.prompt_logprobs is not None
    assert len(lp.token_logprobs) == len(out.prompt_logprobs)
    for theirs, e in zip(lp.token_logprobs[1:], out.prompt_logprobs[1:]):
        assert e is not None and theirs == pytest.approx(e.logprob, abs=1e-5)
    for top, e in zip(lp.top_logprobs[1:], out.prompt_logprobs[1:]):
        assert e is not None and len(top) in (1, 2) and top[e.token] == pytest.approx(e.logprob, abs=1e-5)


def test_echo_prefixes_the_prompt_and_its_logprobs(client: openai.OpenAI) -> None:
    plain = _complete(client, max_tokens=6, logprobs=2)
    r = _complete(client, echo=True, max_tokens=6, logprobs=2)
    c, p = r.choices[0], plain.choices[0]
    assert c.text == PROMPT + p.text
    n_prompt = r.usage.prompt_tokens
    assert len(c.logprobs.tokens) == n_prompt + len(p.logprobs.tokens)
    assert c.logprobs.tokens[n_prompt:] == p.logprobs.tokens
    assert c.logprobs.token_logprobs[n_prompt:] == p.logprobs.token_logprobs
    assert c.logprobs.text_offset[n_prompt] == len(PROMPT)
    # Streamed, the first chunk carries the prompt; the chunks add up to the whole reply.
    chunks = list(_complete(client, echo=True, max_tokens=6, logprobs=2, stream=True))
    assert chunks[0].choices[0].text.startswith(PROMPT)
    assert "".join(ch.choices[0].text for ch in chunks) == c.text
    streamed = [t for ch in chunks if ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens]
    assert streamed == c.logprobs.tokens


def test_text_offset_counts_characters_as_openai_does(client: openai.OpenAI) -> None:
    prompt = "Crème brûlée, café au lait, naïve piñata:"
    r = _complete(client, prompt=prompt, echo=True, max_tokens=8, logprobs=1)
    lp = r.choices[0].logprobs
    text = r.choices[0].text
    assert text.startswith(prompt) and "".join(lp.tokens) == text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    n_prompt = r.usage.prompt_tokens
    assert lp.text_offset[n_prompt] == len(prompt) < len(prompt.encode()), "characters, not UTF-8 bytes"
    # Streamed, each chunk's offsets go on from the characters the earlier chunks held.
    chunks = list(_complete(client, prompt=prompt, echo=True, max_tokens=8, logprobs=1, stream=True))
    offsets = [
        o for c in chunks for o in (c.choices[0].logprobs.text_offset if c.choices[0].logprobs else [])
    ]
    assert offsets == lp.text_offset


def test_continuous_usage_stats(client: openai.OpenAI) -> None:
    opts: Any = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(_complete(client, max_tokens=5, stream=True, stream_options=opts))
    counts = [ch.usage.completion_tokens for ch in chunks if ch.choices]
    assert counts == sorted(counts) and counts[-1] == 5
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert {ch.usage.prompt_tokens for ch in chunks} == {chunks[-1].usage.prompt_tokens}


def test_a_wrong_type_is_a_400_naming_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        _complete(client, max_tokens=2, logit_bias={"5": "x"})
    assert e.value.param == "logit_bias" and "logit_bias" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        _complete(client, max_tokens=2, logit_bias={"a": 1, "b": 2})
    assert e.value.param == "logit_bias" and "a, b" in e.value.message


def test_legacy_top_logprobs_always_hold_the_sampled_token(client: openai.OpenAI) -> None:
    r = _complete(client, max_tokens=6, logprobs=0, temperature=1.0, seed=3)
    lp = r.choices[0].logprobs
    assert [list(t) for t in lp.top_logprobs] == [[tok] for tok in lp.tokens]
    assert [t[tok] for t, tok in zip(lp.top_logprobs, lp.tokens)] == lp.token_logprobs
    r = _complete(client, max_tokens=6, logprobs=3, temperature=1.0, seed=3)
    assert all(
        tok in top and 3 <= len(top) <= 4 for top, tok in zip(r.choices[0].logprobs.top_logprobs, lp.tokens)
    )


def test_vllm_prompt_logprobs(client: openai.OpenAI) -> None:
    r = _complete(client, max_tokens=1, extra_body={"prompt_logprobs": 2})
    plp = r.choices[0].model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == r.usage.prompt_tokens
    for entry in plp[1:]:
        ranked = sorted((v["rank"], v["logprob"]) for v in entry.values() if v["rank"] is not None)
        assert [k for k, _ in ranked] == [1, 2] and ranked[0][1] >= ranked[1][1]
        assert all(v["logprob"] <= 0 and isinstance(v["decoded_token"], str) for v in entry.values())


def test_chat_prompt_logprobs_cover_the_rendered_prompt(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "Hi there"}]
    r = client.chat.completions.create(
        model="smol", messages=messages, max_tokens=1, extra_body={"prompt_logprobs": 0}
    )
    assert r.usage is not None and r.model_extra is not None
    plp = r.model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == r.usage.prompt_tokens
    assert all(len(e) == 1 and next(iter(e.values()))["logprob"] <= 0 for e in plp[1:])
    plain = client.chat.completions.create(model="smol", messages=messages, max_tokens=1)
    assert plain.model_extra is not None and plain.model_extra["prompt_logprobs"] is None


def test_min_tokens_holds_back_the_end(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "Say hi."}]
    kw: Any = {"model": "smol", "messages": messages, "max_tokens": 40, "temperature": 0}
    short = client.chat.completions.create(**kw)
    assert short.usage is not None and short.usage.completion_tokens < 25
    held = client.chat.completions.create(**kw, extra_body={"min_tokens": 25})
    assert held.usage is not None and held.usage.completion_tokens >= 25
    assert (held.choices[0].message.content or "").startswith(short.choices[0].message.content or "")


def test_best_of_keeps_the_likeliest_sample(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"max_tokens": 8, "temperature": 1.0, "seed": 11}
    # Sample `i` of a call uses `seed + i`, so n=4 shows the four candidates best_of=4 ranks.
    candidates = _complete(client, n=4, logprobs=0, **kw).choices
    best = max(candidates, key=lambda c: sum(c.logprobs.token_logprobs))
    r = _complete(client, best_of=4, **kw)
    assert [c.text for c in r.choices] == [best.text]
    assert r.choices[0].logprobs is None  # computed to rank them, not asked for
    assert r.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in candidates)
    two = _complete(client, n=2, best_of=4, **kw).choices
    ranked = sorted(candidates, key=lambda c: -sum(c.logprobs.token_logprobs))
    assert [c.text for c in two] == [c.text for c in ranked[:2]]


def test_suffix_fills_in_the_middle(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model="qwen",
        prompt="def add(a, b):\n    return ",
        suffix="\n\nprint(add(1, 2))\n",
        max_tokens=8,
        temperature=0,
    )
    assert r.choices[0].text.strip().startswith("a + b"), r.choices[0].text
    with pytest.raises(openai.BadRequestError) as e:
        _complete(client, suffix="!", max_tokens=4)
    assert e.value.param == "suffix" and "fill-in-the-middle" in e.value.message


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"best_of": 2, "n": 3}, "best_of"),
        ({"best_of": 3, "stream": True}, "best_of"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"min_tokens": 50, "max_tokens": 4}, "min_tokens"),
    ],
)
def test_bad_extras_are_a_400_naming_the_field(
    client: openai.OpenAI, change: dict[str, Any], param: str
) -> None:
    vllm = ("prompt_logprobs", "use_beam_search", "min_tokens")
    extra = {k: change.pop(k) for k in list(change) if k in vllm}
    with pytest.raises(openai.BadRequestError) as e:
        _complete(client, extra_body=extra, **change)
    assert e.value.param == param, e.value.message

"""The Python API on a real model (SmolLM2-135M-Instruct): generation, sampling, stops, streaming,
logprobs, chat templates, tokenization, batching and memory reporting."""

from __future__ import annotations

import pickle

import pytest

import lmplex
from lmplex import InvalidRequest, SamplingParams
from lmplex.engine import Prompt

PROMPT = "The history of the Roman Empire"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def greedy(
    max_tokens: int = 24,
    *,
    ignore_eos: bool = False,
    stop: list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    logprobs: int | None = None,
) -> SamplingParams:
    return SamplingParams(
        temperature=0.0,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        stop=stop,
        stop_token_ids=stop_token_ids,
        logprobs=logprobs,
    )


def test_greedy_is_deterministic_and_non_empty(engine: lmplex.Engine) -> None:
    first = engine.generate(PROMPT, greedy())
    second = engine.generate(PROMPT, greedy())
    assert len(first) == 1 and len(second) == 1
    assert first[0].token_ids == second[0].token_ids
    assert first[0].text == second[0].text
    assert len(first[0].token_ids) > 0
    assert first[0].text.strip() != ""
    assert first[0].prompt == PROMPT


def test_length_finish_and_usage(engine: lmplex.Engine) -> None:
    out = engine.generate(PROMPT, greedy(max_tokens=5, ignore_eos=True))[0]
    assert out.finish_reason == "length"
    assert out.stop_reason is None
    assert len(out.token_ids) == 5
    assert out.usage.completion_tokens == 5
    assert out.usage.prompt_tokens == len(engine.tokenize(PROMPT))
    assert out.usage.total_tokens == out.usage.prompt_tokens + 5


def test_seeded_sampling(engine: lmplex.Engine) -> None:
    def sample(seed: int) -> list[int]:
        params = SamplingParams(temperature=1.0, seed=seed, max_tokens=16, ignore_eos=True)
        return engine.generate(PROMPT, params)[0].token_ids

    assert sample(1234) == sample(1234)
    runs = {tuple(sample(seed)) for seed in range(5)}
    assert len(runs) > 1, "five seeds at temperature 1.0 all gave the same tokens"


def test_stop_string_cuts_before_it(engine: lmplex.Engine) -> None:
    full = engine.generate(PROMPT, greedy(max_tokens=40, ignore_eos=True))[0].text
    assert len(full) >= 20, full
    middle = len(full) // 2
    stop = full[middle : middle + 4]
    assert stop.strip(), f"pick another prompt: {full!r}"
    out = engine.generate(PROMPT, greedy(max_tokens=40, ignore_eos=True, stop=[stop]))[0]
    assert out.finish_reason == "stop"
    assert out.stop_reason == stop
    assert out.text == full[: full.index(stop)]
    assert stop not in out.text


def test_stop_token_ids(engine: lmplex.Engine) -> None:
    ids = engine.generate(PROMPT, greedy(max_tokens=12, ignore_eos=True))[0].token_ids
    stop_id = ids[4]
    first = ids.index(stop_id)
    out = engine.generate(PROMPT, greedy(max_tokens=12, ignore_eos=True, stop_token_ids=[stop_id]))[0]
    assert out.finish_reason == "stop"
    assert out.stop_reason == stop_id
    assert out.token_ids[:first] == ids[:first]
    assert len(out.token_ids) in (first, first + 1)  # the stop token may or may not be kept
    assert out.usage.completion_tokens == len(out.token_ids)


def test_stream_matches_generate(engine: lmplex.Engine) -> None:
    params = greedy(max_tokens=20)
    expected = engine.generate(CHAT, params)[0]
    chunks = list(engine.stream(CHAT, params))
    assert len(chunks) >= 2
    assert "".join(c.text for c in chunks) == expected.text
    assert [t for c in chunks for t in c.token_ids] == expected.token_ids
    assert chunks[-1].finish_reason == expected.finish_reason
    assert all(c.finish_reason is None for c in chunks[:-1])
    last_usage = chunks[-1].usage
    assert last_usage is not None
    assert last_usage.completion_tokens == expected.usage.completion_tokens
    assert last_usage.prompt_tokens == expected.usage.prompt_tokens


def test_logprobs(engine: lmplex.Engine) -> None:
    out = engine.generate(PROMPT, greedy(max_tokens=6, logprobs=3, ignore_eos=True))[0]
    assert out.logprobs is not None
    assert len(out.logprobs) == len(out.token_ids) == 6
    for step, token_id in zip(out.logprobs, out.token_ids):
        assert step.token_id == token_id
        assert step.logprob <= 0.0
        assert len(step.top) == 3
        values = [alt.logprob for alt in step.top]
        assert values == sorted(values, reverse=True)
        assert all(v <= 0.0 for v in values)
        # Greedy: the sampled token is the most likely one.
        assert step.top[0].token_id == token_id
        assert step.logprob == pytest.approx(step.top[0].logprob, abs=1e-4)
    assert engine.generate(PROMPT, greedy(max_tokens=2))[0].logprobs is None


def test_chat_messages(engine: lmplex.Engine) -> None:
    rendered = engine.apply_chat_template(CHAT)
    assert "<|im_start|>user" in rendered
    assert "What is the capital of France?" in rendered
    assert rendered.rstrip().endswith("<|im_start|>assistant")
    assert "<|im_start|>assistant" not in engine.apply_chat_template(CHAT, add_generation_prompt=False)

    out = engine.chat(CHAT, greedy(max_tokens=16))
    assert out.text.strip() != ""
    assert out.usage.prompt_tokens == len(engine.tokenize(rendered, add_special_tokens=False))
    # A message list is one prompt, not a batch of two.
    two_turns = [{"role": "system", "content": "Be brief."}, *CHAT]
    assert len(engine.generate(two_turns, greedy(max_tokens=4))) == 1


def test_tokenize_round_trip(engine: lmplex.Engine) -> None:
    ids = engine.tokenize("Hello world")
    assert len(ids) >= 2
    assert all(isinstance(i, int) and i >= 0 for i in ids)
    assert engine.detokenize(ids) == "Hello world"


def test_token_id_prompts(engine: lmplex.Engine) -> None:
    text = "The capital of France is"
    ids = engine.tokenize(text)
    params = greedy(max_tokens=8)
    by_text = engine.generate(text, params)[0]
    by_ids = engine.generate(ids, params)[0]
    assert by_ids.token_ids == by_text.token_ids
    assert by_ids.prompt == text  # the prompt ids, decoded
    assert by_ids.usage.prompt_tokens == len(ids)
    # A list of id lists is a batch.
    both = engine.generate([ids, ids[:-1]], params)
    assert len(both) == 2 and both[0].token_ids == by_text.token_ids
    chunks = list(engine.stream(ids, params))
    assert [t for c in chunks for t in c.token_ids] == by_text.token_ids


def test_batch_matches_solo_runs(engine: lmplex.Engine) -> None:
    prompts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time",
        "The three primary colors are",
    ]
    params = greedy(max_tokens=12)
    batch = engine.generate(prompts, params)
    assert len(batch) == 4
    for prompt, out in zip(prompts, batch):
        solo = engine.generate(prompt, params)[0]
        assert out.prompt == prompt
        assert out.token_ids == solo.token_ids
        assert out.text == solo.text


def test_params_per_prompt(engine: lmplex.Engine) -> None:
    prompts: list[Prompt] = [PROMPT, CHAT]
    outs = engine.generate(
        prompts, [greedy(max_tokens=2, ignore_eos=True), greedy(max_tokens=4, ignore_eos=True)]
    )
    assert [o.usage.completion_tokens for o in outs] == [2, 4]
    with pytest.raises(InvalidRequest, match="2 SamplingParams for 3 prompts"):
        engine.generate([PROMPT, PROMPT, PROMPT], [greedy(), greedy()])
    with pytest.raises(InvalidRequest, match="no prompt given"):
        engine.generate([], greedy())  # an empty batch is a mistake, not a silent no-op


def test_default_params_and_properties(engine: lmplex.Engine, smollm2_path: str) -> None:
    out = engine.generate(PROMPT)[0]  # SamplingParams() defaults
    assert out.usage.completion_tokens == len(out.token_ids) <= 256
    assert engine.max_model_len == 2048
    assert engine.config.max_model_len == 2048
    assert engine.config.model_id == smollm2_path
    assert engine.path == smollm2_path
    assert isinstance(engine.info, lmplex.ModelInfo) and engine.info.format == "gguf"
    assert engine.info.max_model_len == 2048 and engine.info.to_dict()["vocab_size"] == engine.info.vocab_size


def test_sampling_params_pickle_and_round_trip_through_a_dict() -> None:
    json_schema = lmplex.StructuredOutputsParams(json={"type": "object"})
    p = SamplingParams(
        temperature=0.5, seed=7, stop="END", logit_bias={3: -100.0}, structured_outputs=json_schema
    )
    d = p.to_dict()
    assert (d["temperature"], d["seed"], d["stop"], d["logit_bias"]) == (0.5, 7, ["END"], {3: -100.0})
    assert list(d["structured_outputs"]) == ["json"], d["structured_outputs"]
    assert SamplingParams.from_dict(d) == p == pickle.loads(pickle.dumps(p))
    assert pickle.loads(pickle.dumps(SamplingParams())) == SamplingParams()
    with pytest.raises(InvalidRequest, match="temperature"):
        SamplingParams.from_dict({**d, "temperature": -1.0})


def test_stats_are_the_cores_counters_by_name(engine: lmplex.Engine) -> None:
    engine.generate(PROMPT, greedy(4))
    stats = engine.stats()
    assert list(stats) == list(lmplex.EngineStats.__annotations__), "the Rust names, in their order"
    assert stats["num_kv_blocks"] > 0 and stats["num_steps"] >= 4
    assert stats["num_free_kv_blocks"] <= stats["num_kv_blocks"] and stats["num_running"] == 0


def test_memory_reports_weights(engine: lmplex.Engine) -> None:
    memory = engine.memory()
    assert isinstance(memory, lmplex.MemoryReport) and memory.weights > 0
    assert all(isinstance(v, int) and v >= 0 for v in memory.to_dict().values() if v is not None)
    assert (memory.device_used, memory.device_total) == (None, None), "CPU: no device figures"


def test_one_liner(smollm2_path: str) -> None:
    text = lmplex.generate(CHAT, model=smollm2_path, temperature=0.0, max_tokens=8)
    assert isinstance(text, str) and text.strip() != ""
    again = lmplex.generate(CHAT, model=smollm2_path, temperature=0.0, max_tokens=8)
    assert again == text

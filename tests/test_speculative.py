"""Speculative decoding from Python and the server: the config's checks; on the three test models,
outputs and logprobs equal to plain decoding's (greedy and seeded with a penalty, alone and batched);
a draft model named by its alias (SmolLM2 drafting for itself) gives the same outputs, and one with
another tokenizer is refused; the counters in ``stats()`` and ``/metrics``; and ``--speculative-config``."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import httpx
import pytest
from conftest import fetched_model
from server_util import Server

import lmplex
from lmplex import InvalidRequest, ModelConfig, SamplingParams
from lmplex.engine import Prompt

SOURCE = """def area(width, height):
    return width * height


def perimeter(width, height):
    return 2 * (width + height)
"""

PROMPTS: list[Prompt] = [
    [{"role": "user", "content": f"Rename `width` to `w` in this code and print all of it:\n{SOURCE}"}],
    [{"role": "user", "content": f"Copy this code exactly:\n{SOURCE}"}],
    [{"role": "user", "content": "Name three colours."}],
    "The history of the Roman Empire",
]
NGRAM = {"method": "ngram", "num_speculative_tokens": 5}


def params(i: int) -> SamplingParams:
    if i % 2 == 0:
        return SamplingParams(temperature=0.0, max_tokens=48, logprobs=2)
    return SamplingParams(
        temperature=0.7, top_p=0.9, seed=10 + i, max_tokens=48, logprobs=2, repetition_penalty=1.1
    )


def test_config_round_trips_and_bad_values_name_the_field(smollm2_path: str) -> None:
    c = ModelConfig(smollm2_path, speculative={**NGRAM, "prompt_lookup_max": 3})
    want = {**NGRAM, "prompt_lookup_min": None, "prompt_lookup_max": 3, "model": None}
    assert c.speculative == want
    assert ModelConfig.from_dict(c.to_dict()) == c
    assert ModelConfig(smollm2_path).speculative is None
    bad = [
        ({**NGRAM, "num_speculative_tokens": 0}, "num_speculative_tokens must be between 1 and 16"),
        ({**NGRAM, "method": "eagle"}, "unknown variant `eagle`, expected `ngram`"),
        ({**NGRAM, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_min <= prompt_lookup_max"),
        ({**NGRAM, "method": "draft"}, 'method "draft" needs a "model"'),
        ({**NGRAM, "model": "x"}, '"model" is for method "draft"'),
    ]
    for spec, message in bad:
        with pytest.raises(InvalidRequest, match=re.escape(message)):
            ModelConfig(smollm2_path, speculative=spec)
    with pytest.raises(TypeError, match="unknown keyword argument `lookahead`"):
        ModelConfig(smollm2_path, speculative={**NGRAM, "lookahead": 2})
    with pytest.raises(InvalidRequest, match="embedding model decodes nothing"):
        ModelConfig(smollm2_path, task="embed", speculative=NGRAM)


def _logprobs(out: lmplex.RequestOutput) -> list[tuple[float, list[tuple[int, float]]]]:
    assert out.logprobs is not None
    return [(lp.logprob, [(t.token_id, t.logprob) for t in lp.top]) for lp in out.logprobs]


@pytest.mark.parametrize("alias", ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "gemma-3-270m"])
def test_outputs_equal_plain_decoding_and_drafts_are_counted(alias: str) -> None:
    path = fetched_model(alias)
    plain = lmplex.Engine(ModelConfig(path, max_model_len=1024))
    spec = lmplex.Engine(ModelConfig(path, max_model_len=1024, speculative=NGRAM))
    each = [params(i) for i in range(len(PROMPTS))]
    want = [plain.generate([p], each[i])[0] for i, p in enumerate(PROMPTS)]
    alone = [spec.generate([p], each[i])[0] for i, p in enumerate(PROMPTS)]
    together = spec.generate(PROMPTS, each)
    for i, w in enumerate(want):
        for got in (alone[i], together[i]):
            assert got.token_ids == w.token_ids and got.text == w.text, (alias, i)
            assert _logprobs(got) == _logprobs(w), (alias, i)
            assert got.finish_reason == w.finish_reason
    stats = spec.stats()
    drafted, accepted = stats["spec_decode_num_draft_tokens"], stats["spec_decode_num_accepted_tokens"]
    assert stats["spec_decode_num_drafts"] > 0 and 0 < accepted <= drafted, stats
    assert plain.stats()["spec_decode_num_draft_tokens"] == 0


def test_a_draft_model_by_alias_gives_the_same_outputs_and_another_tokenizer_is_refused(
    smollm2_path: str,
) -> None:
    draft = {"method": "draft", "model": "smollm2-135m-instruct", "num_speculative_tokens": 4}
    plain = lmplex.Engine(ModelConfig(smollm2_path, max_model_len=1024))
    spec = lmplex.Engine(ModelConfig(smollm2_path, max_model_len=1024, speculative=draft))
    each = [params(i) for i in range(len(PROMPTS))]
    want = plain.generate(PROMPTS, each)
    for i, got in enumerate(spec.generate(PROMPTS, each)):
        assert got.token_ids == want[i].token_ids and got.text == want[i].text, i
        assert _logprobs(got) == _logprobs(want[i]), i
    stats = spec.stats()
    # How much it drafts depends on measured pass times: a draft as costly as its target steps aside
    # once measured (the tiny-model tests in crates/lmplex-engine check acceptance).
    assert stats["spec_decode_num_accepted_tokens"] <= stats["spec_decode_num_draft_tokens"], stats
    assert spec.memory().other > plain.memory().other, "the draft model's weights and KV count"
    gemma = {**draft, "model": fetched_model("gemma-3-270m")}
    with pytest.raises(InvalidRequest, match="does not share the target's tokenizer"):
        lmplex.Engine(ModelConfig(smollm2_path, speculative=gemma))


def test_serve_flag_sets_it_and_metrics_count_it(smollm2_path: str, tmp_path: Path) -> None:
    from lmplex import serve

    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    flags = [
        "serve",
        smollm2_path,
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 3}',
    ]
    lines = serve.config_toml(parser.parse_args(flags)).splitlines()
    assert 'speculative = {"method" = "ngram", "num_speculative_tokens" = 3}' in lines
    with pytest.raises(InvalidRequest, match="--speculative-config takes a JSON object"):
        serve.config_toml(parser.parse_args(["serve", smollm2_path, "--speculative-config", "{ngram"]))

    # The draft model named by its alias in the TOML: the server resolves it as it does `model_id`.
    draft = {"method": "draft", "model": "smollm2-135m-instruct", "num_speculative_tokens": 3}
    srv = Server(
        tmp_path,
        [
            {"model_id": smollm2_path, "name": "smol", "max_model_len": 1024, "speculative": NGRAM},
            {"model_id": smollm2_path, "name": "drafted", "max_model_len": 1024, "speculative": draft},
        ],
    )
    try:
        srv.wait_ready()
        for model in ("smol", "drafted"):
            body = {"model": model, "messages": PROMPTS[1], "max_tokens": 60, "temperature": 0}
            reply = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=120)
            assert reply.status_code == 200, reply.text
            text = httpx.get(f"{srv.url}/metrics").text
            counts = {}
            for name in ("drafts", "draft_tokens", "accepted_tokens"):
                m = re.search(
                    rf'^lmplex_spec_decode_num_{name}_total\{{model="{model}"\}} (\S+)$', text, re.MULTILINE
                )
                assert m, f"{name} of {model} not in /metrics"
                counts[name] = float(m.group(1))
            assert counts["accepted_tokens"] <= counts["draft_tokens"], (model, counts)
            if model == "smol":  # prompt lookup on a copy; the draft model may step aside (above)
                assert counts["accepted_tokens"] > 0, counts
    finally:
        assert srv.stop() == 0, "".join(srv.log)

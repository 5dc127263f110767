"""``Engine.score``: per-token log-probabilities as numpy arrays, and numpy token-id prompts.

The oracle is the perplexity fixture (``scripts/make_ppl_fixture.py``): transformers' float32 run of the
same GGUF over the Zen of Python, whose per-token negative log-likelihoods cover the second half of each
32-token chunk.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import lmplex
from lmplex import SamplingParams
from lmplex.engine import Prompt

FIXTURE = Path(__file__).parent / "fixtures" / "ppl_smollm2-135m-instruct.json"


def test_scores_match_transformers_and_prompt_logprobs(engine: lmplex.Engine) -> None:
    want = json.loads(FIXTURE.read_text())
    ctx, first = want["ctx"], want["ctx"] // 2
    ids = np.asarray(want["token_ids"][: 2 * ctx], dtype=np.int64).reshape(2, ctx)
    got = engine.score(ids)
    assert [a.dtype for a in got] == [np.float32, np.float32]
    assert [a.shape for a in got] == [(ctx,), (ctx,)]
    assert all(math.isnan(a[0]) for a in got)
    # transformers scored tokens first + 1 .. ctx - 1 of each chunk.
    per_chunk = ctx - 1 - first
    for c, arr in enumerate(got):
        theirs = np.asarray(want["nll"][c * per_chunk : (c + 1) * per_chunk])
        assert np.abs(-arr[first + 1 :] - theirs).max() < 0.05, c
        assert float(-arr[first + 1 :].mean()) == pytest.approx(theirs.mean(), rel=5e-3)
    # The same figures as prompt_logprobs, and as scoring each row alone (batch invariance).
    out = engine.generate(ids[0].tolist(), SamplingParams(max_tokens=0, prompt_logprobs=0))[0]
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    assert [lp.logprob for lp in out.prompt_logprobs[1:] if lp is not None] == got[0][1:].tolist()
    alone = engine.score(ids[1])
    assert len(alone) == 1 and np.array_equal(alone[0], got[1], equal_nan=True)


def test_prompts_of_every_kind_score_alike(engine: lmplex.Engine) -> None:
    text = "Beautiful is better than ugly."
    ids = engine.tokenize(text)
    (base,) = engine.score(text)
    assert base.shape == (len(ids),)
    prompts: list[Prompt] = [
        ids,
        np.asarray(ids, dtype=np.int32),
        np.asarray(ids, dtype=np.uint32),
        np.asarray(ids),
    ]
    for prompt in prompts:
        (arr,) = engine.score(prompt)
        assert np.array_equal(arr, base, equal_nan=True)
    # A batch may mix kinds; numpy prompts also work in generate.
    batch: list[Prompt] = [text, np.asarray(ids, dtype=np.uint16), ids]
    mixed = engine.score(batch)
    assert all(np.array_equal(a, base, equal_nan=True) for a in mixed)
    greedy = SamplingParams(temperature=0.0, max_tokens=3)
    assert engine.generate(np.asarray(ids), greedy)[0].token_ids == engine.generate(ids, greedy)[0].token_ids


@pytest.mark.parametrize(
    ("prompt", "match"),
    [
        (np.asarray([1.0, 2.0]), "integers"),
        (np.asarray([5, -1]), "not a valid token id"),
        (np.zeros((1, 2, 2), dtype=np.int64), "1-D or 2-D"),
        (np.zeros((0,), dtype=np.int64), "non-empty"),
        ([np.zeros((2, 2), dtype=np.int64)], "must be 1-D"),
        (np.asarray([10**9]), "vocabulary|outside"),
    ],
)
def test_bad_arrays_are_typed_errors(engine: lmplex.Engine, prompt: object, match: str) -> None:
    with pytest.raises(lmplex.InvalidRequest, match=match):
        engine.score(prompt)  # type: ignore[arg-type]

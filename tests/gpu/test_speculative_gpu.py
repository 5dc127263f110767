"""Speculative decoding on CUDA (``LMPLEX_CUDA_SPECULATIVE=1``; refused without it until this passes
on a device): SmolLM2-135M in bfloat16 with prompt lookup gives the tokens and log-probs of plain
decoding on the same device, bit for bit, greedy and seeded with a penalty, alone and batched, with
CUDA graphs and eager; the counters show drafts both accepted and rejected. With a draft model (the
same model, on the same device) too: the same tokens, drafts made. Skips as the other engine tests
do without a device."""

from __future__ import annotations

from typing import Any

import pytest
from test_speculative import NGRAM, PROMPTS, _logprobs, params

from lmplex import InvalidRequest

from .test_engine_gpu import cuda_engine


@pytest.mark.parametrize("eager", [False, True])
def test_speculation_on_cuda_changes_no_token_or_log_prob(
    torch: Any, smollm2_path: str, monkeypatch: pytest.MonkeyPatch, eager: bool
) -> None:
    with pytest.raises(InvalidRequest, match="LMPLEX_CUDA_SPECULATIVE=1"):
        cuda_engine(smollm2_path, "bfloat16", speculative=NGRAM)
    monkeypatch.setenv("LMPLEX_CUDA_SPECULATIVE", "1")
    each = [params(i) for i in range(len(PROMPTS))]
    plain = cuda_engine(smollm2_path, "bfloat16", enforce_eager=eager)
    want = [plain.generate([p], each[i])[0] for i, p in enumerate(PROMPTS)]
    del plain
    spec = cuda_engine(smollm2_path, "bfloat16", enforce_eager=eager, speculative=NGRAM)
    assert spec.info.device == "cuda"
    alone = [spec.generate([p], each[i])[0] for i, p in enumerate(PROMPTS)]
    together = spec.generate(PROMPTS, each)
    for i, w in enumerate(want):
        for got in (alone[i], together[i]):
            assert got.token_ids == w.token_ids, f"prompt {i}"
            assert _logprobs(got) == _logprobs(w), f"prompt {i}"
    stats = spec.stats()
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"], stats
    del spec
    # A draft model on the device: a model as large as its target stops drafting once its passes
    # are measured, so only the first steps draft; every token must still be plain decoding's.
    draft = {"method": "draft", "model": smollm2_path, "num_speculative_tokens": 4}
    spec = cuda_engine(smollm2_path, "bfloat16", enforce_eager=eager, speculative=draft)
    together = spec.generate(PROMPTS, each)
    for i, w in enumerate(want):
        assert together[i].token_ids == w.token_ids, f"draft model, prompt {i}"
        assert _logprobs(together[i]) == _logprobs(w), f"draft model, prompt {i}"
    assert spec.stats()["spec_decode_num_drafts"] > 0

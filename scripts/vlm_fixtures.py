"""What the vision-language fixture scripts share (``make_vlm_fixtures.py``,
``make_gemma3_vlm_fixtures.py``, ``make_qwen2vl_fixtures.py``): a word-level tokenizer with
special image tokens, float rounding for the JSON, and greedy ``generate`` with its logit margin.

Not run by CI: the scripts that import it need torch and transformers.
"""

from __future__ import annotations

from typing import Any


def word_tokenizer(words: int, specials: list[tuple[int, str]]) -> dict[str, Any]:
    """``tokenizer.json`` of a word-level tokenizer over ``t0..t{words-1}`` with ``specials``
    (id, text) as special added tokens, in that order; unknown words are ``t0``."""
    vocab = {f"t{i}": i for i in range(words)}
    for i, c in specials:
        vocab[c] = i
    added = [
        {
            "id": i,
            "content": c,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, c in specials
    ]
    return {
        "version": "1.0",
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"},
    }


def rounded(t: Any) -> list[float]:
    """A tensor's values, flattened, rounded to 7 decimals."""
    return [round(float(x), 7) for x in t.reshape(-1).double()]


def greedy(model: Any, inputs: dict[str, Any], tokens: int) -> tuple[list[int], float]:
    """``tokens`` greedy tokens of ``generate`` after ``inputs`` (``min_new_tokens`` too, which
    bans EOS until then: lmplex's ``min_tokens``), and the smallest top-1/top-2 logit gap."""
    import torch

    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    prompt_len = inputs["input_ids"].shape[1]
    logits = torch.stack(out.logits)[:, 0].double()
    top2 = torch.topk(logits, 2, dim=-1).values
    return [int(i) for i in out.sequences[0][prompt_len:]], round(float((top2[:, 0] - top2[:, 1]).min()), 6)

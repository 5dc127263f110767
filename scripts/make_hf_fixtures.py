#!/usr/bin/env python3
"""Make greedy-decoding reference fixtures with Hugging Face transformers from a GGUF checkpoint.

Not run by CI: it needs torch and transformers (a multi-GB install). CI checks lmplex against the
fixtures this script writes (``tests/test_hf_fixtures.py``). Run it in a separate environment:

    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install torch transformers gguf accelerate numpy
    lmplex models fetch smollm2-135m-instruct
    /tmp/refenv/bin/python scripts/make_hf_fixtures.py --model smollm2-135m-instruct

transformers dequantizes the GGUF to float32 (its GGUF loader, through the ``gguf`` package) and runs
its own implementation of the architecture in float32 on the CPU; the chat template and the tokenizer
also come from the GGUF metadata through transformers. Each case records the rendered prompt, its
token ids, and at each greedy step the chosen token and the top-5 token ids with their log-probs (a
log-softmax of the raw logits, as vLLM reports them). Decoding stops at an end-of-sequence token or
after ``--steps`` tokens.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "fixtures"

PROMPTS = [
    "Write a haiku about GPUs.",
    "What is the capital of France? Answer in one sentence.",
    "List three prime numbers greater than 10.",
    "Explain what a KV cache is in a language model.",
    "Write a Python function that reverses a string.",
    "Translate 'good morning' into Spanish, French and German.",
]
TOP_N = 5


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def default_gguf(model: str) -> Path:
    """The file `lmplex models fetch <model>` put in the lmplex cache (no lmplex import needed)."""
    import os

    cache = os.environ.get("LMPLEX_CACHE_DIR")
    base = (
        Path(cache)
        if cache
        else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lmplex" / "models"
    )
    names = {
        "smollm2-135m-instruct": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "qwen2.5-coder-0.5b-instruct": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "qwen2.5-coder-1.5b-instruct": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "gemma-3-270m": "gemma-3-270m-q4_k_m.gguf",
    }
    if model not in names:
        sys.exit(f"unknown model {model!r}: pass --gguf")
    return base / names[model]


def gemma_template() -> str:
    """The Gemma chat template lmplex uses for Gemma GGUFs that carry none (from its source)."""
    import re

    src = (ROOT / "crates" / "lmplex-text" / "src" / "chat.rs").read_text()
    found = re.search(r'GEMMA_CHAT_TEMPLATE: &str = r#"(.*?)"#;', src, re.DOTALL)
    if found is None:
        sys.exit("GEMMA_CHAT_TEMPLATE not found in crates/lmplex-text/src/chat.rs")
    return found.group(1)


def greedy_steps(
    torch: Any, model: Any, prompt_ids: list[int], steps: int, eos: set[int]
) -> list[dict[str, Any]]:
    """Greedy decoding of ``prompt_ids`` for ``steps`` tokens (or to an end token): each step's chosen
    token and the top-``TOP_N`` token ids with their log-probs (a log-softmax of the raw logits)."""
    out_steps = []
    with torch.no_grad():
        out = model(torch.tensor([prompt_ids]), use_cache=True)
        for _ in range(steps):
            logprobs = torch.log_softmax(out.logits[0, -1].double(), dim=-1)
            top = torch.topk(logprobs, TOP_N)
            chosen = int(top.indices[0])
            out_steps.append(
                {
                    "token_id": chosen,
                    "top_ids": [int(i) for i in top.indices],
                    "top_logprobs": [round(float(v), 6) for v in top.values],
                }
            )
            if chosen in eos:
                break
            out = model(torch.tensor([[chosen]]), past_key_values=out.past_key_values, use_cache=True)
    return out_steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="lmplex model alias, recorded in the fixture")
    ap.add_argument("--gguf", type=Path, help="GGUF file (default: the lmplex cache)")
    ap.add_argument("--steps", type=int, default=32, help="greedy tokens per prompt (default 32)")
    ap.add_argument("--out", type=Path, help="output JSON (default tests/fixtures/hf_<model>.json)")
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = args.gguf or default_gguf(args.model)
    if not gguf.exists():
        sys.exit(f"{gguf} is missing: run `lmplex models fetch {args.model}`")
    torch.manual_seed(0)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    if tok.chat_template is None and model.config.model_type.startswith("gemma"):
        tok.chat_template = gemma_template()
    eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    for end in ("<|im_end|>", "<end_of_turn>"):
        end_id = tok.convert_tokens_to_ids(end)
        if isinstance(end_id, int) and end_id != tok.unk_token_id:
            eos.add(end_id)

    cases = []
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = tok(text, add_special_tokens=False)["input_ids"]
        steps = greedy_steps(torch, model, prompt_ids, args.steps, eos)
        reply = tok.decode([s["token_id"] for s in steps], skip_special_tokens=True)
        print(f"{prompt!r} -> {reply!r}", file=sys.stderr)
        cases.append({"messages": messages, "prompt_text": text, "prompt_ids": prompt_ids, "steps": steps})

    fixture = {
        "model": args.model,
        "gguf_sha256": sha256(gguf),
        "oracle": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, CPU",
        "python": platform.python_version(),
        "top_n": TOP_N,
        "eos_token_ids": sorted(eos),
        "cases": cases,
    }
    out = args.out or DEFAULT_OUT / f"hf_{args.model}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()

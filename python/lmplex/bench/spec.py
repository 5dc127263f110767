"""Speculative decoding (prompt lookup, or a draft model) against plain decoding on the same model: decode tokens a second
at batch 1 and 8, on code editing (a source file and an instruction to rename an identifier: the reply
copies the file, where prompt lookup shines) and open chat (where it has little to find). Not a test:
it prints a markdown table (``--json``: one JSON object instead).

    python benches/spec.py                      # Qwen2.5-Coder-0.5B, 4 drafted tokens
    python benches/spec.py --quick --json       # smoke test
    python benches/spec.py --model qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct
    python benches/spec.py --model qwen2.5-coder-1.5b-instruct --target-dtype bfloat16 \
        --draft qwen2.5-coder-0.5b-instruct     # the target dequantized to bfloat16, the draft Q4_K_M
    lmplex bench --workloads spec               # the same, in lmplex bench's JSON

Two engines on the same file, one with ``speculative = {"method": "ngram", "num_speculative_tokens":
--k}`` (with ``--draft``: ``{"method": "draft", "model": DRAFT, ...}``) and one without, greedy, prefix caching off. A case's decode rate is its generated tokens after
the first over the time of the whole run minus that of a one-token run of the same prompts (which
holds the same prefill), as ``lmplex bench``'s batched workload measures it; the two engines run in
``--repeats`` adjacent pairs, the order alternating, and the speedup is the median of the pairs' ratios.
Each case also checks that both engines gave the same tokens (the guarantee, docs/speculative.md), and
records the acceptance counters. Goals: code editing at batch 1 >= 2x (prompt lookup); chat never below
0.95x; with a draft model, chat at batch 1 >= 1.3x.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Any

import lmplex
from lmplex import _core, models
from lmplex._core import ModelConfig, SamplingParams
from lmplex.bench.provenance import provenance
from lmplex.engine import Prompt

SOURCE = '''import math


class Shape:
    """A plane figure with an area and a perimeter."""

    def area(self) -> float:
        raise NotImplementedError

    def perimeter(self) -> float:
        raise NotImplementedError


class Circle(Shape):
    def __init__(self, radius: float) -> None:
        self.radius = radius

    def area(self) -> float:
        return math.pi * self.radius**2

    def perimeter(self) -> float:
        return 2 * math.pi * self.radius


class Rectangle(Shape):
    def __init__(self, width: float, height: float) -> None:
        self.width = width
        self.height = height

    def area(self) -> float:
        return self.width * self.height

    def perimeter(self) -> float:
        return 2 * (self.width + self.height)


def total_area(shapes: list[Shape]) -> float:
    return sum(s.area() for s in shapes)


def largest(shapes: list[Shape]) -> Shape:
    return max(shapes, key=lambda s: s.area())
'''
RENAMES = [
    ("total_area", "sum_of_areas"),
    ("largest", "biggest_shape"),
    ("radius", "r"),
    ("width", "w"),
    ("height", "h"),
    ("Shape", "Figure"),
    ("perimeter", "boundary_length"),
    ("area", "surface"),
]
CHAT = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how vaccines train the immune system.",
    "What are the pros and cons of living in a big city?",
    "Describe the water cycle to a ten-year-old.",
    "Give me a plan for learning to play the guitar in three months.",
    "Why is the sky blue?",
    "Compare tea and coffee.",
    "What should I pack for a week of hiking in the mountains?",
]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="model id (default: %(default)s)")
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens (default: %(default)s)")
    p.add_argument("--draft", default=None, help="draft with this model instead of prompt lookup")
    p.add_argument(
        "--target-dtype",
        default=None,
        choices=["bfloat16", "float16", "float32"],
        help="run the target (a GGUF) dequantized to this dtype: exported to a temporary HF folder",
    )
    p.add_argument("--code-tokens", type=int, default=480, help="most tokens of a code-editing reply")
    p.add_argument("--chat-tokens", type=int, default=160, help="most tokens of a chat reply")
    p.add_argument("--repeats", type=int, default=3, help="adjacent pairs per case (median kept)")
    p.add_argument("--quick", action="store_true", help="smoke test: shorter replies, one pair")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    return p


def code_prompt(old: str, new: str) -> Prompt:
    text = f"```python\n{SOURCE}```\n\nRename `{old}` to `{new}` everywhere in this file. Reply with the whole file."
    return [{"role": "user", "content": text}]


def decode_rate(engine: lmplex.Engine, prompts: list[Prompt], n: int) -> tuple[float, list[list[int]]]:
    """Tokens after the first a second, over ``prompts`` at once; and the tokens."""

    def timed(k: int) -> tuple[float, list[list[int]]]:
        t0 = time.perf_counter()
        outs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=k))
        return time.perf_counter() - t0, [list(o.token_ids) for o in outs]

    one, _ = timed(1)
    whole, tokens = timed(n)
    return sum(len(t) - 1 for t in tokens) / max(whole - one, 1e-9), tokens


def case(
    plain: lmplex.Engine, spec: lmplex.Engine, prompts: list[Prompt], n: int, repeats: int
) -> dict[str, Any]:
    before = spec.stats()
    pairs, identical, tokens = [], True, 0
    for i in range(repeats):
        if i % 2:
            s, spec_tokens = decode_rate(spec, prompts, n)
            p, plain_tokens = decode_rate(plain, prompts, n)
        else:
            p, plain_tokens = decode_rate(plain, prompts, n)
            s, spec_tokens = decode_rate(spec, prompts, n)
        pairs.append((p, s))
        identical = identical and plain_tokens == spec_tokens
        tokens = sum(len(t) for t in plain_tokens)
    after = spec.stats()
    drafts, drafted, accepted = (
        after[k] - before[k]
        for k in ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")
    )
    return {
        "requests": len(prompts),
        "generated_tokens": tokens,
        "plain_tok_s": round(statistics.median(p for p, _ in pairs), 2),
        "spec_tok_s": round(statistics.median(s for _, s in pairs), 2),
        "speedup": round(statistics.median(s / p for p, s in pairs), 3),
        "speedup_per_pair": [round(s / p, 3) for p, s in pairs],
        "identical_tokens": identical,
        "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
        "mean_accepted_length": round(accepted / drafts, 3) if drafts else None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        args.code_tokens, args.chat_tokens, args.repeats = 96, 48, 1

    target = args.model
    if args.target_dtype:
        exported = tempfile.TemporaryDirectory(prefix="lmplex-spec-target-")
        target = exported.name
        log(f"exporting {args.model} to {args.target_dtype} in {target} ...")
        list(_core.export_gguf_to_hf(models.resolve(args.model), target, args.target_dtype, 2_000_000_000))

    def config(speculative: dict[str, Any] | None) -> ModelConfig:
        return ModelConfig(
            target,
            max_model_len=2048,
            max_model_concurrency=8,
            enable_prefix_caching=False,
            speculative=speculative,
        )

    plain = lmplex.Engine(config(None))
    speculative: dict[str, Any] = {
        "method": "ngram",
        "num_speculative_tokens": args.k,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
    if args.draft:
        speculative = {"method": "draft", "model": args.draft, "num_speculative_tokens": args.k}
    spec = lmplex.Engine(config(speculative))
    code = [code_prompt(old, new) for old, new in RENAMES]
    chat: list[Prompt] = [[{"role": "user", "content": c}] for c in CHAT]
    cases = {}
    for name, prompts, n in (("code", code, args.code_tokens), ("chat", chat, args.chat_tokens)):
        for batch in (1, 8):
            key = f"{name}_batch{batch}"
            log(f"{key} ...")
            cases[key] = case(plain, spec, prompts[:batch], n, args.repeats)
            log(f"{key}: {cases[key]}")
    code1, chat1 = cases["code_batch1"]["speedup"], cases["chat_batch1"]["speedup"]
    chat_min = min(chat1, cases["chat_batch8"]["speedup"])
    goals: dict[str, Any] = {
        "chat_min_speedup": {"goal": 0.95, "value": chat_min, "met": chat_min >= 0.95},
        "identical_tokens": all(c["identical_tokens"] for c in cases.values()),
    }
    if args.draft:
        goals["chat_batch1_speedup"] = {"goal": 1.3, "value": chat1, "met": chat1 >= 1.3}
    else:
        goals["code_batch1_speedup"] = {"goal": 2.0, "value": code1, "met": code1 >= 2.0}
    return {
        "settings": {k: v for k, v in vars(args).items() if k != "json"} | {"speculative": speculative},
        "cases": cases,
        "goals": goals,
        "provenance": provenance(),
    }


def tables(report: dict[str, Any]) -> str:
    s = report["settings"]
    how = f"draft model {s['draft']}" if s.get("draft") else "prompt lookup"
    target = f"{s['model']} in {s['target_dtype']}" if s.get("target_dtype") else s["model"]
    lines = [
        f"{target}, {how} with up to {s['k']} drafted tokens, greedy:",
        "",
        "| case | requests | plain tok/s | speculative tok/s | speedup | acceptance | mean accepted | same tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, c in report["cases"].items():
        lines.append(
            f"| {name} | {c['requests']} | {c['plain_tok_s']} | {c['spec_tok_s']} | {c['speedup']}x | "
            f"{c['acceptance_rate']} | {c['mean_accepted_length']} | {c['identical_tokens']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    report = run(args)
    print(json.dumps(report, indent=2) if args.json else tables(report), flush=True)


if __name__ == "__main__":
    main()

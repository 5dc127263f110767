#!/usr/bin/env python3
"""Continuous batching on the real models: N concurrent requests against the same N run one after
another, a batch-size sweep, and the prefix-cache speedup. Not a test: it prints and writes JSON.

    python benches/batching.py                       # SmolLM2-135M and Qwen2.5-Coder-0.5B
    python benches/batching.py --models smollm2-135m-instruct --concurrency 8 32 --out bench.json

Every request asks for the same number of tokens (``ignore_eos``), so tokens/s compare like for like.
Models come from ``lmplex models fetch``; the machine, versions and git commit are recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from typing import Any

import lmplex
from lmplex import ModelConfig, SamplingParams

TOPICS = ["rivers", "the moon", "bread", "volcanoes", "owls", "glass", "trains", "salt"]


def prompts(n: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": f"Write a few sentences about {TOPICS[i % len(TOPICS)]} (note {i})."}]
        for i in range(n)
    ]


def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def throughput(engine: lmplex.Engine, n: int, max_tokens: int) -> dict[str, Any]:
    """N requests as one batch against the same N one at a time."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    batch = prompts(n)
    engine.generate(batch[:1], params)  # warm-up
    seq_s, seq_out = timed(lambda: [engine.generate([p], params)[0] for p in batch])
    par_s, par_out = timed(lambda: engine.generate(batch, params))
    assert [o.token_ids for o in seq_out] == [o.token_ids for o in par_out], "batched != sequential"
    tokens = sum(len(o.token_ids) for o in par_out)
    return {
        "concurrency": n,
        "generated_tokens": tokens,
        "sequential_s": round(seq_s, 3),
        "batched_s": round(par_s, 3),
        "sequential_tok_s": round(tokens / seq_s, 2),
        "batched_tok_s": round(tokens / par_s, 2),
        "speedup": round(seq_s / par_s, 2),
        "identical_tokens": True,
    }


def sweep(engine: lmplex.Engine, sizes: list[int], max_tokens: int) -> list[dict[str, Any]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    rows = []
    for n in sizes:
        s, outs = timed(lambda n=n: engine.generate(prompts(n), params))
        tokens = sum(len(o.token_ids) for o in outs)
        rows.append({"batch_size": n, "seconds": round(s, 3), "tok_s": round(tokens / s, 2)})
    return rows


def prefix_speedup(engine: lmplex.Engine, prefix_tokens: int) -> dict[str, Any]:
    """Time to first token of a prompt whose long prefix is cached, against the same prompt cold."""
    filler = " ".join(f"{TOPICS[i % len(TOPICS)]}{i}" for i in range(prefix_tokens))
    prefix = engine.tokenize(filler)[:prefix_tokens]
    params = SamplingParams(temperature=0.0, max_tokens=1)

    def ttft(ids: list[int]) -> float:
        t0 = time.perf_counter()
        next(iter(engine.stream(ids, params)))
        return time.perf_counter() - t0

    cold = ttft(prefix + engine.tokenize(" first question"))
    hits0 = engine.stats()["prefix_cache_hits"]
    warm = ttft(prefix + engine.tokenize(" second question"))
    return {
        "prefix_tokens": len(prefix),
        "cold_ttft_s": round(cold, 4),
        "warm_ttft_s": round(warm, 4),
        "speedup": round(cold / warm, 2),
        "cached_tokens": engine.stats()["prefix_cache_hits"] - hits0,
    }


def git_commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
    ap.add_argument("--concurrency", nargs="+", type=int, default=[8, 32])
    ap.add_argument("--sweep", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prefix-tokens", type=int, default=512)
    ap.add_argument("--out", default="bench-batching.json")
    args = ap.parse_args()
    report: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "processor": platform.processor(),
        },
        "lmplex": lmplex.__version__,
        "commit": git_commit(),
        "max_tokens": args.max_tokens,
        "models": {},
    }
    for name in args.models:
        conc = max(args.concurrency + args.sweep)
        engine = lmplex.Engine(ModelConfig(name, max_model_len=1024, max_model_concurrency=conc))
        entry = {
            "info": {k: getattr(engine.info, k) for k in ("architecture", "quantization", "num_parameters")},
            "throughput": [throughput(engine, n, args.max_tokens) for n in args.concurrency],
            "sweep": sweep(engine, args.sweep, args.max_tokens),
            "prefix_cache": prefix_speedup(engine, args.prefix_tokens),
        }
        report["models"][name] = entry
        print(json.dumps({name: entry}, indent=2), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

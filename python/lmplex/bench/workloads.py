"""The workloads, each run the same way on every system.

- ``decode``: batch 1, a 32-token prompt, ``n`` generated tokens; tokens/s after the first token.
- ``prefill``: batch 1, prompts of ``L`` tokens, one generated token; L / time to first token.
- ``throughput``: a seeded synthetic mix, all submitted at once. Prompt lengths are uniform in
  [32, 512] and output lengths uniform in [16, 128] (numpy ``default_rng(seed)``); generated tokens/s.
- ``batched``: lmplex's continuous batching, ``concurrency`` requests (32-token prompts, all
  different, ``n`` generated tokens each) submitted together; decode tokens/s (an ``n``-token run
  minus a one-token run), and the ratio to batch 1 measured the same way on the same prompts,
  each batched run next to a batch-1 run (the speedup is the median of those pairs' ratios).
- ``online``: lmplex's async API under Poisson arrivals at ``rate`` requests/s (same mix); time to
  first token, inter-token latency and end-to-end latency percentiles (p50, p90, p99).

Each figure is the median of ``repeats`` runs after one warm-up run; in ``decode`` and ``prefill``
the systems take turns run by run, with a pause of ``SETTLE_S`` before each timed run (see there).
Prompts are token ids cut from
deterministic texts, so every system reads the same ids; prefill runs and each arrival rate use
prompts of their own, and lmplex runs without prefix caching, so no system reuses earlier work.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from typing import Any

import lmplex
from lmplex import SamplingParams

from .systems import System, Timing

__all__ = ["batched", "decode", "mix", "online", "prefill", "prompt_ids", "throughput"]

_WORDS = [
    "the",
    "river",
    "carries",
    "light",
    "over",
    "stones",
    "while",
    "old",
    "bridges",
    "hold",
    "the",
    "weight",
    "of",
    "morning",
    "traffic",
    "and",
    "gulls",
    "argue",
    "above",
    "fishing",
    "boats",
    "that",
    "return",
    "with",
    "salt",
    "on",
    "their",
    "hulls",
    "and",
    "stories",
    "nobody",
    "writes",
    "down",
]


def prompt_ids(engine: lmplex.Engine, length: int, salt: int = 0) -> list[int]:
    """``length`` token ids of a deterministic text (``salt`` varies it)."""
    rnd = random.Random(salt)
    ids: list[int] = []
    while len(ids) < length:
        text = " ".join(rnd.choice(_WORDS) for _ in range(4 * length))
        ids += engine.tokenize(text, add_special_tokens=False)
    return ids[:length]


SETTLE_S = 0.3
"""Seconds of quiet before each timed run of ``decode`` and ``prefill``. The systems share one
process and its cores, and a system's worker threads spin a while after its last parallel loop
(torch's OpenMP workers, lmplex's team): a run that starts at once shares the cores with them.
Measured on 2 threads, SmolLM2-135M bf16 prefill of 512 tokens right after transformers' runs:
lmplex 1,080 tok/s, and 1,227 with torch's workers told to sleep (``OMP_WAIT_POLICY=PASSIVE``)."""


def _timed(system: System, prompt: list[int], max_tokens: int) -> Timing:
    """``system.run`` after ``SETTLE_S`` of quiet."""
    time.sleep(SETTLE_S)
    return system.run(prompt, max_tokens)


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def decode(systems: list[System], prompt: list[int], n: int, repeats: int) -> list[dict[str, Any]]:
    """Each system's median over ``repeats`` runs, the systems taking turns run by run, so that
    a slow phase of a shared machine falls on all of them rather than on one system's runs."""
    for s in systems:
        s.run(prompt, 4)  # warm-up
    runs: list[list[Timing]] = [[] for _ in systems]
    for _ in range(repeats):
        for s, out in zip(systems, runs):
            out.append(_timed(s, prompt, n))
    for s, out in zip(systems, runs):
        assert all(r.tokens == n for r in out), (
            f"{s.name} generated {[r.tokens for r in out]} tokens, not {n}"
        )
    return [{"generated_tokens": n, "decode_tok_s": _median([r.decode_tok_s for r in out])} for out in runs]


def prefill(systems: list[System], prompts: list[list[int]]) -> list[dict[str, Any]]:
    """One run per prompt (all the same length, all different, so nothing can be reused), the
    systems taking turns prompt by prompt as in ``decode``."""
    for s in systems:
        s.run(prompts[0][:16], 1)  # warm-up
    runs: list[list[Timing]] = [[] for _ in systems]
    for p in prompts:
        for s, out in zip(systems, runs):
            out.append(_timed(s, p, 1))
    n = len(prompts[0])
    results = []
    for out in runs:
        ttft = _median([r.ttft_s for r in out])
        res: dict[str, Any] = {"prompt_tokens": n, "ttft_s": ttft, "prefill_tok_s": n / ttft}
        seen = sorted({r.prompt_tokens for r in out if r.prompt_tokens})
        if seen and seen != [n]:  # a peer that tokenizes the text itself counted differently
            res["prompt_tokens_seen"] = seen
        results.append(res)
    return results


def mix(engine: lmplex.Engine, n: int, seed: int) -> list[tuple[list[int], int]]:
    """``n`` (prompt ids, output length) pairs: prompts uniform in [32, 512], outputs in [16, 128]."""
    rnd = random.Random(seed)
    return [(prompt_ids(engine, rnd.randint(32, 512), salt=1000 + i), rnd.randint(16, 128)) for i in range(n)]


def throughput(system: System, requests: list[tuple[list[int], int]]) -> dict[str, Any]:
    elapsed, tokens = system.run_mix(requests)
    return {
        "requests": len(requests),
        "generated_tokens": tokens,
        "seconds": elapsed,
        "tok_s": tokens / elapsed,
    }


def batched(engine: lmplex.Engine, prompts: list[list[int]], n: int, repeats: int) -> dict[str, Any]:
    """``len(prompts)`` requests of ``n`` tokens at once, against batch 1 on the same prompts.

    Both through ``generate`` (no per-token Python work): the decode rate is the tokens after
    the first over the time of an ``n``-token run minus that of a one-token run, which holds
    the same prefill. The two are measured in ``repeats`` adjacent pairs (the order alternating
    from pair to pair), and the speedup is the median of the pairs' ratios: a slow or fast phase
    of the machine then moves both sides of a ratio, where medians taken minutes apart could
    each land in a different phase.
    """

    def rate(ps: list[list[int]]) -> float:
        def timed(k: int) -> float:
            t0 = time.perf_counter()
            outs = engine.generate(ps, SamplingParams(temperature=0.0, max_tokens=k, ignore_eos=True))
            assert all(len(o.token_ids) == k for o in outs), f"not {k} tokens each"
            return time.perf_counter() - t0

        return len(ps) * (n - 1) / max(timed(n) - timed(1), 1e-9)

    rate(prompts[:1])  # warm-up
    pairs = []
    for i in range(repeats):
        one = [prompts[i % len(prompts)]]
        if i % 2:
            many = rate(prompts)
            pairs.append((rate(one), many))
        else:
            pairs.append((rate(one), rate(prompts)))
    ratios = [many / single for single, many in pairs]
    return {
        "concurrency": len(prompts),
        "generated_tokens": n,
        "decode_tok_s": _median([many for _, many in pairs]),
        "batch1_decode_tok_s": _median([single for single, _ in pairs]),
        "speedup_vs_batch1": _median(ratios),
        "speedup_per_pair": ratios,
    }


def _percentiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    s = sorted(xs)
    return {f"p{p}": s[min(len(s) - 1, int(p / 100 * len(s)))] for p in (50, 90, 99)}


def online(
    engine: lmplex.Engine, requests: list[tuple[list[int], int]], rate: float, seed: int
) -> dict[str, Any]:
    """Poisson arrivals at ``rate``/s through ``astream``; latency percentiles in seconds."""
    rnd = random.Random(seed)
    gaps = [rnd.expovariate(rate) for _ in requests]

    async def one(delay: float, prompt: list[int], n: int) -> tuple[float, list[float], float]:
        await asyncio.sleep(delay)
        t0 = last = time.perf_counter()
        first, itl = 0.0, []
        async for chunk in engine.astream(
            prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        ):
            now = time.perf_counter()
            if chunk.token_ids:
                if not first:
                    first = now - t0
                else:
                    itl.append((now - last) / len(chunk.token_ids))
                last = now
        return first, itl, time.perf_counter() - t0

    async def run() -> list[tuple[float, list[float], float]]:
        delays, at = [], 0.0
        for g in gaps:
            at += g
            delays.append(at)
        return await asyncio.gather(*[one(d, p, n) for d, (p, n) in zip(delays, requests)])

    t0 = time.perf_counter()
    results = asyncio.run(run())
    wall = time.perf_counter() - t0
    return {
        "rate_rps": rate,
        "requests": len(requests),
        "ttft_s": _percentiles([r[0] for r in results]),
        "itl_s": _percentiles([x for r in results for x in r[1]]),
        "e2e_s": _percentiles([r[2] for r in results]),
        "tok_s": sum(n for _, n in requests) / wall,
    }

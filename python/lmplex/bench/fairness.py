"""Tenant fairness on a real model: a light tenant's time to first token (TTFT) next to a heavy tenant,
under ``fcfs`` and under ``fair``, and backlogged tenants' shares against their weights. Not a test: it
prints markdown tables (``--json``: one JSON object instead).

    python benches/fairness.py                          # SmolLM2-135M, about 7 minutes on 2 CPU cores
    python benches/fairness.py --quick --json           # smoke test: fewer requests, 4 s windows
    python benches/fairness.py --cross-model --json     # each tenant on its own model, one device
    lmplex bench --workloads fairness                   # the same, in lmplex bench's JSON

Latency: a heavy tenant keeps ``--heavy-inflight`` long requests in flight (200-token prompts, 96-160
tokens each, so they do not finish in lockstep) on an engine that runs ``--concurrency`` at a time, so
its requests queue; a light tenant sends short requests (20-token prompts, 8 tokens) one at a time with
``--light-gap`` seconds between them. The light tenant's TTFT is measured alone (no heavy load), under
``fcfs`` and under ``fair`` (one engine per policy, loaded one after the other), in the latter two once
the heavy tenant has finished ``--concurrency`` requests (its first batch starts in lockstep) and
``--warmup`` seconds more. Goals: light p99 TTFT under fair <= 0.3x under fcfs and <= 2x alone, and the
heavy tenant's throughput under fair (generated tokens a second while the light requests run) >= 0.9x
under fcfs. A step is never interrupted, so a light request that arrives during one waits for it to end;
the engine keeps steps short while requests wait (docs/tenants.md), at its default settings unless
``--max-num-batched-tokens`` is given.

Shares: under ``fair`` with 4 running at a time, two tenants each keep 8 identical requests (64-token
prompts, 32 tokens) in flight for ``--share-seconds``, with weights 1:1 and then 1:3. A tenant's service
is counted as the scheduler's virtual token counter charges it, prompt tokens 1 and generated tokens 2,
and measured from the streams: the generated tokens of every chunk that arrives within the window, plus
the prompt of every request whose first token arrives within it (``tenant_usage`` counts only finished
calls, so it would miss the requests running when the window closes). The window opens once each
tenant has started 5 requests (the first 4 slots go to whichever came first, and the other needs time
to catch up) and ``--warmup`` seconds more. Goal: each share within 10% (relative) of its weight / the
sum of the weights.

``--cross-model``: the same runs with each tenant on its own model, two models of one
:class:`~lmplex.ModelHost` on one device (the checkpoint loaded twice, as ``heavy-model`` and
``light-model`` in the latency runs, ``a-model`` and ``b-model`` in the shares): fairness then comes
from the device's one service ledger and its turn (docs/tenants.md), not from one scheduler's queue.

Every prompt starts with its own token, so no request finds another's prompt in the prefix cache (the
scheduler does not charge cached tokens). Percentiles are nearest-rank; every request is greedy and
ignores EOS. The machine, versions and git commit are recorded in the JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
from typing import Any

import lmplex
from lmplex._core import SamplingParams, Tenant
from lmplex.bench.provenance import provenance
from lmplex.bench.tenant_load import FILLER, Load, Models, Prompts, Start

HEAVY_PROMPT, HEAVY_TOKENS = 200, (96, 160)
LIGHT_PROMPT, LIGHT_TOKENS = 20, 8
SHARE_PROMPT, SHARE_TOKENS, SHARE_INFLIGHT, SHARE_CONCURRENCY = 64, 32, 8, 4


def percentile(values: list[float], p: float) -> float:
    """Nearest rank: the smallest value with at least p% of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def light_ttfts(start: Start, prompts: Prompts, n: int, gap: float) -> list[float]:
    """TTFT of ``n`` short requests of tenant ``light``, one at a time, each read to its end."""
    params = SamplingParams(temperature=0.0, max_tokens=LIGHT_TOKENS, ignore_eos=True)
    out: list[float] = []
    for i in range(n):
        ids = prompts(LIGHT_PROMPT)
        t0 = time.perf_counter()
        stream = start(ids, params, "light")
        try:
            for chunk in stream:
                if chunk.token_ids and len(out) == i:
                    out.append(time.perf_counter() - t0)
        finally:
            stream.close()
        time.sleep(gap)
    assert len(out) == n, "a light request produced no token"
    return out


def summary(ttfts: list[float]) -> dict[str, Any]:
    return {
        "n": len(ttfts),
        "median_s": round(statistics.median(ttfts), 4),
        "p99_s": round(percentile(ttfts, 99), 4),
        "ttfts_s": [round(t, 4) for t in ttfts],
    }


def latency(args: argparse.Namespace, prompts: Prompts, policy: str, alone: bool) -> dict[str, Any]:
    """The light tenant's TTFT next to the heavy load (first ``alone``, if asked)."""
    models = Models(
        args,
        {"heavy": "heavy-model", "light": "light-model"},
        [Tenant("heavy"), Tenant("light")],
        max_model_concurrency=args.concurrency,
        max_num_batched_tokens=args.max_num_batched_tokens,  # None: the engine's default
        scheduling_policy=policy,
    )
    light, warm = models.start("light"), SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for tenant in ("heavy", "light"):
        list(models.start(tenant)(prompts(LIGHT_PROMPT), warm, tenant))
    out: dict[str, Any] = {}
    if alone:
        log("light tenant alone")
        out["alone"] = summary(light_ttfts(light, prompts, args.light_requests, args.light_gap))
    log(f"{policy}: heavy load of {args.heavy_inflight}, {args.concurrency} running")
    heavy = Load(models.start("heavy"), prompts, "heavy", args.heavy_inflight, HEAVY_PROMPT, HEAVY_TOKENS)
    try:
        heavy.wait_for(finished=args.concurrency)  # past the first batch, which ran in lockstep
        time.sleep(args.warmup)
        t0 = time.perf_counter()
        out[policy] = summary(light_ttfts(light, prompts, args.light_requests, args.light_gap))
        out[policy]["heavy_tokens_per_s"] = round(heavy.tokens_per_s(t0, time.perf_counter()), 2)
        out[policy]["heavy_waiting_at_end"] = models.num_waiting()
    finally:
        heavy.stop()
    del heavy, light, models
    gc.collect()
    return out


def shares(args: argparse.Namespace, prompts: Prompts, weights: tuple[float, float]) -> dict[str, Any]:
    """Two backlogged tenants under ``fair``: each one's weighted service in the window."""
    log(f"shares, weights {weights[0]:g}:{weights[1]:g}")
    names = ("a", "b")
    models = Models(
        args,
        {n: f"{n}-model" for n in names},
        [Tenant(n, weight=w) for n, w in zip(names, weights)],
        max_model_concurrency=SHARE_CONCURRENCY,
        scheduling_policy="fair",
    )
    loads = [
        Load(models.start(n), prompts, n, SHARE_INFLIGHT, SHARE_PROMPT, (SHARE_TOKENS, SHARE_TOKENS))
        for n in names
    ]
    try:
        for load in loads:  # past the first burst: the first few slots go to whoever came first
            load.wait_for(started=SHARE_CONCURRENCY + 1)
        time.sleep(args.warmup)
        t0 = time.perf_counter()
        time.sleep(args.share_seconds)
        t1 = time.perf_counter()
    finally:
        for load in loads:
            load.stop()
    served = [load.service(t0, t1) for load in loads]
    total = sum(served)
    rows = []
    for name, w, s in zip(names, weights, served):
        share, target = s / total, w / sum(weights)
        error = share / target - 1
        rows.append(
            {"tenant": name, "weight": w, "service_tokens": s, "share": round(share, 4),
             "target": round(target, 4), "relative_error": round(error, 4), "pass": abs(error) <= 0.1}
        )  # fmt: skip
    del loads, models
    gc.collect()
    return {"weights": list(weights), "seconds": round(t1 - t0, 2), "tenants": rows}


def tables(r: dict[str, Any]) -> str:
    lat, goals = r["latency"], r["goals"]
    lines = [
        f"## Light tenant TTFT ({r['model']}{', each tenant on its own model' if r['cross_model'] else ''};"
        + f" heavy: {r['heavy_inflight']} in flight,"
        + f" {r['concurrency']} running; max_num_batched_tokens {r['max_num_batched_tokens']})\n",
        "| run | requests | median ms | p99 ms |",
        "|---|---:|---:|---:|",
    ]
    for run in ("alone", "fcfs", "fair"):
        s = lat[run]
        lines.append(f"| {run} | {s['n']} | {s['median_s'] * 1000:.1f} | {s['p99_s'] * 1000:.1f} |")
    lines += ["", "| goal | value | target | result |", "|---|---:|---:|---|"]
    for g in goals:
        bound = ">=" if g.get("at_least") else "<="
        lines.append(f"| {g['name']} | {g['value']:.3f}x | {bound} {g['target']:g}x | {_ok(g['pass'])} |")
    lines += [
        "",
        f"## Shares under fair ({SHARE_CONCURRENCY} running, {SHARE_INFLIGHT} in flight each,"
        + f" {r['share_seconds']:g} s)\n",
        "| weights | tenant | weight | service tokens | share | target | error | result |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for run in r["shares"]:
        ws = ":".join(f"{w:g}" for w in run["weights"])
        for t in run["tenants"]:
            lines.append(
                f"| {ws} | {t['tenant']} | {t['weight']:g} | {t['service_tokens']} | {t['share']:.3f} | "
                f"{t['target']:.3f} | {t['relative_error']:+.1%} | {_ok(t['pass'])} |"
            )
    return "\n".join(lines)


def _ok(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def parser() -> argparse.ArgumentParser:
    """The settings, as ``benches/fairness.py`` takes them; ``lmplex bench`` parses its own list."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--heavy-inflight", type=int, default=14)
    ap.add_argument("--concurrency", type=int, default=8, help="running requests in the latency runs")
    ap.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="most tokens in a step in the latency runs (default: the engine's)",
    )
    ap.add_argument("--light-requests", type=int, default=40)
    ap.add_argument("--light-gap", type=float, default=0.25, help="seconds between light requests")
    ap.add_argument("--share-seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of load before measuring")
    ap.add_argument("--quick", action="store_true", help="6 heavy (4 running), 8 light, 4 s windows")
    ap.add_argument(
        "--cross-model", action="store_true", help="each tenant on its own model: two models of one host"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    return ap


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both parts with ``args`` (from :func:`parser`); the report :func:`tables` prints."""
    if args.quick:
        args.heavy_inflight, args.concurrency, args.light_requests = 6, 4, 8
        args.share_seconds, args.warmup = 4.0, 1.0
    filler = lmplex.Engine(args.model, max_model_len=64, max_model_concurrency=1).tokenize(FILLER)
    prompts = Prompts(filler)
    gc.collect()
    latency_runs = {
        **latency(args, prompts, "fcfs", alone=True),
        **latency(args, prompts, "fair", alone=False),
    }
    fair_p99 = latency_runs["fair"]["p99_s"]
    heavy = latency_runs["fair"]["heavy_tokens_per_s"] / latency_runs["fcfs"]["heavy_tokens_per_s"]
    goals: list[dict[str, Any]] = [
        {"name": "fair p99 / fcfs p99", "value": fair_p99 / latency_runs["fcfs"]["p99_s"], "target": 0.3},
        {"name": "fair p99 / alone p99", "value": fair_p99 / latency_runs["alone"]["p99_s"], "target": 2.0},
        {"name": "heavy throughput fair / fcfs", "value": heavy, "target": 0.9, "at_least": True},
    ]
    for g in goals:
        g["value"] = round(g["value"], 4)
        g["pass"] = g["value"] >= g["target"] if g.get("at_least") else g["value"] <= g["target"]
    report: dict[str, Any] = {
        **provenance(),
        "model": args.model,
        "cross_model": args.cross_model,
        "heavy_inflight": args.heavy_inflight,
        "concurrency": args.concurrency,
        "max_num_batched_tokens": args.max_num_batched_tokens or lmplex._core.DEFAULT_MAX_NUM_BATCHED_TOKENS,
        "heavy_throughput_vs_fcfs": round(heavy, 4),
        "share_seconds": args.share_seconds,
        "latency": latency_runs,
        "goals": goals,
        "shares": [shares(args, prompts, (1.0, 1.0)), shares(args, prompts, (1.0, 3.0))],
    }
    report["pass"] = all(g["pass"] for g in goals) and all(
        t["pass"] for run in report["shares"] for t in run["tenants"]
    )
    return report


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    report = run(args)
    print(json.dumps(report, indent=2) if args.json else tables(report), flush=True)


if __name__ == "__main__":
    main()

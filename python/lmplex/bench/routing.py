"""TierSet routing on two real models behind ``lmplex serve``: SmolLM2-135M in the ``fast`` tier and
Qwen2.5-Coder-0.5B in the ``deep`` tier. Not a test: it prints markdown tables (``--json``: one JSON
object instead).

    python benches/routing.py                 # about 4 minutes on 2 CPU cores
    python benches/routing.py --quick --json  # smoke test
    lmplex bench --workloads routing          # the same, in lmplex bench's JSON

The workload, open loop: ``--requests`` chat calls arrive as a Poisson process of ``--rate`` per second,
and every ``--burst-every`` seconds ``--burst`` more arrive at once. Each asks for 16, 32 or 48 tokens
(greedy, ignoring EOS, so the output length is the one predicted) with a latency budget drawn uniformly
from 0.5x to 4x what the deep model takes alone for that length (measured first, ``--calibrate`` calls
each). The same schedule runs twice: routed (``"model": "lmplex:auto"``, mode ``deep``, the budget in
``max_latency_ms``) and always-deep (``"model": "deep"``, no budget).

Reported: the share of routed calls accepted (the rest got 400 ``budget_unsatisfiable``; goal >= 90%),
the share of accepted calls whose measured latency (client side, request sent to reply read) was
within their budget (goal >= 99.5%), the same share for always-deep over the same calls, the routed
cost over the always-deep cost of those calls (usage tokens at each model's prices), where the routed
calls ran, the prediction error: measured over predicted latency (``x-lmplex-predicted-latency-ms``),
p50 and p90, and every routed call (``calls``). Prices are per million tokens, proportional to the models' sizes (0.135 and 0.5 input, twice that
output); quality 40 and 60 (only the order matters). The decision time is a criterion bench
(``cargo bench -p lmplex-route --bench select``). Percentiles are nearest-rank.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from lmplex.bench.provenance import provenance
from lmplex.models import resolve

MODELS = {"fast": ("smollm2-135m-instruct", 40.0, 0.135), "deep": ("qwen2.5-coder-0.5b-instruct", 60.0, 0.5)}
LENGTHS = (16, 32, 48)
QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain what a hash map is in two sentences.",
    "List three uses of salt.",
    "How do trains stay on their tracks?",
    "Write a haiku about volcanoes.",
    "What does the HTTP status code 404 mean?",
    "Sort the numbers 5, 2, 9, 1 in ascending order and explain how.",
]


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def server_config() -> str:
    lines = ["port = 0"]
    for name, (alias, quality, price) in MODELS.items():
        lines += [
            "[[models]]",
            f'model_id = "{resolve(alias)}"',
            f'served_model_name = "{name}"',
            "max_model_len = 1024",
            "max_model_concurrency = 8",
            f"quality = {quality}",
            f"price_per_million_input_tokens = {price}",
            f"price_per_million_output_tokens = {2 * price}",
        ]
    lines += ["[tiers]", 'fast = ["fast"]', 'deep = ["deep"]']
    return "\n".join(lines) + "\n"


class Server:
    """``lmplex serve`` in a subprocess on a free port."""

    def __init__(self, tmp: Path) -> None:
        config, self.address = tmp / "routing.toml", tmp / "routing.url"
        config.write_text(server_config())
        cmd = [
            sys.executable,
            "-m",
            "lmplex",
            "serve",
            "--config",
            str(config),
            "--address-file",
            str(self.address),
        ]
        self.log = open(tmp / "routing.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 300
        while not self.address.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: {(tmp / 'routing.log').read_text()[-2000:]}")
            time.sleep(0.1)
        self.url = self.address.read_text().strip()
        while httpx.get(f"{self.url}/ready").status_code != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server was not ready")
            time.sleep(0.2)

    def stop(self, keep_log: str | None = None) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()
        if keep_log:
            Path(keep_log).write_bytes(Path(self.log.name).read_bytes())


def call(
    client: httpx.Client, url: str, model: str, question: str, max_tokens: int, budget: float | None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    if budget is not None:
        body["lmplex"] = {"mode": "deep", "max_latency_ms": budget}
    t = time.perf_counter()
    r = client.post(f"{url}/v1/chat/completions", json=body)
    latency_ms = 1e3 * (time.perf_counter() - t)
    if r.status_code != 200:
        error = r.json()["error"]
        assert error["code"] == "budget_unsatisfiable", r.text
        return {"accepted": False}
    out = r.json()
    model_used, usage = out["model"], out["usage"]
    price = MODELS[model_used][2]
    cost = (usage["prompt_tokens"] * price + usage["completion_tokens"] * 2 * price) / 1e6
    predicted = float(r.headers.get("x-lmplex-predicted-latency-ms", "nan"))
    return {
        "accepted": True,
        "model": model_used,
        "latency_ms": latency_ms,
        "predicted_ms": predicted,
        "server_overrun_ms": float(r.headers.get("x-lmplex-budget-overrun-ms", "0")),
        "cost": cost,
    }


def schedule(args: argparse.Namespace, deep_alone_ms: dict[int, float]) -> list[dict[str, Any]]:
    """Arrival times (s), questions, lengths and budgets of the whole run."""
    rng = random.Random(args.seed)
    out: list[dict[str, Any]] = []
    t, next_burst = 0.0, args.burst_every
    while len(out) < args.requests:
        t += rng.expovariate(args.rate)
        while next_burst <= t and len(out) < args.requests:
            out += [{"at": next_burst} for _ in range(min(args.burst, args.requests - len(out)))]
            next_burst += args.burst_every
        if len(out) < args.requests:
            out.append({"at": t})
    for r in out:
        n = rng.choice(LENGTHS)
        r.update(
            question=rng.choice(QUESTIONS),
            max_tokens=n,
            budget=round(rng.uniform(0.5, 4.0) * deep_alone_ms[n], 1),
        )
    return sorted(out, key=lambda r: r["at"])


def replay(url: str, plan: list[dict[str, Any]], routed: bool) -> list[dict[str, Any]]:
    with httpx.Client(timeout=600) as client, concurrent.futures.ThreadPoolExecutor(64) as pool:
        start = time.perf_counter()

        def one(r: dict[str, Any]) -> dict[str, Any]:
            time.sleep(max(0.0, start + r["at"] - time.perf_counter()))
            model = "lmplex:auto" if routed else "deep"
            return call(client, url, model, r["question"], r["max_tokens"], r["budget"] if routed else None)

        return list(pool.map(one, plan))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both passes with ``args`` (from :func:`parser`); the report :func:`tables` prints."""
    if args.quick:
        args.requests, args.calibrate = 30, 2
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp))
        try:
            with httpx.Client(timeout=600) as c:
                deep_alone_ms = {
                    n: sorted(
                        call(c, server.url, "deep", QUESTIONS[0], n, None)["latency_ms"]
                        for _ in range(args.calibrate)
                    )[args.calibrate // 2]
                    for n in LENGTHS
                }
            plan = schedule(args, deep_alone_ms)
            routed = replay(server.url, plan, routed=True)
            deep = replay(server.url, plan, routed=False)
        finally:
            server.stop(args.server_log)
    pairs = [(p, r, d) for p, r, d in zip(plan, routed, deep) if r["accepted"]]
    within = [r["latency_ms"] <= p["budget"] for p, r, _ in pairs]
    deep_within = [d["latency_ms"] <= p["budget"] for p, _, d in pairs]
    ratios = [r["latency_ms"] / r["predicted_ms"] for _, r, _ in pairs if r["predicted_ms"] > 0]
    report: dict[str, Any] = {
        **provenance(),
        "models": {k: v[0] for k, v in MODELS.items()},
        "requests": len(plan),
        "rate_per_s": args.rate,
        "burst": args.burst,
        "deep_alone_ms": {str(k): round(v, 1) for k, v in deep_alone_ms.items()},
        "accepted_share": round(len(pairs) / len(plan), 4),
        "within_budget_share": round(sum(within) / max(1, len(within)), 4),
        "always_deep_within_budget_share": round(sum(deep_within) / max(1, len(deep_within)), 4),
        "cost_vs_always_deep": round(
            sum(r["cost"] for _, r, _ in pairs) / max(1e-12, sum(d["cost"] for _, _, d in pairs)), 4
        ),
        "ran_on": {m: sum(1 for _, r, _ in pairs if r["model"] == m) for m in MODELS},
        "latency_over_predicted": {
            "p50": round(pct(ratios, 50), 3),
            "p90": round(pct(ratios, 90), 3),
            "max": round(max(ratios, default=math.nan), 3),
        },
        # Every routed call, to find what overruns: when it came (s), its length and budget, and
        # (accepted) where it ran, the prediction, the client's latency and the server's overrun.
        "calls": [
            {
                "at": round(p["at"], 3),
                "max_tokens": p["max_tokens"],
                "budget_ms": p["budget"],
                **(
                    {
                        "model": r["model"],
                        "predicted_ms": round(r["predicted_ms"], 1),
                        "latency_ms": round(r["latency_ms"], 1),
                        "server_overrun_ms": r["server_overrun_ms"],
                    }
                    if r["accepted"]
                    else {"accepted": False}
                ),
            }
            for p, r in zip(plan, routed)
        ],
    }
    report["goals"] = [
        {
            "name": "accepted calls within budget",
            "value": report["within_budget_share"],
            "target": 0.995,
            "pass": report["within_budget_share"] >= 0.995,
        },
        {
            "name": "routed calls accepted",
            "value": report["accepted_share"],
            "target": 0.9,
            "pass": report["accepted_share"] >= 0.9,
        },
    ]
    report["pass"] = all(g["pass"] for g in report["goals"])
    return report


def tables(r: dict[str, Any]) -> str:
    lo = r["latency_over_predicted"]
    lines = [
        f"## Routing ({r['requests']} calls, {r['rate_per_s']}/s + bursts of {r['burst']}; fast: {r['models']['fast']}, deep: {r['models']['deep']})\n",
        "| figure | value |",
        "|---|---:|",
        f"| accepted (the rest: budget_unsatisfiable) | {r['accepted_share']:.1%} (goal >= 90%) |",
        f"| accepted calls within their latency budget | {r['within_budget_share']:.1%} (goal >= 99.5%) |",
        f"| the same calls on always-deep, within budget | {r['always_deep_within_budget_share']:.1%} |",
        f"| cost / always-deep cost | {r['cost_vs_always_deep']:.3f} |",
        f"| ran on fast / deep | {r['ran_on']['fast']} / {r['ran_on']['deep']} |",
        f"| measured / predicted latency p50, p90, max | {lo['p50']:.2f}, {lo['p90']:.2f}, {lo['max']:.2f} |",
        f"| deep alone, 16 / 32 / 48 tokens | {' / '.join(f'{v:.0f} ms' for v in r['deep_alone_ms'].values())} |",
    ]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--rate", type=float, default=2.0, help="Poisson arrivals per second")
    ap.add_argument("--burst", type=int, default=8, help="calls that arrive at once every --burst-every s")
    ap.add_argument("--burst-every", type=float, default=15.0)
    ap.add_argument(
        "--calibrate", type=int, default=3, help="deep calls alone per length (the median is kept)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="30 calls, 2 calibration calls")
    ap.add_argument(
        "--server-log",
        help="keep the server's log here (with LMPLEX_LOG=debug it holds every prediction, target lmplex::route)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    report = run(args)
    print(json.dumps(report, indent=2) if args.json else tables(report), flush=True)


if __name__ == "__main__":
    main()

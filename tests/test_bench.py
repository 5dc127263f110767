"""``lmplex bench --quick`` end to end on SmolLM2 (lmplex only; peers are optional and skipped with a
reason when absent): the JSON records the machine, a measured bandwidth and every workload with
positive figures, the decode roofline is computed from the model's bytes, and ``--plot`` writes PNGs."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from lmplex.bench.cli import _ratios


def test_quick_bench_writes_json_and_plots(smollm2_path: str, tmp_path: Path) -> None:
    out, plots = tmp_path / "bench.json", tmp_path / "plots"
    cmd = [sys.executable, "-m", "lmplex", "bench", "--quick", "--repeats", "1", "--threads", "2"]
    cmd += ["--peers", "nonexistent-peer", "--out", str(out), "--plot", str(plots)]
    cmd += ["--workloads", "decode", "prefill", "throughput", "batched", "online"]
    subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ})
    result = json.loads(out.read_text())
    machine = result["machine"]
    assert (
        machine["threads"] == 2
        and machine["memory_bandwidth_gb_s"] > 0
        and machine["read_bandwidth_gb_s"] > 0
    )
    (run,) = result["runs"]
    assert run["skipped"]["nonexistent-peer"].startswith("no adapter for this peer (known: llama.cpp")
    res = run["results"]
    (decode,) = res["decode"]
    assert decode["system"] == "lmplex" and decode["generated_tokens"] == 64
    assert decode["decode_tok_s"] > 0 and 0 < decode["roofline_pct"] and 0 < decode["read_roofline_pct"]
    assert [r["prompt_tokens"] for r in res["prefill"]] == [128, 512]
    assert all(r["prefill_tok_s"] > 0 for r in res["prefill"])
    (tp,) = res["throughput"]
    assert tp["requests"] == 8 and 8 * 16 <= tp["generated_tokens"] <= 8 * 128
    (batched,) = res["batched"]
    assert (batched["concurrency"], batched["generated_tokens"]) == (4, 64)
    assert batched["decode_tok_s"] > 0 and batched["batch1_decode_tok_s"] > 0
    pairs = batched["speedup_per_pair"]
    assert len(pairs) == 1 and pairs[0] > 0  # one pair per --repeats
    assert batched["speedup_vs_batch1"] == statistics.median(pairs)
    (online,) = res["online"]
    assert set(online["ttft_s"]) == {"p50", "p90", "p99"} and online["itl_s"]["p50"] > 0
    for name in ["decode", "prefill", "throughput", "batched", "online"]:
        assert (plots / f"{name}.png").read_bytes().startswith(b"\x89PNG")


def test_ratios_are_lmplex_over_each_peer_per_size() -> None:
    res = {
        "decode": [
            {"system": "lmplex", "generated_tokens": 128, "decode_tok_s": 30.0},
            {"system": "llama.cpp", "generated_tokens": 128, "decode_tok_s": 20.0},
        ],
        "prefill": [
            {"system": "lmplex", "prompt_tokens": 128, "prefill_tok_s": 50.0},
            {"system": "llama.cpp", "prompt_tokens": 128, "prefill_tok_s": 100.0},
        ],
    }
    assert _ratios(res) == {"decode_128_vs_llama.cpp": 1.5, "prefill_128_vs_llama.cpp": 0.5}


def test_fairness_workload_measures_both_policies_and_shares(smollm2_path: str, tmp_path: Path) -> None:
    """``lmplex bench --quick --workloads fairness``: the light tenant's TTFT alone, under fcfs and under
    fair, and two backlogged tenants' shares at weights 1:1 and 1:3. The figures are real measurements
    on 2 loaded cores over 4 s windows, so only what holds by a wide margin is asserted: fair beats fcfs
    (0.02-0.1x in runs so far), and the weights order the shares (within 10% of them in quiet runs;
    the exact shares are asserted deterministically in crates/lmplex-sched/tests/fair.rs)."""
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "lmplex", "bench", "--quick", "--workloads", "fairness", "--threads", "2"]
    cmd += ["--peers", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ})
    (run,) = json.loads(out.read_text())["runs"]
    fair = run["results"]["fairness"]
    lat = fair["latency"]
    assert {k: lat[k]["n"] for k in ("alone", "fcfs", "fair")} == {"alone": 8, "fcfs": 8, "fair": 8}
    assert 0 < lat["alone"]["median_s"] and lat["fair"]["p99_s"] < 0.5 * lat["fcfs"]["p99_s"]
    names = [g["name"] for g in fair["goals"]]
    assert names == ["fair p99 / fcfs p99", "fair p99 / alone p99", "heavy throughput fair / fcfs"]
    assert fair["max_num_batched_tokens"] == 2048, "the engine's default"
    assert lat["fair"]["heavy_tokens_per_s"] > 0 and lat["fcfs"]["heavy_tokens_per_s"] > 0, lat
    even, skewed = (run_["tenants"] for run_ in fair["shares"])
    for rows in (even, skewed):
        assert abs(sum(r["share"] for r in rows) - 1) < 1e-3 and all(r["service_tokens"] > 0 for r in rows), (
            rows
        )
    assert all(0.25 < r["share"] < 0.75 for r in even), even
    assert skewed[1]["share"] > skewed[0]["share"], skewed  # weights 1:3


def test_routing_workload_keeps_budgets_and_reports_cost(
    smollm2_path: str, qwen_coder_path: str, tmp_path: Path
) -> None:
    """``lmplex bench --quick --workloads routing``: 30 deep-mode calls with latency budgets over SmolLM2
    (fast) and Qwen2.5-Coder (deep), routed and then always-deep. Asserted: the report's shape, that
    every routed call ran or was refused (and is listed), and that accepted calls met their budgets (the
    goal is 99.5%, measured by the bench itself; on 2 loaded cores only a wide margin is asserted: 80%,
    since a CI run of 26 accepted calls gave 88%)."""
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "lmplex", "bench", "--quick", "--workloads", "routing", "--threads", "2"]
    cmd += ["--peers", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ})
    (run,) = json.loads(out.read_text())["runs"]
    r = run["results"]["routing"]
    assert r["requests"] == 30 and 0 < r["accepted_share"] <= 1
    assert sum(r["ran_on"].values()) == round(30 * r["accepted_share"])
    calls = r["calls"]
    assert len(calls) == 30 and sum("model" in c for c in calls) == sum(r["ran_on"].values()), calls
    assert all(c["latency_ms"] > 0 and c["predicted_ms"] > 0 for c in calls if "model" in c), calls
    assert r["within_budget_share"] >= 0.8, r
    assert 0 < r["cost_vs_always_deep"] <= 1.0 + 1e-9, r
    assert r["latency_over_predicted"]["p50"] > 0


def test_decode_runs_take_turns_and_keep_each_systems_median() -> None:
    from lmplex.bench import workloads
    from lmplex.bench.systems import Timing

    calls: list[tuple[str, int]] = []

    class Fake:
        version = "0"

        def __init__(self, name: str, seconds: list[float]) -> None:
            self.name, self.seconds = name, iter(seconds)

        def run(self, prompt: list[int], max_tokens: int) -> Timing:
            calls.append((self.name, max_tokens))
            total = next(self.seconds) if max_tokens > 4 else 1.0  # the warm-up takes 1 s
            return Timing(ttft_s=0.0, total_s=total, tokens=max_tokens)

        def run_mix(self, requests: list[tuple[list[int], int]]) -> tuple[float, int]:
            raise AssertionError("not a decode run")

    a, b = Fake("a", [1.0, 3.0, 2.0]), Fake("b", [10.0, 5.0, 20.0])
    out = workloads.decode([a, b], [1, 2, 3], 11, 3)
    assert calls == [("a", 4), ("b", 4)] + [("a", 11), ("b", 11)] * 3
    # 10 tokens after the first over the median time of each system's three runs
    assert out == [
        {"generated_tokens": 11, "decode_tok_s": 5.0},
        {"generated_tokens": 11, "decode_tok_s": 1.0},
    ]


def test_the_gpu_model_workload_prints_the_committed_figures(tmp_path: Path) -> None:
    """``lmplex bench --workloads gpu-model --json``: the GPU path's device-free figures, printed and
    written. Launches, bytes and modeled times equal the committed ``docs/bench/gpu-model.json`` (a
    change to the launches or their bytes must come with that file rerun); the host time per decode
    step, measured on this machine, is there for every batch."""
    out = tmp_path / "gpu-model.json"
    cmd = [sys.executable, "-m", "lmplex", "bench", "--workloads", "gpu-model", "--json", "--out", str(out)]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed == json.loads(out.read_text())
    committed = json.loads((Path(__file__).parent.parent / "docs" / "bench" / "gpu-model.json").read_text())
    assert set(printed["shapes"]) == {"llama-3.2-1b", "llama-3-8b"}
    for name, shape in printed["shapes"].items():
        assert set(shape["decode"]) == {"1", "64", "256"}
        for step, figures in [*shape["decode"].items(), ("prefill_1000", shape["prefill_1000"])]:
            was = (
                committed["shapes"][name]["decode"][step]
                if step != "prefill_1000"
                else committed["shapes"][name][step]
            )
            host = figures.pop("host_us_per_step", None)
            was = {k: v for k, v in was.items() if k != "host_us_per_step"}
            assert figures == was, f"{name} {step}: rerun the command into docs/bench/gpu-model.json"
            assert figures["launches_per_layer"] > 0 and figures["bytes_ratio"] >= 1.0
            assert 0 < figures["modeled_roofline_pct"] <= 100
            assert (host is not None and host > 0) == (step != "prefill_1000"), (
                f"{name} {step}: host time {host}"
            )

"""The figures the README and docs/performance.md quote are those of the committed benchmark runs
(``docs/bench/*.json``), so a claim cannot drift from its run: the README's CPU ratios against
llama.cpp and its batched speedup, and performance.md's main CPU table and batched lines, are
recomputed here from ``docs/bench/bench-cpu.json`` (written by ``lmplex bench --out``) and must
appear exactly as these tests word them; so are docs/tenants.md's fairness tables, from
``docs/bench/fairness-cpu.json`` and ``fairness-cross-model-cpu.json``, and docs/cuda.md's device-free
GPU tables."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def readme_text() -> str:
    """The README with its line breaks folded into spaces."""
    return re.sub(r"\s+", " ", (ROOT / "README.md").read_text())


def span(values: list[float]) -> str:
    lo, hi = f"{min(values):.1f}", f"{max(values):.1f}"
    return f"{lo}x" if lo == hi else f"{lo}–{hi}x"


def test_the_readmes_cpu_figures_are_the_committed_runs() -> None:
    bench: dict[str, Any] = json.loads((ROOT / "docs" / "bench" / "bench-cpu.json").read_text())
    runs = bench["runs"]
    ratios = [r["ratios"] for r in runs]
    decode = [v for r in ratios for k, v in r.items() if k.startswith("decode_")]
    prefill = [v for r in ratios for k, v in r.items() if k.startswith("prefill_")]
    batched = [b for r in runs for b in r["results"].get("batched", []) if b["system"] == "lmplex"]
    assert decode and prefill and batched, "the CPU benchmark run lacks decode, prefill or batched results"
    conc = {b["concurrency"] for b in batched}
    assert len(conc) == 1
    machine = bench["machine"]
    claim = (
        f"On a {machine['cpus']}-core {machine['cpu']}, lmplex decodes {span(decode)} and prefills "
        f"{span(prefill)} as fast as llama.cpp on the same GGUF, and {conc.pop()} batched requests decode "
        f"{span([b['speedup_vs_batch1'] for b in batched])} as fast as one"
    )
    assert claim in readme_text(), f"README should say: {claim}"


def test_the_cpu_table_of_performance_md_is_the_committed_run() -> None:
    """docs/performance.md's main CPU table and its batched lines, row by row from the JSON."""
    bench: dict[str, Any] = json.loads((ROOT / "docs" / "bench" / "bench-cpu.json").read_text())
    page = (ROOT / "docs" / "performance.md").read_text()
    runs = bench["runs"]

    def pair(run: dict[str, Any], workload: str, size_key: str | None, size: int | None, rate: str) -> str:
        rows = [r for r in run["results"][workload] if size_key is None or r[size_key] == size]
        by = {r["system"]: r[rate] for r in rows}
        return f"{by['lmplex']:.1f} / {by['llama.cpp']:.1f}"

    expected = []
    for workload, size_key, rate, label in [
        ("decode", "generated_tokens", "decode_tok_s", "decode, {n:,} tokens"),
        ("prefill", "prompt_tokens", "prefill_tok_s", "prefill, {n:,} tokens"),
    ]:
        for size in bench["config"]["sizes"][workload]:
            cells = [
                f"{pair(run, workload, size_key, size, rate)} | {run['ratios'][f'{workload}_{size}_vs_llama.cpp']:.2f}"
                for run in runs
            ]
            expected.append(f"| {label.format(n=size)} | {' | '.join(cells)} |")
    mix = bench["config"]["sizes"]["mix"]
    cells = [
        f"{pair(run, 'throughput', None, None, 'tok_s')} | {run['ratios'][f'throughput_{mix}_vs_llama.cpp']:.2f}"
        for run in runs
    ]
    expected.append(f"| throughput, {mix}-request mix | {' | '.join(cells)} |")
    for run in runs:
        b = next(r for r in run["results"]["batched"] if r["system"] == "lmplex")
        pairs = [f"{p:.2f}" for p in b["speedup_per_pair"]]
        expected.append(
            f"{b['decode_tok_s']:.1f} tok/s against {b['batch1_decode_tok_s']:.1f} "
            f"({b['speedup_vs_batch1']:.2f}x; the pairs {', '.join(pairs[:-1])} and {pairs[-1]}x)"
        )
    missing = [row for row in expected if row not in page]
    assert not missing, "docs/performance.md should have:\n" + "\n".join(missing)


def gpu_model_rows(report: dict[str, Any]) -> list[str]:
    """docs/cuda.md's tables of the GPU path's device-free figures, row by row, from
    ``docs/bench/gpu-model.json`` (``lmplex bench --workloads gpu-model --json``)."""
    rows = []
    for name, shape in report["shapes"].items():
        rows.append(
            f"| {name} | launches per layer | launches per step | bytes / minimum | modeled H100 ms "
            "| % of roofline | host µs per step |"
        )
        steps = [(f"decode, batch {b}", f) for b, f in shape["decode"].items()]
        steps.append((f"prefill, {report['settings']['prefill_tokens']:,} tokens", shape["prefill_1000"]))
        for label, f in steps:
            host = f.get("host_us_per_step")
            rows.append(
                f"| {label} | {f['launches_per_layer']} | {f['launches_per_step']} | {f['bytes_ratio']:.3f} "
                f"| {f['modeled_step_ms']:.3f} | {f['modeled_roofline_pct']:.1f} | {'' if host is None else f'{host:.0f}'} |"
            )
    # The tile GEMM's table: each step of each shape with `LMPLEX_CUDA_GEMM=tiles`.
    names = list(report["shapes"])
    rows.append(
        "| tile GEMM | "
        + " | ".join(f"{n}: bytes / minimum | modeled H100 ms | % of roofline" for n in names)
        + " |"
    )
    keys = [("decode", b) for b in report["shapes"][names[0]]["decode"]] + [("prefill_1000", "")]
    for kind, batch in keys:
        label = f"decode, batch {batch}" if batch else "prefill, 1,000 tokens"
        cells = []
        for n in names:
            step = report["shapes"][n][kind]
            t = (step[batch] if batch else step)["tile_gemm"]
            cells.append(
                f"{t['bytes_ratio']:.3f} | {t['modeled_step_ms']:.3f} | {t['modeled_roofline_pct']:.1f}"
            )
        rows.append(f"| {label} | {' | '.join(cells)} |")
    # The fused kernels' table: the tile GEMM with `LMPLEX_CUDA_FUSED=1`.
    rows.append(
        "| fused | "
        + " | ".join(f"{n}: launches per layer | bytes / minimum | % of roofline" for n in names)
        + " |"
    )
    for kind, batch in keys:
        label = f"decode, batch {batch}" if batch else "prefill, 1,000 tokens"
        cells = []
        for n in names:
            step = report["shapes"][n][kind]
            t = (step[batch] if batch else step)["fused"]
            cells.append(
                f"{t['launches_per_layer']} | {t['bytes_ratio']:.3f} | {t['modeled_roofline_pct']:.1f}"
            )
        rows.append(f"| {label} | {' | '.join(cells)} |")
    # Every switch on: the fused kernels' launches and bytes, attention's products on the tensor cores.
    rows.append(
        "| every switch | " + " | ".join(f"{n}: modeled H100 ms | % of roofline" for n in names) + " |"
    )
    for kind, batch in keys:
        label = f"decode, batch {batch}" if batch else "prefill, 1,000 tokens"
        cells = []
        for n in names:
            step = report["shapes"][n][kind]
            t = (step[batch] if batch else step)["every_switch"]
            cells.append(f"{t['modeled_step_ms']:.3f} | {t['modeled_roofline_pct']:.1f}")
        rows.append(f"| {label} | {' | '.join(cells)} |")
    return rows


def test_the_gpu_model_tables_of_cuda_md_are_the_committed_run() -> None:
    report: dict[str, Any] = json.loads((ROOT / "docs" / "bench" / "gpu-model.json").read_text())
    page = (ROOT / "docs" / "cuda.md").read_text()
    missing = [row for row in gpu_model_rows(report) if row not in page]
    assert not missing, "docs/cuda.md should have:\n" + "\n".join(missing)


def check_fairness_figures(run: dict[str, Any], doc: str, rows: dict[str, str], shares_title: str) -> None:
    """The TTFT rows, the goals' sentence and the share rows of one fairness run, as docs/tenants.md
    quotes them."""
    lat, goals = run["latency"], {g["name"]: g for g in run["goals"]}
    assert run["pass"] and all(g["pass"] for g in goals.values()), "the committed fairness run misses a goal"
    for key, label in rows.items():
        row = f"| {label} | {lat[key]['median_s'] * 1000:.1f} | {lat[key]['p99_s'] * 1000:.1f} |"
        assert row in doc, row
    claim = (
        f"p99 is {goals['fair p99 / fcfs p99']['value']:.3f}x what it is under `fcfs` and "
        f"{goals['fair p99 / alone p99']['value']:.2f}x what it is alone"
    )
    assert claim in doc, claim
    heavy = f"{goals['heavy throughput fair / fcfs']['value']:.2f}x the tokens a second it does under `fcfs`"
    assert heavy in doc, heavy
    assert shares_title in doc, shares_title
    for share in run["shares"]:
        weights = ":".join(f"{w:g}" for w in share["weights"])
        for t in share["tenants"]:
            row = f"| {weights} | {t['tenant']} | {t['service_tokens']} | {t['share']:.3f} | {t['target']:.3f} |"
            assert row in doc, row


def test_the_fairness_figures_of_tenants_md_are_the_committed_run() -> None:
    run: dict[str, Any] = json.loads((ROOT / "docs" / "bench" / "fairness-cpu.json").read_text())
    doc = re.sub(r"\s+", " ", (ROOT / "docs" / "tenants.md").read_text())
    assert not run.get("cross_model")
    assert f"at the engine's defaults (`max_num_batched_tokens` {run['max_num_batched_tokens']})" in doc
    rows = {
        "alone": "| light tenant's TTFT | median ms | p99 ms |",
        "fcfs": "next to the heavy tenant, `fcfs`",
        "fair": "next to the heavy tenant, `fair`",
    }
    lat = run["latency"]
    section = doc[
        doc.index(rows.pop("alone")) : doc.index("Across models (`python benches/fairness.py --cross-model`)")
    ]
    assert (
        f"| alone | {lat['alone']['median_s'] * 1000:.1f} | {lat['alone']['p99_s'] * 1000:.1f} |" in section
    )
    check_fairness_figures(run, section, rows, "| weights | tenant | service tokens | share | target |")
    claim = f"({lat['fair']['heavy_tokens_per_s']:.1f} against {lat['fcfs']['heavy_tokens_per_s']:.1f};"
    assert claim in doc, claim


def test_the_cross_model_fairness_figures_of_tenants_md_are_the_committed_run() -> None:
    run: dict[str, Any] = json.loads((ROOT / "docs" / "bench" / "fairness-cross-model-cpu.json").read_text())
    doc = re.sub(r"\s+", " ", (ROOT / "docs" / "tenants.md").read_text())
    assert run["cross_model"] and run["max_num_batched_tokens"] == 2048
    section = doc[doc.index("| light tenant's TTFT, its own model | median ms | p99 ms |") :]
    rows = {
        "alone": "alone",
        "fcfs": "next to the heavy tenant, `fcfs`",
        "fair": "next to the heavy tenant, `fair`",
    }
    title = "| weights, one model each | tenant | service tokens | share | target |"
    check_fairness_figures(run, section, rows, title)


def test_the_quality_tables_of_performance_md_are_the_committed_run() -> None:
    """docs/performance.md's perplexity table and the gap's isolation, line by line as
    ``benches/quality.py`` prints them from ``docs/bench/quality-cpu.json``."""
    spec = importlib.util.spec_from_file_location("quality", ROOT / "benches" / "quality.py")
    assert spec is not None and spec.loader is not None
    quality = importlib.util.module_from_spec(spec)  # benches/quality.py: its tables, not a copy of them
    spec.loader.exec_module(quality)
    run: dict[str, Any] = json.loads((ROOT / "docs" / "bench" / "quality-cpu.json").read_text())
    page = [line.strip() for line in (ROOT / "docs" / "performance.md").read_text().splitlines()]
    for line in [*quality.table(run["rows"]), *quality.isolation_table(run["rows"])]:
        assert line in page, f"docs/performance.md should have: {line}"
    assert f"{run['text']['bytes'] // 1000} kB" in " ".join(page)


def test_the_quantize_comparison_of_quality_md_is_the_committed_run() -> None:
    run: dict[str, Any] = json.loads((ROOT / "docs" / "bench" / "quantize-vs-llama.json").read_text())
    doc = re.sub(r"\s+", " ", (ROOT / "docs" / "quality.md").read_text())
    types = run["types"]
    assert all(t["same_order"] and t["same_bytes"] == t["same_type"] == t["tensors"] for t in types), types
    (count,) = {t["tensors"] for t in types}
    listed = ", ".join(f"`{t['type']}`" for t in types[:-1]) + f" and `{types[-1]['type']}`"
    claim = f"for {listed}, every one of the {count} tensors has the same type and the same bytes, in the same order"
    assert claim in doc, claim


def test_the_lora_tables_of_lora_md_are_the_committed_run() -> None:
    from lmplex.bench.lora import tables

    run: dict[str, Any] = json.loads((ROOT / "docs" / "bench" / "lora-cpu.json").read_text())
    doc = (ROOT / "docs" / "lora.md").read_text()
    assert tables(run) in doc
    assert all(g["met"] for r in run["runs"].values() for g in r["goals"].values())
    # The closing sentence's fractions: the base's throughput lost with 64 adapters, about.
    lost = {
        name: 1 - next(t["vs_base"] for t in r["throughput"] if t["adapters"] == 64)
        for name, r in run["runs"].items()
    }
    assert round(1 / lost["all-linear"]) == 5 and round(1 / lost["q-v"]) == 7, lost
    assert "take about a fifth of the base's throughput, q/v adapters a seventh" in re.sub(r"\s+", " ", doc)


def test_the_benchmark_tables_of_speculative_md_are_the_committed_runs() -> None:
    from lmplex.bench.spec import tables

    doc = (ROOT / "docs" / "speculative.md").read_text()
    # Prompt lookup; a draft model with both models Q4_K_M, and with the target in bfloat16.
    for name in ("spec-cpu.json", "spec-draft-cpu.json", "spec-draft-bf16-cpu.json"):
        run: dict[str, Any] = json.loads((ROOT / "docs" / "bench" / name).read_text())
        assert tables(run) in doc, name
        goals = run["goals"]
        assert goals["identical_tokens"], f"speculation changed a token in the committed run {name}"
        for key, g in goals.items():
            if key != "identical_tokens":
                assert f"{g['value']}x" in doc, f"docs/speculative.md should quote {key} {g['value']}x"


def _testing_md() -> str:
    return re.sub(r"\s+", " ", (ROOT / "docs" / "testing.md").read_text())


def test_testing_mds_robustness_figures_are_the_committed_runs() -> None:
    """docs/testing.md's schema fuzzing, parser fuzzing and soak figures, from their JSON."""
    doc = _testing_md()
    api = json.loads((ROOT / "docs" / "bench" / "fuzz-api-cpu.json").read_text())
    assert api["server_errors"] == api["hangs"] == api["failures"] == api["panics"] == 0
    assert f"sent {api['cases']:,} calls" in doc
    assert f"{api['statuses']['2xx']:,} answered 2xx, {api['statuses']['4xx']:,} 4xx, none 5xx" in doc
    parsers = json.loads((ROOT / "docs" / "bench" / "fuzz-parsers-cpu.json").read_text())
    assert parsers["passed"] and not parsers["failures"]
    cases = parsers["cases"].values()
    assert f"loaded {parsers['total_cases']:,} corrupted" in doc
    assert f"{min(cases):,} to {max(cases):,} per kind" in doc
    assert f"{parsers['minutes']:g}-minute run" in doc or f"{parsers['minutes']:g} minutes" in doc
    soak = json.loads((ROOT / "docs" / "bench" / "soak-cpu.json").read_text())
    assert soak["passed"] and soak["lost"] == soak["panics"] == soak["replays_wrong"] == 0
    requests = sum(soak["statuses"].values())
    assert soak["statuses"]["2xx"] == requests, "the soak's figures say all 2xx"
    assert f"{soak['minutes']:g}-minute run" in doc
    assert f"sent {soak['total_calls']:,} calls ({requests:,} requests" in doc
    rss = soak["rss_mb"]
    assert (
        f"{rss['start']} MiB after the warm-up and {rss['end']} MiB at the end ({rss['drift_pct']}% drift)"
        in doc
    )
    p99 = [w["p99_s"] for w in soak["windows"]]
    p50 = [w["p50_s"] for w in soak["windows"]]
    assert f"p99 latency {min(p99):.2f} to {max(p99):.2f} s" in doc
    assert f"(max over min {soak['p99_max_over_min']})" in doc
    assert f"p50 {min(p50):.2f} to {max(p50):.2f} s" in doc


def vision_rows(run: dict[str, Any]) -> list[str]:
    """docs/performance.md's images table, row by row, from ``docs/bench/vision-cpu.json``
    (``benches/vision.py``)."""
    rows = ["| system | prompt tokens | time to first token | decode |"]
    for name, s in run["systems"].items():
        rows.append(
            f"| {name} | {s['prompt_tokens']:,} | {s['ttft_s']:.1f} s | {s['decode_tok_s']:.1f} tok/s |"
        )
    return rows


def test_the_vision_table_of_performance_md_is_the_committed_run() -> None:
    run: dict[str, Any] = json.loads((ROOT / "docs" / "bench" / "vision-cpu.json").read_text())
    page = (ROOT / "docs" / "performance.md").read_text()
    missing = [row for row in vision_rows(run) if row not in page]
    assert not missing, "docs/performance.md should have:\n" + "\n".join(missing)
    # ttft_ratio is transformers' time over lmplex's (below 1: lmplex is slower to its first token).
    ratios = f"lmplex is {run['ttft_ratio']:.2f}x as fast as transformers to the first token and {run['decode_ratio']:.2f}x"
    assert ratios in re.sub(r"\s+", " ", page), ratios

"""LoRA adapters on one base: throughput with 1, 8 and 64 adapters against the base alone, the memory a
held adapter takes, and the first token of a request to a cold adapter (read from its folder) against a
warm one. Not a test: it prints a markdown table (``--json``: one JSON object instead).

    python benches/lora.py                     # Qwen2.5-Coder-0.5B, rank 16: q/v, then every projection
    python benches/lora.py --quick --json      # smoke test
    lmplex bench --workloads lora              # the same, in lmplex bench's JSON

Adapters: ``--rank`` on each of ``--targets``: ``q-v`` (``q_proj`` and ``v_proj``, PEFT's default
targets for Llama and Qwen2 models) and ``all-linear`` (every projection); alpha twice the rank, A and
B random (numpy, seeded per adapter; std 0.02) in f32, written as PEFT folders in a temporary
directory, shaped from the model's ``info()``. Every figure below is measured for each.

Throughput: ``--concurrency`` requests in flight, ``--requests`` in all, each a ``--prompt-tokens``
prompt and ``--max-tokens`` greedy tokens ignoring EOS, prefix caching off (every run sends the same
prompts);
generated tokens a second from the first submission to the last token. With N adapters the requests go
to them in turn (``max_loras`` = N, all held); the base alone runs the same load with no adapter. Goal:
64 adapters >= 0.7x the base alone.

Memory: ``memory().lora_adapters`` once every adapter is held, per adapter, less its weights in f32.
Goal: <= 1 MiB per adapter.

Cold start: an engine with ``max_loras`` = 1 and two adapters; a request to adapter A while A is held
(warm), and while B is held (cold: A is read again from its folder, from the page cache), each
``--cold-repeats`` times, first-token latency of a 1-token request with a ``--prompt-tokens`` prompt.
Goal: median cold - median warm <= 50 ms. The machine, versions and git commit are recorded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import lmplex
from lmplex._core import ModelConfig, SamplingParams
from lmplex.bench.provenance import provenance

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TARGETS = {"q-v": ["q_proj", "v_proj"], "all-linear": ALL}
GOALS = {"ratio_64": 0.7, "overhead_mib": 1.0, "cold_minus_warm_ms": 50.0}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="model id (default: %(default)s)")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    p.add_argument("--adapters", type=int, nargs="+", default=[1, 8, 64], help="adapter counts to run")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--cold-repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="smoke test: fewer, shorter requests")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    return p


def shapes(info: Any) -> dict[str, tuple[int, int]]:
    """(in, out) of each projection, from a model's ``info()``."""
    h, i = info.hidden_size, info.intermediate_size
    q, kv = info.num_attention_heads * info.head_dim, info.num_key_value_heads * info.head_dim
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


def write_adapter(folder: Path, info: Any, rank: int, targets: list[str], seed: int) -> int:
    """A random PEFT adapter in ``folder``; returns its parameter count."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    dims = shapes(info)
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    for layer in range(info.num_hidden_layers):
        for t in targets:
            i, o = dims[t]
            part = "self_attn" if t in ALL[:4] else "mlp"
            p = f"base_model.model.model.layers.{layer}.{part}.{t}"
            tensors[f"{p}.lora_A.weight"] = (rng.standard_normal((rank, i)) * 0.02).astype(np.float32)
            tensors[f"{p}.lora_B.weight"] = (rng.standard_normal((o, rank)) * 0.02).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": targets,
        "bias": "none",
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return sum(int(v.size) for v in tensors.values())


def throughput(engine: lmplex.Engine, names: list[str | None], args: argparse.Namespace, vocab: int) -> float:
    """Generated tokens a second of ``args.requests`` requests, ``args.concurrency`` in flight, the
    adapters of ``names`` taken in turn."""
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    lock, next_i, tokens = threading.Lock(), [0], [0]

    def worker() -> None:
        while True:
            with lock:
                i = next_i[0]
                if i >= args.requests:
                    return
                next_i[0] += 1
            prompt = [(7 + i) % vocab] + [(13 * j + i) % vocab for j in range(1, args.prompt_tokens)]
            out = engine.generate([prompt], params, lora=names[i % len(names)])
            with lock:
                tokens[0] += len(out[0].token_ids)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tokens[0] / (time.perf_counter() - t0)


def ttft(engine: lmplex.Engine, lora: str, prompt: list[int]) -> float:
    t0 = time.perf_counter()
    stream = engine.stream(prompt, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True), lora=lora)
    next(stream)
    elapsed = time.perf_counter() - t0
    for _ in stream:
        pass
    return elapsed


def measure(args: argparse.Namespace, info: Any, targets: list[str], tmp: Path) -> dict[str, Any]:
    """Every figure for adapters on ``targets`` (module docs)."""
    most = max(args.adapters)
    log(f"writing {most} rank-{args.rank} adapters on {', '.join(targets)}")
    folders = {f"a{k}": str(tmp / f"a{k}") for k in range(most)}
    params = [write_adapter(Path(f), info, args.rank, targets, k) for k, f in enumerate(folders.values())]
    # No prefix caching: every run sends the same prompts, and a run must not find an earlier one's.
    config = ModelConfig(
        args.model, max_model_len=512, max_model_concurrency=args.concurrency, enable_prefix_caching=False
    )
    fields = config.to_dict()
    engine = lmplex.Engine(ModelConfig.from_dict({**fields, "lora_modules": folders, "max_loras": most}))
    vocab = info.vocab_size
    throughput(engine, [None], argparse.Namespace(**{**vars(args), "requests": args.concurrency}), vocab)
    rows = [{"adapters": 0, "tok_s": round(throughput(engine, [None], args, vocab), 2)}]
    log(f"base alone: {rows[0]['tok_s']} tok/s")
    for n in args.adapters:
        names: list[str | None] = [f"a{k}" for k in range(n)]
        tok_s = throughput(engine, names, args, vocab)
        rows.append({"adapters": n, "tok_s": round(tok_s, 2), "vs_base": round(tok_s / rows[0]["tok_s"], 3)})
        log(f"{n} adapters: {tok_s:.2f} tok/s ({rows[-1]['vs_base']}x the base)")
    held = engine.memory().lora_adapters
    weights = sum(params) * 4
    overhead_mib = (held - weights) / most / 2**20
    del engine
    cold_cfg = {**fields, "lora_modules": {"a0": folders["a0"], "a1": folders["a1"]}, "max_loras": 1}
    engine = lmplex.Engine(ModelConfig.from_dict(cold_cfg))
    prompt = [(5 * j + 3) % vocab for j in range(args.prompt_tokens)]
    ttft(engine, "a0", prompt)
    warm, cold = [], []
    for _ in range(args.cold_repeats):
        warm.append(ttft(engine, "a0", prompt))
        ttft(engine, "a1", prompt)
        cold.append(ttft(engine, "a0", prompt))
    del engine
    cold_minus_warm = (statistics.median(cold) - statistics.median(warm)) * 1e3
    log(f"cold - warm first token: {cold_minus_warm:.1f} ms")
    ratio = next((r["vs_base"] for r in rows if r["adapters"] == 64), None)
    return {
        "targets": targets,
        "adapter_params": params[0],
        "throughput": rows,
        "memory": {
            "held_bytes": held,
            "weight_bytes": weights,
            "overhead_mib_per_adapter": round(overhead_mib, 4),
        },
        "cold_start": {
            "warm_ttft_ms": [round(w * 1e3, 2) for w in warm],
            "cold_ttft_ms": [round(c * 1e3, 2) for c in cold],
            "cold_minus_warm_ms": round(cold_minus_warm, 2),
        },
        "goals": {
            "ratio_64": {
                "goal": GOALS["ratio_64"],
                "value": ratio,
                "met": ratio is not None and ratio >= 0.7,
            },
            "overhead_mib": {
                "goal": GOALS["overhead_mib"],
                "value": round(overhead_mib, 4),
                "met": overhead_mib <= 1,
            },
            "cold_minus_warm_ms": {
                "goal": GOALS["cold_minus_warm_ms"],
                "value": round(cold_minus_warm, 2),
                "met": cold_minus_warm <= 50,
            },
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        args.requests, args.max_tokens, args.cold_repeats, args.adapters = 16, 8, 2, [1, 8]
    probe = lmplex.Engine(args.model, max_model_len=512)
    info = probe.info
    del probe
    runs = {}
    for name in args.targets:
        with tempfile.TemporaryDirectory() as tmp:
            runs[name] = measure(args, info, TARGETS[name], Path(tmp))
    return {
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "runs": runs,
        "provenance": provenance(),
    }


def tables(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        (
            f"{s['model']}, rank {s['rank']}: {s['requests']} requests, {s['concurrency']} in flight, "
            f"{s['prompt_tokens']}-token prompts, {s['max_tokens']} tokens each"
        ),
        "",
        "| targets | adapters | tok/s | vs the base alone |",
        "|---|---:|---:|---:|",
    ]
    for name, r in report["runs"].items():
        for row in r["throughput"]:
            lines.append(
                f"| {name} | {row['adapters'] or 'none (base)'} | {row['tok_s']} | {row.get('vs_base', 1.0)} |"
            )
    lines += [
        "",
        "| targets | adapter MB (f32) | MiB held per adapter beyond it | cold - warm first token, ms |",
    ]
    lines += ["|---|---:|---:|---:|"]
    for name, r in report["runs"].items():
        mb = r["adapter_params"] * 4 / 1e6
        m, c = r["memory"], r["cold_start"]
        lines.append(f"| {name} | {mb:.1f} | {m['overhead_mib_per_adapter']} | {c['cold_minus_warm_ms']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    report = run(args)
    print(json.dumps(report, indent=2) if args.json else tables(report), flush=True)


if __name__ == "__main__":
    main()

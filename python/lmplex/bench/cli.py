"""``lmplex bench``: run the workloads on lmplex and its peers, write JSON, optionally plot.

    lmplex bench                                  # SmolLM2-135M, every workload, peers if installed
    lmplex bench --models smollm2-135m-instruct qwen2.5-coder-0.5b-instruct --plot bench-plots
    lmplex bench --quick                          # small sizes: a smoke run in a few minutes
    lmplex bench --models ./smollm2-bf16 --peers transformers --prefill-sizes 512  # the dense path
    lmplex bench --workloads fairness             # tenants: light TTFT under fcfs and fair, shares
    lmplex bench --workloads routing              # TierSet: budgets kept, cost vs always-deep
    lmplex bench --workloads gpu-model --json     # the GPU path without a GPU: launches, bytes, modeled H100
    lmplex bench --workloads lora                 # LoRA adapters: throughput with 1-64, memory, cold start
    lmplex bench --workloads spec                 # speculative decoding: code editing and chat, batch 1 and 8

The thread count (``--threads``, default: all cores) is given to every system: lmplex's pool
(``RAYON_NUM_THREADS``, set before the first engine starts), llama.cpp's ``n_threads`` and
``torch.set_num_threads`` for transformers. mistral.rs's Python API has no thread-count setting; it
runs in the same process, with that environment.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from lmplex import models
from lmplex._core import LmplexError

from .systems import PEERS

__all__ = ["add_parser", "run"]

WORKLOADS = ["decode", "prefill", "throughput", "batched", "online", "fairness", "routing"]
# Not run by default: measures the CUDA path's launches on Llama shapes, not the --models.
GPU_MODEL = "gpu-model"
# Not run by default (minutes, and 64 adapters' worth of disk): LoRA adapters on each model.
LORA = "lora"
# Not run by default (minutes): speculative decoding against plain decoding on each model.
SPEC = "spec"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``bench`` subcommand."""
    p = sub.add_parser(
        "bench",
        help="benchmark lmplex against its peers (and the hardware limit) on the same GGUF",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--models", nargs="+", default=["smollm2-135m-instruct"], metavar="ALIAS_OR_GGUF")
    p.add_argument("--workloads", nargs="+", default=WORKLOADS, choices=[*WORKLOADS, GPU_MODEL, LORA, SPEC])
    p.add_argument(
        "--peers",
        nargs="*",
        default=PEERS,
        metavar="PEER",
        help="default: %(default)s (each skipped with the reason when not installed)",
    )
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads per system")
    p.add_argument("--repeats", type=int, default=3, help="runs per figure (the median is kept)")
    p.add_argument(
        "--quick", action="store_true", help="small sizes (decode 64, prefill 128/512, 8 requests)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic request mix")
    p.add_argument(
        "--decode-sizes",
        type=int,
        nargs="+",
        metavar="N",
        help="generated tokens per decode run (default: 128 512)",
    )
    p.add_argument(
        "--prefill-sizes",
        type=int,
        nargs="+",
        metavar="N",
        help="prompt tokens per prefill run (default: 128 1024 4096)",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bfloat16", "float16", "float32"],
        help="lmplex's ModelConfig dtype, and transformers' dtype for a Hugging Face folder (default: %(default)s)",
    )
    p.add_argument("--out", default="bench.json", metavar="FILE", help="JSON results (default: %(default)s)")
    p.add_argument("--plot", metavar="DIR", help="write one PNG per workload into DIR (needs matplotlib)")
    p.add_argument("--json", action="store_true", help="also print the JSON results on stdout")
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    cpu = [w for w in args.workloads if w != GPU_MODEL]
    result = run(argparse.Namespace(**{**vars(args), "workloads": cpu})) if cpu else {}
    if GPU_MODEL in args.workloads:
        from . import gpu_model

        # Alone, the figures are the whole result (``{"shapes": ...}``); beside others, a key of it.
        gpu = gpu_model.run()
        result = {**result, "gpu_model": gpu} if cpu else gpu
    text = json.dumps(result, indent=2) + "\n"
    Path(args.out).write_text(text)
    if args.json:
        print(text, end="")
    else:
        print(f"wrote {args.out}")
    if args.plot and cpu:
        from .plot import plot_all

        for path in plot_all(result, Path(args.plot)):
            print(f"wrote {path}")
    return 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    from . import hardware, workloads
    from .systems import Lmplex, load_peers

    decode_sizes = args.decode_sizes or ([64] if args.quick else [128, 512])
    prefill_sizes = args.prefill_sizes or ([128, 512] if args.quick else [128, 1024, 4096])
    mix_size = 8 if args.quick else 32
    rates = [2.0] if args.quick else [0.5, 1.0, 2.0]
    sizes = {"decode": decode_sizes, "prefill": prefill_sizes, "mix": mix_size, "rates": rates}
    max_len = max(
        1024 if args.quick else 4096 + 512 + 64, max(prefill_sizes) + 64, 32 + max(decode_sizes) + 64
    )
    bandwidth, reads = hardware.memory_bandwidth(args.threads), hardware.read_bandwidth(args.threads)
    out: dict[str, Any] = {
        "machine": {
            **hardware.machine(args.threads),
            "memory_bandwidth_gb_s": round(bandwidth / 1e9, 2),
            "read_bandwidth_gb_s": round(reads / 1e9, 2),
        },
        "config": {
            "quick": args.quick,
            "repeats": args.repeats,
            "seed": args.seed,
            "sizes": sizes,
            "dtype": args.dtype,
        },
        "runs": [],
    }
    for model in args.models:
        path = models.resolve(model)
        lm = Lmplex(path, max_len, concurrency=32, dtype=args.dtype)
        peers, skipped = load_peers(
            args.peers, path, max_len, args.threads, lm.engine, concurrency=32, dtype=args.dtype
        )
        systems = [lm, *peers]
        weights = lm.engine.memory().weights
        read = lm.engine.info.decode_weight_bytes  # the weights a decode step reads
        run_: dict[str, Any] = {
            "model": model,
            "file": Path(path).name,
            "file_bytes": _bytes(Path(path)),
            "weight_bytes": weights,
            "decode_weight_bytes": read,
            "systems": {s.name: s.version for s in systems},
            "skipped": skipped,
            "results": {},
        }
        res = run_["results"]
        short = workloads.prompt_ids(lm.engine, 32)
        if "decode" in args.workloads:
            res["decode"] = []
            for n in decode_sizes:
                per_token = hardware.decode_bytes_per_token(lm.engine.info, read, 32 + n // 2)
                roof, read_roof = bandwidth / per_token, reads / per_token
                for s, r in zip(systems, workloads.decode(systems, short, n, args.repeats)):
                    pct, read_pct = 100 * r["decode_tok_s"] / roof, 100 * r["decode_tok_s"] / read_roof
                    res["decode"].append(
                        {
                            "system": s.name,
                            **r,
                            "roofline_tok_s": roof,
                            "roofline_pct": pct,
                            "read_roofline_tok_s": read_roof,
                            "read_roofline_pct": read_pct,
                        }
                    )
                    print(
                        f"{model} decode {n}: {s.name} {r['decode_tok_s']:.1f} tok/s "
                        f"({pct:.0f}% of roofline, {read_pct:.0f}% of the read bandwidth)"
                    )
        if "prefill" in args.workloads:
            res["prefill"] = []
            for n in prefill_sizes:
                prompts = [workloads.prompt_ids(lm.engine, n, salt=100 * n + i) for i in range(args.repeats)]
                for s, r in zip(systems, workloads.prefill(systems, prompts)):
                    res["prefill"].append({"system": s.name, **r})
                    print(f"{model} prefill {n}: {s.name} {r['prefill_tok_s']:.1f} tok/s")
        mix = (
            workloads.mix(lm.engine, mix_size, args.seed)
            if {"throughput", "online"} & set(args.workloads)
            else []
        )
        if "throughput" in args.workloads:
            res["throughput"] = []
            for s in systems:
                r = workloads.throughput(s, mix)
                res["throughput"].append({"system": s.name, **r})
                print(f"{model} throughput ({len(mix)} requests): {s.name} {r['tok_s']:.1f} tok/s")
        if "batched" in args.workloads:
            n, conc = decode_sizes[0], 4 if args.quick else 8
            prompts = [workloads.prompt_ids(lm.engine, 32, salt=7000 + i) for i in range(conc)]
            r = workloads.batched(lm.engine, prompts, n, args.repeats)
            res["batched"] = [{"system": lm.name, **r}]
            print(
                f"{model} batched ({conc} requests x {n} tokens): {r['decode_tok_s']:.1f} tok/s, "
                f"{r['speedup_vs_batch1']:.2f}x batch 1 ({r['batch1_decode_tok_s']:.1f} tok/s; "
                f"pairs {min(r['speedup_per_pair']):.2f}-{max(r['speedup_per_pair']):.2f}x)"
            )
            run_["skipped"]["batched"] = "peers: their Python APIs run one sequence at a time"
        if "online" in args.workloads:
            res["online"] = []
            for i, rate in enumerate(rates):
                fresh = workloads.mix(lm.engine, mix_size, args.seed + 1 + i)
                r = workloads.online(lm.engine, fresh, rate, args.seed)
                res["online"].append({"system": lm.name, **r})
                print(f"{model} online {rate}/s: TTFT p50 {r['ttft_s'].get('p50', 0):.3f} s")
            run_["skipped"]["online"] = "peers: only lmplex's async API is driven under Poisson load"
        if "fairness" in args.workloads:
            from . import fairness

            settings = fairness.parser().parse_args(["--model", path, *(["--quick"] if args.quick else [])])
            res["fairness"] = fairness.run(settings)
            print(fairness.tables(res["fairness"]))
            run_["skipped"]["fairness"] = "peers: none schedules by tenant inside the engine"
        if LORA in args.workloads:
            from . import lora

            res["lora"] = lora.run(
                lora.parser().parse_args(["--model", path, *(["--quick"] if args.quick else [])])
            )
            print(lora.tables(res["lora"]))
            run_["skipped"]["lora"] = "peers: none serves LoRA adapters in this harness yet"
        if SPEC in args.workloads:
            from . import spec

            res["spec"] = spec.run(
                spec.parser().parse_args(["--model", path, *(["--quick"] if args.quick else [])])
            )
            print(spec.tables(res["spec"]))
            run_["skipped"]["spec"] = "peers: their speculative decoding is not driven by this harness yet"
        if "routing" in args.workloads and model == args.models[0]:
            from . import routing

            try:
                res["routing"] = routing.run(routing.parser().parse_args(["--quick"] if args.quick else []))
                print(routing.tables(res["routing"]))
                run_["skipped"]["routing"] = "peers: none routes by the engine's own live state"
            except LmplexError as e:  # a model of the workload is not fetched
                run_["skipped"]["routing"] = f"not run: {e}"
        run_["ratios"] = _ratios(res)
        out["runs"].append(run_)
    return out


def _bytes(path: Path) -> int:
    """A GGUF's size, or a Hugging Face folder's (its files together)."""
    if path.is_dir():
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    return path.stat().st_size


def _ratios(res: dict[str, Any]) -> dict[str, float]:
    """lmplex over each peer, per workload and size: above 1 means lmplex is faster."""
    ratios: dict[str, float] = {}
    keys = {
        "decode": ("generated_tokens", "decode_tok_s"),
        "prefill": ("prompt_tokens", "prefill_tok_s"),
        "throughput": ("requests", "tok_s"),
    }
    for workload, (size_key, value_key) in keys.items():
        rows = res.get(workload, [])
        for row in rows:
            if row["system"] == "lmplex":
                continue
            mine = next(r for r in rows if r["system"] == "lmplex" and r[size_key] == row[size_key])
            ratios[f"{workload}_{row[size_key]}_vs_{row['system']}"] = round(
                mine[value_key] / row[value_key], 3
            )
    return ratios

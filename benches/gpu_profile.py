#!/usr/bin/env python3
"""Where a CUDA decode step's time goes: lmplex's kernels as CUPTI records them (through
``torch.profiler``), per decode step, next to the step's wall-clock time.

    python benches/gpu_profile.py --model-dir DIR [--batch 1 64] [--tokens 64] [--out FILE]

``DIR`` is a Hugging Face folder (``benches/gpu_engine.py --work-dir W`` leaves its random Llamas in
``W/NAME``). For each batch size: one greedy warm-up run (which also captures the CUDA graphs), then
a profiled run of ``--tokens`` tokens per request from 16-token prompts. Reported per decode step:
the wall time, the GPU's busy time (the sum of kernel and copy durations, which do not overlap on
lmplex's one stream) and the gap between them (host work and launch latency), then the kernels by
total time.

Invariants: every number is read from this run (CUPTI's records and the wall clock), nothing is
assumed; PyTorch is only the profiler here, lmplex computes everything.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any


def profile_batch(engine: Any, batch: int, tokens: int) -> dict[str, Any]:
    from lmplex import SamplingParams

    torch: Any = importlib.import_module("torch")  # typed as Any: PyTorch is only on the GPU machine
    profiler: Any = importlib.import_module("torch.profiler")

    prompts = [[(7 * i + j) % 256 for j in range(16)] for i in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    engine.generate(prompts, params)  # warm-up: graphs captured, buffers sized
    torch.cuda.synchronize()
    with profiler.profile(activities=[profiler.ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        engine.generate(prompts, params)
        wall = time.perf_counter() - t
    busy_us: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            busy_us[e.name] += e.time_range.elapsed_us()
            calls[e.name] += 1
    steps = tokens  # one prefill step (it samples the first token) and tokens - 1 decode steps
    total_us = sum(busy_us.values())
    top = sorted(busy_us.items(), key=lambda kv: -kv[1])[:20]
    return {
        "batch": batch,
        "tokens_per_request": tokens,
        "wall_ms_per_step": 1e3 * wall / steps,
        "gpu_busy_ms_per_step": total_us / 1e3 / steps,
        "host_gap_ms_per_step": (1e3 * wall - total_us / 1e3) / steps,
        "kernels": [
            {"name": name[:90], "ms_per_step": us / 1e3 / steps, "calls_per_step": calls[name] / steps}
            for name, us in top
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", help="also write the results as JSON here")
    args = ap.parse_args()
    import lmplex
    from lmplex import ModelConfig

    config = ModelConfig(
        args.model_dir,
        device="cuda",
        max_model_len=2048,
        max_model_concurrency=max(8, *args.batch),
        enable_prefix_caching=False,
    )
    engine = lmplex.Engine(config)
    results = [profile_batch(engine, b, args.tokens) for b in args.batch]
    for r in results:
        print(
            f"batch {r['batch']}: {r['wall_ms_per_step']:.3f} ms/step wall, "
            f"{r['gpu_busy_ms_per_step']:.3f} GPU busy, {r['host_gap_ms_per_step']:.3f} gap"
        )
        for k in r["kernels"]:
            print(f"  {k['ms_per_step']:8.4f} ms  x{k['calls_per_step']:6.1f}  {k['name']}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

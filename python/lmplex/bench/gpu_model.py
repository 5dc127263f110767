"""``lmplex bench --workloads gpu-model``: the GPU path measured without a GPU.

The figures per Llama shape and step come from the Rust core (``lmplex_cuda::profile``,
docs/cuda.md): launches per step and per layer, bytes moved against the step's minimum, a modeled
H100 time and its share of the roofline. To each decode step this adds ``host_us_per_step``: the
engine's own time per decode step (scheduling, metadata, uploads, sampling bookkeeping, output
handling) at batch 1, 64 and 256, measured on this machine with the counting executor
(``LMPLEX_CUDA_EXECUTOR=counting``: the real CUDA backend and engine, no kernel work) on a
checkpoint of the shape whose weights are a sparse file of zeros. Each shape's engine runs in a
child process, so the executor setting never reaches this one.

A step's host time is the difference of two runs of the same batch that generate ``SHORT`` and
``LONG`` tokens per request, over ``LONG - SHORT`` (so loading, admission and the prefill cancel
out), the median of ``REPEATS``. The steps measured attend to 32 to 224 positions, 128 on average,
as the modeled decode steps do; 192 steps per difference keep one slow moment of this machine
from deciding the figure (16 steps at batch 256 gave differences from below zero to 400 µs).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

BATCHES = (1, 64, 256)
PROMPT_TOKENS = 16
SHORT, LONG = 16, 208
REPEATS = 5


def host_us_per_step(path: str) -> dict[str, float]:
    """Microseconds per decode step at each of ``BATCHES`` for the checkpoint at ``path`` (run with
    ``LMPLEX_CUDA_EXECUTOR=counting``)."""
    from lmplex import Engine, ModelConfig, SamplingParams

    config = ModelConfig(
        path,
        device="cuda",
        dtype="bfloat16",
        max_model_len=PROMPT_TOKENS + LONG + 16,
        max_model_concurrency=max(BATCHES),
        enable_prefix_caching=False,
    )
    engine = Engine(config)
    prompts = [[2 + (7 * i + j) % 1000 for j in range(PROMPT_TOKENS)] for i in range(max(BATCHES))]

    def seconds(batch: int, tokens: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
        t0 = time.perf_counter()
        engine.generate(prompts[:batch], params)
        return time.perf_counter() - t0

    out: dict[str, float] = {}
    for batch in BATCHES:
        seconds(batch, SHORT)  # warm-up
        steps = [(seconds(batch, LONG) - seconds(batch, SHORT)) / (LONG - SHORT) for _ in range(REPEATS)]
        out[str(batch)] = round(statistics.median(steps) * 1e6, 1)
    return out


def run() -> dict[str, Any]:
    """The Rust core's figures with each decode step's measured ``host_us_per_step``."""
    from lmplex import _core

    from .hardware import machine

    report: dict[str, Any] = json.loads(_core.gpu_model_report())
    env = {**os.environ, "LMPLEX_CUDA_EXECUTOR": "counting"}
    for name, shape in report["shapes"].items():
        with tempfile.TemporaryDirectory(prefix="lmplex-shape-") as folder:
            _core.write_llama_shape(folder, name)
            cmd = [sys.executable, "-m", "lmplex.bench.gpu_model", folder]
            child = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if child.returncode != 0:
            raise RuntimeError(f"{name}: the host-time run failed: {child.stderr.strip()[-2000:]}")
        host = json.loads(child.stdout.strip().splitlines()[-1])
        for batch, us in host.items():
            shape["decode"][batch]["host_us_per_step"] = us
    report["settings"]["host_time"] = {
        "prompt_tokens": PROMPT_TOKENS,
        "tokens": [SHORT, LONG],
        "repeats": REPEATS,
        "machine": machine(os.cpu_count() or 1),
    }
    return report


if __name__ == "__main__":
    print(json.dumps(host_us_per_step(sys.argv[1])))

"""The machine a benchmark ran on, and its memory-bandwidth limit.

Bandwidth is measured, not looked up: ``threads`` threads each copy their own 256 MiB NumPy buffer
(NumPy releases the GIL while copying) and the best of several rounds counts bytes read plus
written. Decode only reads, and a copy's writes stream past the caches, so copying counts more
bytes per second than a machine reads: ``read_bandwidth`` is the same measurement with each thread
taking the maximum of its buffer (reads alone). The decode roofline is bandwidth divided by the
bytes one decoded token must read: every
weight a step reads once (all but an embedding table that is not also the head: Qwen2.5-Coder's
GGUF has its own output matrix, SmolLM2's head is its table) plus the KV cache of the context so
far, in the engine's KV dtype.

Invariant: every figure here is measured or read from the machine; nothing is assumed.
"""

from __future__ import annotations

import os
import platform
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmplex.reports import ModelInfo

__all__ = ["decode_bytes_per_token", "machine", "memory_bandwidth", "read_bandwidth"]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str | None:
    """HEAD of the lmplex checkout the command runs in (the current folder), if it is one."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True, check=True
        )
        top, head = out.stdout.split()
        return head if (Path(top) / "crates" / "lmplex-core").is_dir() else None
    except (OSError, subprocess.CalledProcessError, ValueError):
        return None


def machine(threads: int) -> dict[str, Any]:
    """Platform, CPU, core count, the thread count used, Python, and the git commit when run from a clone."""
    flags = ""
    try:
        flags = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags"))
    except (OSError, StopIteration):
        pass
    return {
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "threads": threads,
        "simd": [
            f
            for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16")
            if f" {f}" in flags
        ],
        "python": platform.python_version(),
        "git_commit": _git_commit(),
    }


def memory_bandwidth(threads: int, mib: int = 256, rounds: int = 5) -> float:
    """Bytes per second that ``threads`` threads copy (read + write), best of ``rounds``."""
    import numpy as np

    bufs = [
        (np.ones(mib << 18, dtype=np.float32), np.empty(mib << 18, dtype=np.float32)) for _ in range(threads)
    ]
    return 2 * _best_rate(lambda src, dst: np.copyto(dst, src), bufs, mib, rounds)


def read_bandwidth(threads: int, mib: int = 256, rounds: int = 5) -> float:
    """Bytes per second that ``threads`` threads read (each the maximum of its own buffer), best of
    ``rounds``."""
    import numpy as np

    bufs = [(np.ones(mib << 18, dtype=np.float32),) for _ in range(threads)]
    return _best_rate(lambda src: src.max(), bufs, mib, rounds)


def _best_rate(op: Callable[..., Any], bufs: list[tuple[Any, ...]], mib: int, rounds: int) -> float:
    """``len(bufs) * mib`` MiB over the fastest of ``rounds`` rounds of ``op(*buf)`` on one thread
    per buffer, all released at once."""
    best = 0.0
    for _ in range(rounds):
        barrier = threading.Barrier(len(bufs) + 1)

        def work(args: tuple[Any, ...], gate: threading.Barrier) -> None:
            gate.wait()
            op(*args)

        workers = [threading.Thread(target=work, args=(b, barrier)) for b in bufs]
        for w in workers:
            w.start()
        barrier.wait()
        t0 = time.perf_counter()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - t0
        best = max(best, len(bufs) * (mib << 20) / elapsed)
    return best


def decode_bytes_per_token(info: ModelInfo, weight_bytes: int, context: int) -> int:
    """Bytes read to decode one token at ``context`` tokens of context: the weights a step reads
    (``weight_bytes``: the engine's ``info.decode_weight_bytes``, all weights but an embedding
    table that is not also the head, which a step reads one row of) plus K and V in the
    engine's KV dtype (``info.kv_dtype``)."""
    elem = {"float32": 4, "float16": 2, "bfloat16": 2}[info.kv_dtype]
    return (
        weight_bytes + 2 * info.num_hidden_layers * info.num_key_value_heads * info.head_dim * elem * context
    )

#!/usr/bin/env python3
"""Several models in one ``lmplex serve`` process against the same models in one process each: memory,
time from start to ``/ready``, and throughput of each model alone against all of them at once. Not a
test: it prints and writes JSON.

    python benches/multi_model.py                    # SmolLM2-135M and Qwen2.5-Coder-0.5B on the CPU
    python benches/multi_model.py --device cuda --work-dir /tmp/w   # a 1B and two 0.5B Llamas on GPU 0

On the CPU the models come from ``lmplex models fetch`` and memory is the processes' resident set
(RSS, from /proc). On CUDA they are random-weight bf16 Llamas of ``--shapes`` (made on the GPU by
``gpu_engine.build``, kept in ``--work-dir``), and memory is the device's ``memory.used`` (nvidia-smi)
after minus before the server started: ``overhead_bytes`` is that less every model's weights and KV
pool as the server reports them (``lmplex_model_memory_bytes``), i.e. the CUDA context, kernels,
cuBLAS, step buffers and graphs; ``overhead_beyond_workspace_bytes`` also leaves out the step buffers.

Memory is read after every model has loaded, warmed up and answered one request. Throughput runs
``--concurrency`` requests of ``--max-tokens`` tokens (EOS ignored) on each model alone, then on all
models at once, in the one-process server; ``sum_of_alone_seconds`` against ``together.seconds`` says
whether running them at once overlaps (less) or interferes (more). The machine, versions and git commit are recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lmplex
from lmplex import models

CATEGORY = re.compile(r'^lmplex_model_memory_bytes\{model="([^"]+)",category="(\w+)"\} (\d+)$', re.MULTILINE)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def device_used_bytes() -> int | None:
    """GPU 0's ``memory.used`` (every process), from nvidia-smi; ``None`` without it."""
    cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return int(out.split()[0]) << 20


def start(config: str, folder: Path, tag: str) -> tuple[subprocess.Popen[bytes], Path]:
    path = folder / f"{tag}.toml"
    path.write_text(config)
    log = folder / f"{tag}.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lmplex", "serve", "--config", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    return proc, log


def wait_ready(proc: subprocess.Popen[bytes], log: Path, t0: float) -> tuple[str, float]:
    url = ""
    while True:
        if proc.poll() is not None:
            raise RuntimeError(log.read_text())
        if not url:
            for line in log.read_text().splitlines():
                if "listening on " in line:
                    url = line.split("listening on ", 1)[1].strip()
        if url:
            try:
                with urllib.request.urlopen(f"{url}/ready", timeout=5) as r:
                    if r.status == 200:
                        return url, time.perf_counter() - t0
            except OSError:
                pass
        time.sleep(0.02)


def one_request(url: str, model: str, max_tokens: int = 8, seed: int = 0) -> int:
    """One completion of ``max_tokens`` tokens (EOS ignored); returns the tokens generated."""
    body = {
        "model": model,
        "prompt": f"Request {seed} says",
        "max_tokens": max_tokens,
        "seed": seed,
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        f"{url}/v1/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return int(json.loads(r.read())["usage"]["completion_tokens"])


def load(url: str, names: list[str], concurrency: int, max_tokens: int) -> dict[str, Any]:
    """``concurrency`` requests on each of ``names`` at once: each model's tokens/s (its tokens over
    the time to its last reply) and all models' tokens over the whole run's time."""
    jobs = [(n, i) for n in names for i in range(concurrency)]
    t0 = time.perf_counter()

    def one(job: tuple[str, int]) -> tuple[int, float]:
        tokens = one_request(url, job[0], max_tokens, job[1])
        return tokens, time.perf_counter() - t0

    with ThreadPoolExecutor(len(jobs)) as pool:
        done = list(pool.map(one, jobs))
    wall = max(t for _, t in done)
    per = {}
    for n in names:
        mine = [d for (m, _), d in zip(jobs, done) if m == n]
        per[n] = round(sum(t for t, _ in mine) / max(t for _, t in mine), 1)
    total = sum(t for t, _ in done) / wall
    return {"seconds": round(wall, 3), "tok_s": per, "total_tok_s": round(total, 1)}


def held_bytes(url: str) -> dict[str, dict[str, int]]:
    """Each model's bytes by category, from ``/metrics``."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, dict[str, int]] = {}
    for model, category, value in CATEGORY.findall(text):
        out.setdefault(model, {})[category] = int(value)
    return out


def model_toml(name: str, path: str, max_model_len: int, device: str) -> str:
    return (
        f'[[models]]\nmodel_id = "{path}"\nname = "{name}"\nmax_model_len = {max_model_len}\n'
        f'device = "{device}"\n'
    )


def memory(proc_pids: list[int], url_list: list[str], device: str, before: int | None) -> dict[str, Any]:
    held: dict[str, dict[str, int]] = {}
    for url in url_list:
        held.update(held_bytes(url))
    plans = sum(m["weights"] + m["kv_cache"] for m in held.values())
    workspace = sum(m["workspace"] for m in held.values())
    out: dict[str, Any] = {"held": held, "weights_and_kv_bytes": plans}
    if device == "cpu":
        out["rss_bytes"] = sum(rss_bytes(p) for p in proc_pids)
        out["rss_bytes_each"] = [rss_bytes(p) for p in proc_pids]
    else:
        after = device_used_bytes()
        if before is not None and after is not None:
            out["device_used_bytes"] = after - before
            out["overhead_bytes"] = after - before - plans
            out["overhead_beyond_workspace_bytes"] = after - before - plans - workspace
    return out


def run(specs: list[tuple[str, str]], args: argparse.Namespace) -> dict[str, Any]:
    names = [n for n, _ in specs]
    toml = {n: model_toml(n, p, args.max_model_len, args.device) for n, p in specs}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # One process, every model.
        before = device_used_bytes() if args.device != "cpu" else None
        t0 = time.perf_counter()
        proc, log = start("port = 0\n" + "".join(toml.values()), folder, "together")
        url, ready_s = wait_ready(proc, log, t0)
        for n in names:
            one_request(url, n)
        together: dict[str, Any] = {"processes": 1, "ready_s": round(ready_s, 3)}
        together.update(memory([proc.pid], [url], args.device, before))
        alone = {n: load(url, [n], args.concurrency, args.max_tokens) for n in names}
        at_once = load(url, names, args.concurrency, args.max_tokens)
        together["throughput"] = {
            "alone": alone,
            "sum_of_alone_seconds": round(sum(a["seconds"] for a in alone.values()), 3),
            "together": at_once,
        }
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        time.sleep(1.0)
        # One process per model, started at the same time.
        before = device_used_bytes() if args.device != "cpu" else None
        t0 = time.perf_counter()
        procs = [start("port = 0\n" + toml[n], folder, f"alone{i}") for i, n in enumerate(names)]
        readies = [wait_ready(p, lg, t0) for p, lg in procs]
        for (u, _), n in zip(readies, names):
            one_request(u, n)
        separate: dict[str, Any] = {"processes": len(names), "ready_s": round(max(r for _, r in readies), 3)}
        separate.update(memory([p.pid for p, _ in procs], [u for u, _ in readies], args.device, before))
        for p, _ in procs:
            p.send_signal(signal.SIGTERM)
            p.wait(60)
    key = "rss_bytes" if args.device == "cpu" else "device_used_bytes"
    saved = {f"{key}_saved": separate[key] - together[key]} if key in together and key in separate else {}
    return {
        "models": names,
        "max_model_len": args.max_model_len,
        "device": args.device,
        "one_process": together,
        "separate_processes": separate,
        **saved,
    }


def cuda_models(shapes: list[str], work: Path) -> list[tuple[str, str]]:
    """Random-weight Llamas of ``shapes`` (built once into ``work``), named by shape and index."""
    sys.path.insert(0, str(Path(__file__).parent))
    import gpu_engine

    out = []
    for i, shape in enumerate(shapes):
        folder = work / shape
        if not (folder / "config.json").exists():
            folder.mkdir(parents=True, exist_ok=True)
            gpu_engine.build(shape, folder)
        out.append((f"{shape}-{i}", str(folder)))
    return out


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models",
        nargs="+",
        default=["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"],
        help="aliases or paths, on the CPU",
    )
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: random-weight --shapes on GPU 0")
    parser.add_argument("--shapes", nargs="+", default=["llama-3.2-1b", "llama-0.5b", "llama-0.5b"])
    parser.add_argument(
        "--work-dir", help="where CUDA models are built and kept (default: a temporary folder)"
    )
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--concurrency", type=int, default=8, help="requests per model in the load phase")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per load-phase request")
    parser.add_argument("--out", default="bench-multi-model.json")
    args = parser.parse_args()
    if args.device == "cpu":
        specs = [(n, models.resolve(n)) for n in args.models]
        result = run(specs, args)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = run(cuda_models(args.shapes, Path(args.work_dir or tmp)), args)
    result["machine"] = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    result["lmplex"] = lmplex.__version__
    result["git_commit"] = git_commit()
    text = json.dumps(result, indent=2)
    print(text)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Two models in one ``lmplex serve`` process against the same two models in two processes: resident
memory (RSS, from /proc) and time from start to ``/ready``. Not a test: it prints and writes JSON.

    python benches/multi_model.py                    # SmolLM2-135M and Qwen2.5-Coder-0.5B
    python benches/multi_model.py --max-model-len 2048 --out multi.json

RSS is read after every model has loaded, warmed up and answered one request. Models come from
``lmplex models fetch``; the machine, versions and git commit are recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import lmplex
from lmplex import models


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


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


def one_request(url: str, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}
    req = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        json.loads(r.read())


def model_toml(alias: str, max_model_len: int) -> str:
    return f'[[models]]\nmodel_id = "{models.resolve(alias)}"\nname = "{alias}"\nmax_model_len = {max_model_len}\n'


def run(names: list[str], max_model_len: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # One process, both models.
        t0 = time.perf_counter()
        config = "port = 0\n" + "".join(model_toml(n, max_model_len) for n in names)
        proc, log = start(config, folder, "together")
        url, ready_s = wait_ready(proc, log, t0)
        for n in names:
            one_request(url, n)
        together: dict[str, Any] = {"processes": 1, "rss_bytes": rss_bytes(proc.pid), "ready_s": ready_s}
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        # One process per model, started at the same time.
        t0 = time.perf_counter()
        procs = [
            start("port = 0\n" + model_toml(n, max_model_len), folder, f"alone{i}")
            for i, n in enumerate(names)
        ]
        readies = [wait_ready(p, lg, t0) for p, lg in procs]
        for (u, _), n in zip(readies, names):
            one_request(u, n)
        separate: dict[str, Any] = {
            "processes": len(names),
            "rss_bytes": sum(rss_bytes(p.pid) for p, _ in procs),
            "rss_bytes_each": [rss_bytes(p.pid) for p, _ in procs],
            "ready_s": max(r for _, r in readies),
        }
        for p, _ in procs:
            p.send_signal(signal.SIGTERM)
            p.wait(60)
    return {
        "models": names,
        "max_model_len": max_model_len,
        "one_process": together,
        "separate_processes": separate,
        "rss_saved_bytes": separate["rss_bytes"] - together["rss_bytes"],
    }


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
        "--models", nargs="+", default=["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]
    )
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--out", default="bench-multi-model.json")
    args = parser.parse_args()
    result = run(args.models, args.max_model_len)
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

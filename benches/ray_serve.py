#!/usr/bin/env python3
"""lmplex on Ray Serve (two replicas) against one ``lmplex serve`` process on the same model, in one
run: per-request latency of sequential tiny requests (the overhead Ray adds: its proxy, the ingress
and the handle call) and throughput under concurrent load, with Serve's defaults and with
``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``. Not a test: it prints and writes JSON.

    python benches/ray_serve.py                        # SmolLM2-135M, 200 requests, 8 clients
    python benches/ray_serve.py --requests 500 --out ray.json

Each replica gets ``--threads`` CPU threads (``RAYON_NUM_THREADS``), and so does ``lmplex serve``;
on a machine with fewer cores than two replicas ask for, throughput compares sharing, not scale-out.
Needs ``pip install "lmplex[ray]"`` and the model from ``lmplex models fetch``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

import lmplex
from lmplex import ModelConfig, models
from lmplex.server_toml import server_toml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def sequential(url: str, n: int) -> dict[str, float]:
    """Latency of ``n`` one-token completions, one at a time (after 10 warm-ups), in ms."""
    times = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for i in range(n + 10):
            body = {"model": "m", "prompt": f"Request {i}: say", "max_tokens": 1, "temperature": 0}
            start = time.perf_counter()
            reply = client.post("/v1/completions", json=body)
            elapsed = (time.perf_counter() - start) * 1e3
            reply.raise_for_status()
            if i >= 10:
                times.append(elapsed)
    times.sort()
    return {"p50_ms": statistics.median(times), "p99_ms": times[int(0.99 * (len(times) - 1))]}


async def concurrent(url: str, clients: int, per_client: int, max_tokens: int) -> dict[str, Any]:
    """Generated tokens per second with ``clients`` clients each sending ``per_client`` requests."""
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        replicas: Counter[str] = Counter()

        async def one(c: int) -> int:
            tokens = 0
            for i in range(per_client):
                body = {"model": "m", "prompt": f"Client {c}, story {i}:", "max_tokens": max_tokens}
                reply = await client.post("/v1/completions", json=body)
                reply.raise_for_status()
                tokens += int(reply.json()["usage"]["completion_tokens"])
                replicas[reply.headers.get("x-lmplex-replica", "-")] += 1
            return tokens

        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(c) for c in range(clients))))
        elapsed = time.perf_counter() - start
    return {"tokens_per_s": tokens / elapsed, "seconds": elapsed, "requests_by_replica": dict(replicas)}


def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "sequential": sequential(url, args.requests),
        "concurrent": asyncio.run(concurrent(url, args.clients, args.per_client, args.max_tokens)),
    }


def run_lmplex_serve(config: ModelConfig, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    toml = folder / "serve.toml"
    toml.write_text(server_toml([config], port=0))
    address = folder / "serve.url"
    env = os.environ | {"RAYON_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, "-m", "lmplex", "serve", "--config", str(toml), "--address-file", str(address)]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, env=env)
    try:
        while not address.exists():
            time.sleep(0.05)
        url = address.read_text().strip()
        while httpx.get(f"{url}/ready").status_code != 200:
            time.sleep(0.1)
        return measure(url, args)
    finally:
        proc.terminate()
        proc.wait(60)


class CannedServer:
    """A stand-in for lmplex.ray's server replica with no engine: every request gets the same reply.
    Behind lmplex.ray's own ingress and router it measures what Ray alone costs per request."""

    async def handle(self, *request: object, affinity: str | None) -> AsyncIterator[dict[str, Any] | bytes]:
        yield {"status": 200, "headers": [("content-type", "application/json")], "replica": "canned"}
        yield CANNED


CANNED = json.dumps({"object": "text_completion", "choices": [{"index": 0, "text": " ok"}]}).encode()


def run_ray(config: ModelConfig, args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """Two replicas on a fresh local Ray. ``mode`` is ``default``; ``optimized``, which sets
    ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1`` (direct ingress, gRPC between replicas, no per-request log
    lines) for the cluster's processes; or ``floor``: :class:`CannedServer` replicas, latency only."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] = "1" if mode == "optimized" else "0"
    import ray
    from ray import serve

    from lmplex.ray import build_app
    from lmplex.ray._replica import Ingress

    ray.init(include_dashboard=False, log_to_driver=False, object_store_memory=100 << 20)
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        options = {"num_cpus": 0, "runtime_env": {"env_vars": {"RAYON_NUM_THREADS": str(args.threads)}}}
        app = build_app([config], num_replicas=2, ray_actor_options=options)
        if mode == "floor":
            router = {"request_router_class": "lmplex.ray._router:LMPlexRouter"}
            canned = serve.deployment(
                name="LMPlexServer",
                num_replicas=2,
                ray_actor_options={"num_cpus": 0},
                request_router_config=router,
            )(CannedServer)
            app = serve.deployment(name="LMPlexIngress", ray_actor_options={"num_cpus": 0})(Ingress).bind(
                canned.bind()
            )
        serve.run(app, route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        return {"sequential": sequential(url, args.requests)} if mode == "floor" else measure(url, args)
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=200, help="sequential requests")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--per-client", type=int, default=4, help="requests per concurrent client")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per concurrent request")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per server process")
    parser.add_argument("--out", help="write the results as JSON here")
    # The first Ray run's variable must not leak into the lmplex serve run or the next Ray run.
    os.environ.pop("RAY_SERVE_THROUGHPUT_OPTIMIZED", None)
    args = parser.parse_args()
    path = models.resolve(args.model)
    config = ModelConfig(path, served_model_name="m", max_model_len=1024, max_model_concurrency=8)
    with tempfile.TemporaryDirectory() as tmp:
        serve_result = run_lmplex_serve(config, args, Path(tmp))
    runs = {"lmplex serve": serve_result}
    runs["Ray, 2 replicas"] = run_ray(config, args, "default")
    runs["Ray, 2, optimized"] = run_ray(config, args, "optimized")
    floor = run_ray(config, args, "floor")
    base = serve_result["sequential"]["p50_ms"], serve_result["concurrent"]["tokens_per_s"]
    result = {
        "model": args.model,
        "runs": runs,
        "ray_overhead_p50_ms": {k: r["sequential"]["p50_ms"] - base[0] for k, r in runs.items()},
        "throughput_ratio": {k: r["concurrent"]["tokens_per_s"] / base[1] for k, r in runs.items()},
        "ray_floor": floor,
        "args": vars(args),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "versions": {"lmplex": lmplex.__version__, "ray": __import__("ray").__version__},
    }
    print(f"{'':20}{'p50 ms':>8}{'p99 ms':>8}{'+p50 ms':>9}{'tok/s':>8}{'ratio':>7}")
    for name, r in runs.items():
        seq, conc = r["sequential"], r["concurrent"]
        extra, ratio = result["ray_overhead_p50_ms"][name], result["throughput_ratio"][name]
        print(
            f"{name:20}{seq['p50_ms']:>8.1f}{seq['p99_ms']:>8.1f}{extra:>9.1f}{conc['tokens_per_s']:>8.1f}{ratio:>7.2f}"
        )
    fs = floor["sequential"]
    print(f"{'Ray alone (no engine)':20}{fs['p50_ms']:>8.1f}{fs['p99_ms']:>8.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

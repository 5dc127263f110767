"""``serve run`` with a Serve config file whose application is ``lmplex.ray:app``, as users deploy it.

The command starts its own local Ray cluster (the one of tests/test_ray.py is shut down by then) and
stops on SIGTERM.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray.serve", reason="lmplex[ray] is not installed (Ray needs Python 3.10+)")


def test_serve_run_with_a_config_file(smollm2_path: str, tmp_path: Path) -> None:
    serve_cli = shutil.which("serve")
    assert serve_cli is not None, "Ray's serve command is not on PATH"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "serve.yaml"
    config.write_text(
        f"""
http_options: {{host: 127.0.0.1, port: {port}}}
applications:
  - name: lmplex
    import_path: lmplex.ray:app
    route_prefix: /
    args:
      models:
        - {{model_id: "{smollm2_path}", served_model_name: smol, max_model_len: 512}}
      autoscaling_config: {{min_replicas: 1, max_replicas: 1}}
      ray_actor_options: {{num_cpus: 0}}
      tenants:
        - {{name: acme, api_key: sk-acme, requests_per_minute: 600}}
"""
    )
    env = os.environ | {"RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen(
        [serve_cli, "run", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else "serve run exited"
            assert time.monotonic() < deadline, "serve run never served /v1/models"
            try:
                if (
                    httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer sk-acme"}).status_code
                    == 200
                ):
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        body = {
            "model": "smol",
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4,
            "temperature": 0,
        }
        reply = httpx.post(
            f"{url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-acme"}
        )
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
        assert reply.headers["x-ratelimit-limit-requests"] == "600"  # max_replicas 1: the whole quota
        assert httpx.post(f"{url}/v1/chat/completions", json=body).status_code == 401  # tenants need a key
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

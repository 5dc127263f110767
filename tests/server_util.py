"""A ``lmplex serve`` subprocess for the server tests: started with a TOML config on a free port, found
through its ``--address-file``, its stderr kept, waited on until ``/ready``, and stopped with SIGTERM.
A server a test started and left running (it failed before ``stop``) is killed after the test
(``started``/``kill_started_since``, an autouse fixture in conftest.py): a leftover would hold the test
run's output open. Servers of module fixtures start before that fixture looks, and are left alone."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx


def _toml(v: object) -> str:
    """A TOML value: JSON for scalars and lists, an inline table for a dict."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + "}"
    return json.dumps(v)


_started: weakref.WeakSet[Server] = weakref.WeakSet()


_count = 0


def started() -> int:
    """How many servers have been started so far."""
    return _count


def kill_started_since(count: int) -> None:
    """Kills every server started after ``started()`` said ``count`` that still runs."""
    for s in list(_started):
        if s.number >= count and s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait(10)


class Server:
    """``python -m lmplex serve --config <toml>`` on port 0; ``url`` once it listens."""

    def __init__(
        self,
        tmp: Path,
        models: list[dict[str, object]],
        log_args: Sequence[str] = (),
        tenants: Sequence[dict[str, object]] = (),
        env: dict[str, str] | None = None,
        tiers: dict[str, list[str]] | None = None,
        **top: object,
    ) -> None:
        lines = [f"{k} = {json.dumps(v)}" for k, v in {"port": 0, **top}.items()]
        for table, entries in (("models", models), ("tenants", tenants)):
            for m in entries:
                lines.append(f"[[{table}]]")
                lines += [f"{k} = {_toml(v)}" for k, v in m.items()]
        if tiers:
            lines += ["[tiers]", *(f"{k} = {json.dumps(v)}" for k, v in tiers.items())]
        config = tmp / "serve.toml"
        config.write_text("\n".join(lines) + "\n")
        self.address = tmp / "serve.url"
        self.address.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "lmplex", "serve", "--config", str(config)]
        self.proc = subprocess.Popen(
            [*cmd, "--address-file", str(self.address), *log_args], stderr=subprocess.PIPE, text=True, env=env
        )
        self.log: list[str] = []
        self.url = ""
        global _count
        self.number = _count
        _count += 1
        _started.add(self)
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def wait_listening(self, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while not self.address.exists():
            assert self.proc.poll() is None, f"the server exited: {''.join(self.log)}"
            assert time.monotonic() < deadline, "the server never wrote its address file"
            time.sleep(0.05)
        self.url = self.address.read_text().strip()
        return self.url

    def wait_ready(self, timeout: float = 180) -> None:
        url = self.wait_listening()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the server exited: {''.join(self.log)}"
            if httpx.get(f"{url}/ready").status_code == 200:
                return
            time.sleep(0.2)
        raise AssertionError(f"not ready after {timeout} s: {''.join(self.log)}")

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit status once it drained."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def chat_as(url: str, key: str, messages: list[dict[str, str]], max_tokens: int) -> httpx.Response:
    """A greedy chat completion on the served model ``small`` with the bearer ``key``."""
    body = {"model": "small", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(
        f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )


# A stream cut by killing its server: past EOS, far longer than a test takes to kill the server (a
# reply that ended first would settle, and free its slot, before the kill).
CUT_TOKENS = 4000


def cut_stream_body(messages: list[dict[str, str]]) -> dict[str, Any]:
    """A greedy streamed chat on ``small`` of ``CUT_TOKENS`` tokens, EOS ignored."""
    return {
        "model": "small",
        "messages": messages,
        "max_tokens": CUT_TOKENS,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }


def usage_as(url: str, key: str) -> dict[str, Any]:
    """``GET /v1/usage`` with the bearer ``key``: the tenant's totals and windows."""
    r = httpx.get(f"{url}/v1/usage", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out

"""Tenants' usage in a SQLite store (``usage_store``; by default beside ``lmplex serve --config FILE``
when tenants are configured), with real ``lmplex serve`` processes on SmolLM2:

* a restart keeps the totals, the day's cost and the request window: a tenant cannot spend its quota
  twice by restarting the server;
* ``kill -9`` during a stream, then a restart: once the dead server's lease has passed, the call is
  charged its reservation (prompt plus ``max_tokens`` at the model's prices: never less than it
  generated) exactly once, and nothing stays in flight;
* two servers on one file admit exactly a tenant's ``requests_per_minute`` under 24 concurrent calls;
* ``lmplex usage --config FILE`` reads the store a running server uses and agrees with its ``/v1/usage``;
* ``Engine`` and ``ModelHost`` keep a tenant's window in the same store (``usage_store=``);
* a file that is not an lmplex usage store (another SQLite database, or not SQLite) stops the server
  at start with a message naming the file, and the file is left as it was;
* stored responses are kept in the file: a restarted server reads and continues them.
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_util import CUT_TOKENS, Server, chat_as, cut_stream_body, usage_as

import lmplex

KEY = "sk-usage-test-0123456789"
PRICES = {"price_per_million_input_tokens": 1e6, "price_per_million_output_tokens": 2e6}  # 1 and 2 a token
CHAT = [{"role": "user", "content": "Count from one to fifty."}]


def _models(smollm2_path: str) -> list[dict[str, object]]:
    return [{"model_id": smollm2_path, "served_model_name": "small", "max_model_len": 4096, **PRICES}]


def _tenant(**quotas: object) -> list[dict[str, object]]:
    return [{"name": "a", "api_key": KEY, "quota_window_s": 600.0, **quotas}]


def _chat(url: str, max_tokens: int) -> httpx.Response:
    return chat_as(url, KEY, CHAT, max_tokens)


def _usage(url: str) -> dict[str, Any]:
    return usage_as(url, KEY)


def test_a_restart_keeps_totals_cost_and_windows(tmp_path: Path, smollm2_path: str) -> None:
    s = Server(tmp_path, _models(smollm2_path), tenants=_tenant(requests_per_minute=3))
    s.wait_ready()
    used = [_chat(s.url, 4).json()["usage"] for _ in range(2)]
    before = _usage(s.url)
    assert s.stop() == 0
    assert (tmp_path / "serve.usage.sqlite").is_file()
    cost = sum(u["prompt_tokens"] + 2 * u["completion_tokens"] for u in used)
    assert before["requests"] == 2 and before["cost"] == pytest.approx(cost)

    s = Server(tmp_path, _models(smollm2_path), tenants=_tenant(requests_per_minute=3))
    s.wait_ready()
    after = _usage(s.url)
    for k in ("requests", "prompt_tokens", "completion_tokens", "cost", "cost_today"):
        assert after[k] == pytest.approx(before[k]), k
    assert after["limits"]["requests"]["remaining"] == 1
    assert _chat(s.url, 4).status_code == 200
    refused = _chat(s.url, 4)
    assert refused.status_code == 429 and float(refused.headers["retry-after"]) > 500
    # `lmplex usage` reads the same store while the server runs.
    now = _usage(s.url)
    cmd = [sys.executable, "-m", "lmplex", "usage", "--config", str(tmp_path / "serve.toml")]
    (row,) = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True).stdout)
    assert row["tenant"] == "a" and row["requests"] == 3 == now["requests"]
    for k in ("prompt_tokens", "completion_tokens", "cost", "cost_today", "in_flight"):
        assert row[k] == pytest.approx(now[k]), k
    table = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()
    assert table[0].split()[:2] == ["tenant", "requests"] and table[1].split()[:2] == ["a", "3"]
    assert s.stop() == 0


def test_a_killed_server_charges_its_stream_once_at_lease_expiry(tmp_path: Path, smollm2_path: str) -> None:
    s = Server(tmp_path, _models(smollm2_path), tenants=_tenant(), usage_lease_s=1.0)
    s.wait_ready()
    done = _chat(s.url, 1).json()["usage"]
    prompt = done["prompt_tokens"]
    body = cut_stream_body(CHAT)
    with httpx.stream(
        "POST",
        f"{s.url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    ) as r:
        lines = r.iter_lines()
        for _ in range(5):
            next(lines)
        assert _usage(s.url)["in_flight"] == 1
        s.proc.send_signal(signal.SIGKILL)
        s.proc.wait(10)
    first = prompt + 2 * done["completion_tokens"]  # the finished call
    reserved = prompt + 2 * CUT_TOKENS  # the cut one: its prompt and every token it could have made
    s = Server(tmp_path, _models(smollm2_path), tenants=_tenant(), usage_lease_s=1.0)
    s.wait_ready()
    deadline = time.monotonic() + 10
    while (u := _usage(s.url))["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert u["in_flight"] == 0 and u["requests"] == 2
    assert u["cost"] == pytest.approx(first + reserved) and u["cost_today"] == pytest.approx(first + reserved)
    time.sleep(1.5)
    assert _usage(s.url)["cost"] == pytest.approx(first + reserved)  # charged once
    assert s.stop() == 0


def test_two_servers_on_one_store_admit_exactly_the_quota(tmp_path: Path, smollm2_path: str) -> None:
    store = f"sqlite:{tmp_path / 'shared.sqlite'}"
    servers = []
    for i in range(2):
        folder = tmp_path / f"s{i}"
        folder.mkdir()
        servers.append(
            Server(folder, _models(smollm2_path), tenants=_tenant(requests_per_minute=10), usage_store=store)
        )
    for s in servers:
        s.wait_ready()
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        codes = list(pool.map(lambda i: _chat(servers[i % 2].url, 2).status_code, range(24)))
    assert codes.count(200) == 10 and codes.count(429) == 14, codes
    assert [_usage(s.url)["requests"] for s in servers] == [10, 10]  # either server reads the same
    for s in servers:
        assert s.stop() == 0


def test_a_foreign_or_corrupt_store_stops_the_server_naming_it(tmp_path: Path, smollm2_path: str) -> None:
    foreign = tmp_path / "notes.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE notes(x)")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"\x07" * 4096)
    for path, why in ((foreign, "not an lmplex usage store"), (junk, "not a database")):
        before = path.read_bytes()
        s = Server(tmp_path, _models(smollm2_path), tenants=_tenant(), usage_store=f"sqlite:{path.name}")
        assert s.proc.wait(60) != 0
        time.sleep(0.2)
        log = "".join(s.log)
        assert path.name in log and why in log, log
        assert "Traceback" not in log and "panicked" not in log
        assert path.read_bytes() == before


def test_engines_keep_a_tenants_usage_in_the_store(tmp_path: Path, smollm2_path: str) -> None:
    store = f"sqlite:{tmp_path / 'engine.sqlite'}"
    tenants = [lmplex.Tenant("a", requests_per_minute=2, quota_window_s=600.0)]
    config = lmplex.ModelConfig(smollm2_path, max_model_len=256)
    e = lmplex.Engine(config, tenants=tenants, usage_store=store)
    e.generate(["Hello", "Hi"], lmplex.SamplingParams(max_tokens=2), tenant="a")  # one call
    e.generate("Hey", lmplex.SamplingParams(max_tokens=2), tenant="a")
    del e
    again = lmplex.ModelHost([config], tenants=tenants, usage_store=store)
    with pytest.raises(lmplex.RateLimited):
        again.generate("Hey", lmplex.SamplingParams(max_tokens=2), model=smollm2_path, tenant="a")
    with pytest.raises(lmplex.InvalidRequest, match="usage_store"):
        lmplex.Engine(config, tenants=tenants, usage_store="redis-ish")


def test_stored_responses_survive_a_restart(tmp_path: Path, smollm2_path: str) -> None:
    def client(s: Server) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{s.url}/v1", api_key=KEY, max_retries=0)

    s = Server(tmp_path, _models(smollm2_path), tenants=_tenant())
    s.wait_ready()
    first = client(s).responses.create(model="small", input="Say hi.", max_output_tokens=4, temperature=0)
    assert s.stop() == 0
    s = Server(tmp_path, _models(smollm2_path), tenants=_tenant())  # the same config, so the same file
    s.wait_ready()
    kept = client(s).responses.retrieve(first.id)
    assert kept.output_text == first.output_text and kept.usage == first.usage
    follow = client(s).responses.create(
        model="small", input="Again.", previous_response_id=first.id, max_output_tokens=4, temperature=0
    )
    assert follow.usage is not None and first.usage is not None
    assert follow.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    rows = (
        sqlite3.connect(tmp_path / "serve.usage.sqlite").execute("SELECT count(*) FROM documents").fetchone()
    )
    assert rows == (2,)
    assert s.stop() == 0

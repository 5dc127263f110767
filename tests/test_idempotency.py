"""``Idempotency-Key`` on ``lmplex serve``: a call sent again with its key is answered with the first
reply, not run or counted again; a retry while the first still runs is a 409 with ``Retry-After``; the
key with another body is a 422; keys are each tenant's own; a failure or a stream gives the key up.
Two servers on one SQLite usage store share the keys, and a key held by a server killed mid-call is
free within seconds."""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_util import Server, usage_as

KEYS = {"a": "sk-a-0123456789abcdef", "b": "sk-b-0123456789abcdef"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_path: str) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp("idempotency"),
        [{"model_id": smollm2_path, "name": "small", "max_model_len": 512}],
        tenants=[{"name": n, "api_key": k} for n, k in KEYS.items()],
    )
    srv.wait_ready()
    yield srv
    assert srv.stop() == 0, "".join(srv.log)


def _chat(text: str, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    body = {"model": "small", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
    return {**body, "temperature": 0, **extra}


def _post(
    url: str, tenant: str, key: str | None, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=120)


def _running(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(
        float(v) for v in re.findall(r"^lmplex_num_requests_running\{[^}]*\} (\S+)$", text, re.MULTILINE)
    )


def _wait_running(url: str) -> None:
    deadline = time.monotonic() + 30
    while _running(url) < 1:
        assert time.monotonic() < deadline, "the call never started"
        time.sleep(0.02)


def test_a_call_sent_again_gets_its_first_reply_and_is_counted_once(server: Server) -> None:
    before = usage_as(server.url, KEYS["a"])
    first = _post(server.url, "a", "k-replay", _chat("Name a colour."))
    again = _post(server.url, "a", "k-replay", _chat("Name a colour."))
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert again.content == first.content and again.json()["id"] == first.json()["id"]
    assert again.headers["idempotent-replayed"] == "true" and "idempotent-replayed" not in first.headers
    after = usage_as(server.url, KEYS["a"])
    assert after["requests"] == before["requests"] + 1
    assert (
        after["completion_tokens"] == before["completion_tokens"] + first.json()["usage"]["completion_tokens"]
    )
    # Another tenant's call with the same key is its own.
    other = _post(server.url, "b", "k-replay", _chat("Name a colour."))
    assert other.status_code == 200 and "idempotent-replayed" not in other.headers
    assert other.json()["id"] != first.json()["id"]
    # The same key with another body is refused, naming the reason.
    reused = _post(server.url, "a", "k-replay", _chat("Name a fruit."))
    assert reused.status_code == 422 and reused.json()["error"]["code"] == "idempotency_key_reused"
    # Without a key nothing is kept: the same body runs again.
    plain = [_post(server.url, "a", None, _chat("Name a colour.")) for _ in range(2)]
    assert plain[0].json()["id"] != plain[1].json()["id"]


def test_a_retry_while_the_first_runs_is_a_409_then_gets_its_reply(server: Server) -> None:
    body = _chat("Tell me a long story.", max_tokens=160, ignore_eos=True)
    first: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: first.append(_post(server.url, "a", "k-running", body)))
    worker.start()
    _wait_running(server.url)
    busy = _post(server.url, "a", "k-running", body)
    worker.join()
    assert busy.status_code == 409, busy.text
    assert busy.json()["error"]["code"] == "request_in_progress" and busy.headers["retry-after"] == "1"
    again = _post(server.url, "a", "k-running", body)
    assert again.status_code == 200 and again.content == first[0].content


def test_failures_and_streams_give_the_key_up(server: Server) -> None:
    bad = _chat("Hi", max_tokens=-1)
    assert [_post(server.url, "a", "k-bad", bad).status_code for _ in range(2)] == [400, 400]
    ok = _post(server.url, "a", "k-bad", _chat("Hi"))
    assert ok.status_code == 200 and "idempotent-replayed" not in ok.headers, "a failure gave the key up"
    stream = _chat("Hi", stream=True)
    ids = []
    for _ in range(2):
        r = _post(server.url, "a", "k-stream", stream)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        ids.append(re.search(r'"id":"([^"]+)"', r.text).group(1))  # type: ignore[union-attr]
    assert ids[0] != ids[1], "a stream cannot be replayed: it runs again once the first has ended"
    for key in (b"", b"x" * 256, b"a b", "caf\u00e9".encode("latin-1")):
        r = httpx.post(
            f"{server.url}/v1/chat/completions",
            json=_chat("Hi"),
            headers={b"Authorization": f"Bearer {KEYS['a']}".encode(), b"Idempotency-Key": key},
        )
        assert r.status_code == 400 and "idempotency-key" in r.json()["error"]["message"], r.text


def test_servers_on_one_store_share_keys_and_a_dead_servers_key_lapses(
    tmp_path: Path, smollm2_path: str
) -> None:
    store = f"sqlite:{tmp_path / 'usage.sqlite'}"
    model = {"model_id": smollm2_path, "name": "small", "max_model_len": 512}
    tenants: list[dict[str, object]] = [{"name": "a", "api_key": KEYS["a"]}]
    servers = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        servers.append(Server(tmp_path / name, [model], tenants=tenants, usage_store=store))
    one, two = servers
    try:
        one.wait_ready()
        two.wait_ready()
        first = _post(one.url, "a", "k-shared", _chat("Name a colour."))
        again = _post(two.url, "a", "k-shared", _chat("Name a colour."))
        assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
        assert again.content == first.content
        # Server one dies holding a key: server two refuses it while the claim lives, then runs it.
        body = _chat("Tell me a long story.", max_tokens=400, ignore_eos=True)

        def doomed() -> None:
            with contextlib.suppress(httpx.HTTPError):  # its server is killed under it
                _post(one.url, "a", "k-dead", body)

        threading.Thread(target=doomed, daemon=True).start()
        _wait_running(one.url)
        one.proc.send_signal(signal.SIGKILL)
        one.proc.wait(10)
        killed = time.monotonic()
        answers = []
        while True:
            r = _post(two.url, "a", "k-dead", body)
            answers.append(r.status_code)
            if r.status_code != 409:
                break
            assert time.monotonic() - killed < 10, answers
            time.sleep(0.5)
        assert r.status_code == 200 and "idempotent-replayed" not in r.headers, r.text
        assert answers[0] == 409, "the dead server's claim held at first"
    finally:
        for srv in servers:
            if srv.proc.poll() is None:
                srv.stop()

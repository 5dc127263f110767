"""What one client may hold or send to ``lmplex serve``: the body cap (413), a body that stops
arriving (408), the cap on open connections (503 with ``Retry-After``), oversized headers (431); each
refusal an OpenAI-shaped JSON error, and the server serving normally afterwards."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from server_util import Server

CAP = 4096


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_path: str) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp("limits"),
        [{"model_id": smollm2_path, "name": "smol", "max_model_len": 512}],
        max_request_body_bytes=CAP,
        request_read_timeout_s=1.0,
        max_connections=3,
    )
    srv.wait_ready()
    yield srv
    # A client stalled in its headers does not hold the shutdown.
    stalled = _raw(srv, b"GET /health HTTP/1.1\r\n")
    t = time.monotonic()
    assert srv.stop() == 0, "".join(srv.log)
    assert time.monotonic() - t < 20
    stalled.close()


def _chat(text: str) -> dict[str, object]:
    return {"model": "smol", "messages": [{"role": "user", "content": text}], "max_tokens": 1}


def _serves(server: Server) -> None:
    r = httpx.post(f"{server.url}/v1/chat/completions", json=_chat("hi"), timeout=60)
    assert r.status_code == 200, r.text


def _raw(server: Server, data: bytes) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(data)
    return s


def _read_response(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    want = int(headers.get("content-length", "0"))
    while len(body) < want:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def test_a_body_past_the_cap_is_a_413(server: Server) -> None:
    big = _chat("x" * CAP)
    r = httpx.post(f"{server.url}/v1/chat/completions", json=big, timeout=30)
    assert r.status_code == 413
    err = r.json()["error"]
    assert err["code"] == "request_too_large" and f"larger than {CAP} bytes" in err["message"]
    # Sent without a length (chunked): refused as it is read, with the same error.
    chunked = httpx.post(
        f"{server.url}/v1/chat/completions",
        content=iter([json.dumps(big).encode()]),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "request_too_large"
    # Anthropic's route answers in its own shape.
    m = httpx.post(f"{server.url}/v1/messages", content=b"{" + b" " * CAP + b"}", timeout=30)
    assert m.status_code == 413 and m.json()["type"] == "error"
    assert m.json()["error"]["type"] == "request_too_large"
    _serves(server)


def test_a_body_that_stops_arriving_is_a_408(server: Server) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        b"content-type: application/json\r\ncontent-length: 200\r\n\r\n"
    )
    s = _raw(server, head + b'{"model": "smol",')
    t = time.monotonic()
    status, _, body = _read_response(s)
    s.close()
    assert status == 408, body
    assert 0.9 < time.monotonic() - t < 10
    assert "request_read_timeout_s" in json.loads(body)["error"]["message"]
    _serves(server)


def test_headers_that_stall_close_the_connection(server: Server) -> None:
    s = _raw(server, b"GET /health HTTP/1.1\r\nhost: x\r\n")
    s.settimeout(15)
    t = time.monotonic()
    data = b""
    while chunk := s.recv(4096):  # hyper answers 408 or just closes
        data += chunk
    s.close()
    assert time.monotonic() - t < 10 and b"200 OK" not in data
    _serves(server)


def test_connections_past_the_cap_get_503_with_retry_after(server: Server) -> None:
    # Three idle connections hold every place (one request on each, kept alive).
    held = []
    for _ in range(3):
        s = _raw(server, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert _read_response(s)[0] == 200
        held.append(s)
    s = _raw(server, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    status, headers, body = _read_response(s)
    s.close()
    assert status == 503 and headers["retry-after"] == "1"
    assert "max_connections" in json.loads(body)["error"]["message"]
    for s in held:
        s.close()
    deadline = time.monotonic() + 10
    while True:  # the server notices the closes
        try:
            _serves(server)
            break
        except AssertionError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_oversized_headers_are_refused_and_the_server_goes_on(server: Server) -> None:
    r = httpx.get(f"{server.url}/health", headers={"x-big": "a" * (1 << 20)}, timeout=30)
    assert r.status_code == 431
    _serves(server)


def test_a_prompt_too_long_for_any_tokenization_is_refused_untokenized(smollm2_path: str) -> None:
    import lmplex

    engine = lmplex.Engine(lmplex.ModelConfig(smollm2_path, max_model_len=512))
    huge = "word " * 2_000_000  # 10 MB: refused by its length, never tokenized
    with pytest.raises(lmplex.InvalidRequest, match="bytes of text, more than 512 tokens"):
        engine.generate(huge)
    with pytest.raises(lmplex.InvalidRequest, match="bytes of text"):
        engine.chat([{"role": "user", "content": huge}])
    # A prompt within the bound is tokenized and refused (or run) by its tokens, as before.
    with pytest.raises(lmplex.InvalidRequest, match="max_model_len is 512"):
        engine.generate("word " * 600)

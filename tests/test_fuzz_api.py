"""The server's OpenAPI document and schema-driven fuzzing of every route (``scripts/fuzz-api``), bounded
for CI: 2,000 generated calls, valid and invalid, with tenants on. No 5xx, no hang, no panic, every reply
matching the document; afterwards the server serves and its gauges are back at their baseline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from server_util import Server

ROOT = Path(__file__).resolve().parent.parent


def test_openapi_document_is_served(tmp_path: Path, smollm2_path: str) -> None:
    srv = Server(tmp_path, [{"model_id": smollm2_path, "served_model_name": "smol", "max_model_len": 256}])
    try:
        srv.wait_ready()
        doc = httpx.get(f"{srv.url}/openapi.json").json()
        assert doc["openapi"].startswith("3.1"), doc["openapi"]
        chat = doc["paths"]["/v1/chat/completions"]["post"]
        assert chat["requestBody"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ChatRequest"
        }
        replies = chat["responses"]
        assert set(replies["200"]["content"]) == {"application/json", "text/event-stream"}
        assert replies["4XX"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
        # The Anthropic route answers errors in Anthropic's shape.
        messages = doc["paths"]["/v1/messages"]["post"]["responses"]
        assert messages["4XX"]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/AnthropicErrorBody"
        )
        assert {"bearer", "x_api_key"} <= set(doc["components"]["securitySchemes"])
        # A reply matches its schema's required fields, e.g. the model list.
        models = httpx.get(f"{srv.url}/v1/models").json()
        assert models["object"] == "list" and models["data"][0]["id"] == "smol"
    finally:
        assert srv.stop() == 0, "".join(srv.log)


def test_whole_floats_are_integers(tmp_path: Path, smollm2_path: str) -> None:
    """JSON Schema's `integer` (and vLLM's pydantic) accept `4.0`; `4.5` is a 400 naming the field."""
    srv = Server(tmp_path, [{"model_id": smollm2_path, "served_model_name": "smol", "max_model_len": 256}])
    try:
        srv.wait_ready()
        body = {"model": "smol", "prompt": "Hello", "max_tokens": 4.0, "temperature": 0, "n": 1.0}
        r = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] <= 4
        r = httpx.post(f"{srv.url}/v1/completions", json={**body, "max_tokens": 4.5}, timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "max_tokens", r.text
    finally:
        assert srv.stop() == 0, "".join(srv.log)


def test_choice_the_vocabulary_cannot_spell(tmp_path: Path, smollm2_path: str) -> None:
    """Found by the fuzzer: SmolLM2's vocabulary has no token for the byte 0xF1, so a choice holding
    U+65742 cannot be written; it was a 500 with the parser's state, and is a 400 naming the choice. A
    regex that forces the same bytes fails the same way once generation reaches them."""
    srv = Server(tmp_path, [{"model_id": smollm2_path, "served_model_name": "smol", "max_model_len": 256}])
    try:
        srv.wait_ready()
        chat = {"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
        r = httpx.post(f"{srv.url}/v1/chat/completions", json={**chat, "guided_choice": ["\U00065742\x1e"]})
        assert r.status_code == 400, r.text
        assert "choice 0" in r.json()["error"]["message"], r.text
        r = httpx.post(
            f"{srv.url}/v1/chat/completions", json={**chat, "guided_regex": "\U00065742"}, timeout=60
        )
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert "cannot be followed with this model's tokens" in message and "<state>" not in message, message
        # A choice every byte of which the vocabulary spells is written exactly.
        r = httpx.post(
            f"{srv.url}/v1/chat/completions", json={**chat, "guided_choice": ["\x1e\x1bok"]}, timeout=60
        )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "\x1e\x1bok"
    finally:
        assert srv.stop() == 0, "".join(srv.log)


@pytest.mark.usefixtures("smollm2_path")
def test_schema_driven_fuzzing(tmp_path: Path) -> None:
    pytest.importorskip("schemathesis")  # Python 3.11 or newer (the test extra's marker)
    out = tmp_path / "fuzz.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fuzz-api"), "--cases", "2000", "--json", str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.exists(), run.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["cases"] >= 1500, report["by_operation"]
    # Every operation ran (schemathesis leaves out the document's own URL, fetched above), and some
    # calls reached the engine.
    assert len(report["by_operation"]) == 19 and "GET /openapi.json" not in report["by_operation"]
    assert report["statuses"].get("2xx", 0) >= 50, report["statuses"]
    assert report["server_errors"] == 0, report["failure_list"][:5]
    assert report["hangs"] == 0, report["failure_list"][:5]
    assert report["panics"] == 0
    assert report["failures"] == 0, json.dumps(report["failure_list"][:5], indent=2)
    assert report["served_after"] and report["gauges_at_baseline"], report["gauges"]
    assert report["exit_code"] == 0
    assert run.returncode == 0, run.stderr[-4000:]

"""Pytest plugin that points llama.cpp's server tests (``tools/server/tests``) at a running ``lmplex serve``.

Loaded by run.py as ``pytest -p llamacpp_plugin`` from ``tools/server/tests`` with ``DEBUG_EXTERNAL=1``, which
makes llama.cpp's ``ServerProcess.start()``/``stop()`` do nothing. This plugin then:

* pins every ``ServerProcess`` to ``LMPLEX_HOST``/``PORT`` (tests assign ``server_port = 8081``);
* prefixes ``/v1`` to the OpenAI routes that llama-server also serves without it (lmplex serves ``/v1/...``);
  llama-server's own ``/embeddings`` (not OpenAI's shape) and ``/tokenize`` keep their paths;
* adds an empty ``timings`` (a llama-server extension) to usage-only stream chunks, which the tests' stream
  helper asserts.

Per-test server settings (model, template, context size, flags) are ignored: run.py picks the tests that
fit the one model it serves.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from typing import Any

OPENAI_ROUTES = ("/chat/completions", "/completions", "/models", "/responses")


def v1(path: str) -> str:
    """``/chat/completions`` -> ``/v1/chat/completions``; other paths unchanged."""
    return "/v1" + path if path.split("?", 1)[0] in OPENAI_ROUTES else path


def pytest_configure() -> None:
    utils: Any = importlib.import_module("utils")  # llama.cpp's tests/utils.py, on sys.path via conftest
    server_class: Any = utils.ServerProcess
    port = int(os.environ["PORT"])
    host = os.environ.get("LMPLEX_HOST", "127.0.0.1")
    server_class.server_port = property(lambda self: port, lambda self, value: None)
    server_class.server_host = property(lambda self: host, lambda self, value: None)

    request = server_class.make_request
    stream_request = server_class.make_stream_request

    def make_request(self: Any, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        return request(self, method, v1(path), *args, **kwargs)

    def make_stream_request(self: Any, method: str, path: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for chunk in stream_request(self, method, v1(path), *args, **kwargs):
            if isinstance(chunk, dict) and not chunk.get("choices") and "usage" in chunk:
                chunk.setdefault("timings", {})
            yield chunk

    server_class.make_request = make_request
    server_class.make_stream_request = make_stream_request

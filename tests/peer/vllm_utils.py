"""Stand-in for vLLM's ``tests/utils.py`` (run.py copies it there): ``RemoteOpenAIServer`` talks to the
``lmplex serve`` at ``LMPLEX_BASE_URL`` instead of starting ``vllm serve``.

The server arguments a test passes are ignored; ``get_client_anthropic`` and its async twin give Anthropic
clients, as vLLM's do (sending the key as ``x-api-key``). A test module whose model lmplex does not serve is
skipped with a message naming both, so run.py decides what runs by the names it serves.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlparse

import anthropic
import httpx
import openai
import pytest
from typing_extensions import Self

VLLM_PATH = Path(__file__).resolve().parent.parent
ROCM_ENV_OVERRIDES: dict[str, str] = {}
ROCM_EXTRA_ARGS: list[str] = []


class RemoteOpenAIServer:
    DUMMY_API_KEY = "token-abc123"

    def __init__(self, model: str, vllm_serve_args: list[str] | None = None, **_: Any) -> None:
        self.url_root = os.environ["LMPLEX_BASE_URL"].rstrip("/")
        parsed = urlparse(self.url_root)
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or 80
        self.uds: str | None = None
        served = [m["id"] for m in httpx.get(self.url_for("v1/models"), timeout=30).json()["data"]]
        if model not in served:
            pytest.skip(f"lmplex serves {served}, not {model}")
        self.model = model

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def url_for(self, *parts: str) -> str:
        path = "/".join(part.strip("/") for part in parts if part)
        return f"{self.url_root}/{path}"

    def get_client(self, **kwargs: Any) -> openai.OpenAI:
        kwargs.setdefault("timeout", 600)
        return openai.OpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs)

    def get_async_client(self, **kwargs: Any) -> openai.AsyncOpenAI:
        kwargs.setdefault("timeout", 600)
        return openai.AsyncOpenAI(
            base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs
        )

    def get_client_anthropic(self, **kwargs: Any) -> anthropic.Anthropic:
        kwargs.setdefault("timeout", 600)
        return anthropic.Anthropic(
            base_url=self.url_for(), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs
        )

    def get_async_client_anthropic(self, **kwargs: Any) -> anthropic.AsyncAnthropic:
        kwargs.setdefault("timeout", 600)
        return anthropic.AsyncAnthropic(
            base_url=self.url_for(), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs
        )


RemoteOpenAIServerCustom = RemoteOpenAIServer

"""Stand-in for vLLM's ``tests/tool_use/conftest.py`` (run.py copies it there).

vLLM's version runs every model of ``CONFIGS`` (downloading each). This one runs one config,
``LMPLEX_TOOL_CONFIG`` (default ``hermes``: the ``<tool_call>`` format of Qwen2.5 and Hermes), against the
first model the lmplex server lists, as the tests themselves do (``models.list()[0]``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import openai
import pytest

F = TypeVar("F", bound=Callable[..., Any])
async_fixture: Callable[[F], F] = importlib.import_module("pytest_asyncio").fixture


@pytest.fixture(scope="session")
def server_config() -> dict[str, Any]:
    configs: dict[str, Any] = importlib.import_module("tests.tool_use.utils").CONFIGS
    return dict(configs[os.environ.get("LMPLEX_TOOL_CONFIG", "hermes")])


@pytest.fixture(scope="session")
def server(server_config: dict[str, Any]) -> Iterator[Any]:
    remote: Any = importlib.import_module("tests.utils").RemoteOpenAIServer
    with remote(server_config["model"], []) as server:
        yield server


@async_fixture
async def client(server: Any) -> AsyncIterator[openai.AsyncOpenAI]:
    async with server.get_async_client() as async_client:
        yield async_client

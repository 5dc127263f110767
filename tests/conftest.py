"""Shared fixtures: the SmolLM2 checkpoint and one engine loaded from it for the whole session.

Tests that need real weights take ``smollm2_path``, ``qwen_coder_path`` or ``engine``. Without a fetched model they skip
with the command that fetches it, unless ``LMPLEX_REQUIRE_MODELS=1`` (set by scripts/test in CI), where a
missing model is a failure. Nothing here downloads anything, and no test reaches the real Hugging Face
Hub: ``HF_HUB_OFFLINE=1`` is set for the session (tests/test_hub.py unsets it against its loopback Hub).
"""

from __future__ import annotations

import codecs
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_util import kill_started_since, started

import lmplex
from lmplex import ModelConfig, ModelLoadError, models

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SMOLLM2 = "smollm2-135m-instruct"
QWEN_CODER = "qwen2.5-coder-0.5b-instruct"


def zen_of_python() -> str:
    """The Zen of Python as ``import this`` prints it (without printing it): a short English text every
    CPython ships, the perplexity tests' corpus."""
    spec = importlib.util.find_spec("this")
    assert spec is not None and spec.origin is not None
    encoded = Path(spec.origin).read_text(encoding="utf-8").split('s = """', 1)[1].split('"""', 1)[0]
    return codecs.decode(encoded, "rot13")


def fetched_model(alias: str) -> str:
    """The verified checkpoint of a fetched alias; skips (or fails under LMPLEX_REQUIRE_MODELS=1)."""
    try:
        return models.resolve(alias)
    except ModelLoadError as err:
        message = f"{err} (or: python -m lmplex models fetch {alias})"
        if os.environ.get("LMPLEX_REQUIRE_MODELS") == "1":
            pytest.fail(f"LMPLEX_REQUIRE_MODELS=1 but the test model is missing: {message}")
        pytest.skip(message)


@pytest.fixture(autouse=True)
def _no_server_outlives_its_test() -> Iterator[None]:
    before = started()
    yield
    kill_started_since(before)


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    """The verified SmolLM2-135M-Instruct GGUF file."""
    return fetched_model(SMOLLM2)


@pytest.fixture(scope="session")
def qwen_coder_path() -> str:
    """The verified Qwen2.5-Coder-0.5B-Instruct GGUF file."""
    return fetched_model(QWEN_CODER)


@pytest.fixture(scope="session")
def engine(smollm2_path: str) -> lmplex.Engine:
    """SmolLM2 loaded once for the session, with a 2048-token context."""
    return lmplex.Engine(ModelConfig(smollm2_path, max_model_len=2048))

"""Root ``conftest.py`` for vLLM's tests against lmplex (run.py copies it there; vLLM's own root conftest,
which imports torch and vLLM, is not fetched).

The test modules import ``torch`` and ``vllm.*`` at module level, mostly for unit tests of vLLM's own
classes, which run.py deselects. This installs stub modules for both so the modules import:

* any attribute of a stub module is a ``MagicMock`` (an ``Exception`` subclass for ``*Error`` names);
* ``torch.iinfo`` gives int64's limits (``test_long_seed``);
* ``vllm.config.ModelConfig(model).get_vocab_size()`` gives the vocabulary size of the models listed in
  ``VOCAB_SIZES`` (the logit_bias tests), which the stand-in model shares;
* ``vllm.tokenizers.get_tokenizer`` gives the tokenizer of the stand-in model that run.py serves under
  every name (``LMPLEX_PEER_TOKENIZER``, loaded with lmplex) instead of downloading the Hugging Face one;
  without that variable the test is skipped.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Sequence
from typing import Any
from unittest.mock import MagicMock

import pytest

STUBBED = ("vllm", "torch")
VOCAB_SIZES = {"Qwen/Qwen2.5-1.5B-Instruct": 151936}


class ModelConfig:
    def __init__(self, model: str, **_: Any) -> None:
        self.model = model

    def get_vocab_size(self) -> int:
        return VOCAB_SIZES[self.model]


class Tokenizer:
    """The ``encode``/``decode`` of a Hugging Face tokenizer, from an lmplex engine."""

    def __init__(self, alias: str) -> None:
        self.engine: Any = importlib.import_module("lmplex").Engine(alias, max_model_len=256)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = self.engine.tokenize(text, add_special_tokens=add_special_tokens)
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        text: str = self.engine.detokenize(list(token_ids), skip_special_tokens=skip_special_tokens)
        return text


@functools.cache
def stand_in_tokenizer(alias: str) -> Tokenizer:
    return Tokenizer(alias)


def get_tokenizer(tokenizer_name: str, **_: Any) -> Any:
    alias = os.environ.get("LMPLEX_PEER_TOKENIZER")
    if not alias:
        pytest.skip(f"needs the Hugging Face tokenizer of {tokenizer_name}, which is not downloaded")
    return stand_in_tokenizer(alias)


def iinfo(_dtype: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(min=-(2**63), max=2**63 - 1, bits=64)


OVERRIDES: dict[str, dict[str, Any]] = {
    "torch": {"long": "int64", "iinfo": iinfo},
    "vllm.config": {"ModelConfig": ModelConfig},
    "vllm.tokenizers": {"get_tokenizer": get_tokenizer},
}


class StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value: Any
        if name.endswith(("Error", "Exception")):
            value = type(name, (Exception,), {})
        else:
            value = MagicMock(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in STUBBED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return StubModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []
        for name, value in OVERRIDES.get(module.__name__, {}).items():
            setattr(module, name, value)


sys.meta_path.insert(0, StubFinder())

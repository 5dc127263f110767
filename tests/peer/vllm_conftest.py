"""Stand-in for vLLM's ``tests/conftest.py`` (run.py copies it there; vLLM's own, which imports torch and
vLLM, is not fetched).

The test modules import ``torch``, ``transformers`` and ``vllm.*`` at module level, mostly for unit tests
of vLLM's own classes, which run.py deselects. This installs stub modules for them so the modules import:

* any attribute of a stub module is a ``MagicMock`` (an ``Exception`` subclass for ``*Error`` names);
* ``torch.iinfo`` gives int64's limits (``test_long_seed``);
* ``vllm.config.ModelConfig(model).get_vocab_size()`` gives the vocabulary size of the models listed in
  ``VOCAB_SIZES`` (the logit_bias tests), which the stand-in model shares;
* ``vllm.tokenizers.get_tokenizer`` gives the tokenizer of the stand-in model that run.py serves under
  every name (``LMPLEX_PEER_TOKENIZER``, loaded with lmplex) instead of downloading the Hugging Face one;
  without that variable the test is skipped. Its ``apply_chat_template`` renders the GGUF's template with
  jinja2 as transformers does, independently of lmplex's own renderer;
* ``vllm.entrypoints.pooling.embed.protocol.EmbeddingResponse`` is vLLM's pydantic model, copied;
* ``hf_runner`` (the transformers reference model of the embedding tests) skips: it is a Hub download.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
import types
import uuid
from collections.abc import Sequence
from typing import Any, NoReturn
from unittest.mock import MagicMock

import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import BaseModel, ConfigDict, Field

STUBBED = ("vllm", "torch", "transformers")
VOCAB_SIZES = {"Qwen/Qwen2.5-1.5B-Instruct": 151936}


class ModelConfig:
    def __init__(self, model: str, **_: Any) -> None:
        self.model = model

    def get_vocab_size(self) -> int:
        return VOCAB_SIZES[self.model]


class Tokenizer:
    """What the tests call of a Hugging Face tokenizer: ``encode``/``decode`` from an lmplex engine, and
    ``convert_ids_to_tokens`` and ``apply_chat_template`` from the model's GGUF metadata."""

    def __init__(self, alias: str) -> None:
        self.engine: Any = importlib.import_module("lmplex").Engine(alias, max_model_len=256)
        reader = importlib.import_module("gguf").GGUFReader(self.engine.path)

        def field(key: str) -> Any:
            value = reader.fields[key]
            return [bytes(value.parts[i]).decode() for i in value.data]

        self.vocab: list[str] = field("tokenizer.ggml.tokens")
        self.chat_template: str = field("tokenizer.chat_template")[0]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = self.engine.tokenize(text, add_special_tokens=add_special_tokens)
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        text: str = self.engine.detokenize(list(token_ids), skip_special_tokens=skip_special_tokens)
        return text

    def convert_ids_to_tokens(self, token_ids: Sequence[int]) -> list[str]:
        return [self.vocab[i] for i in token_ids]

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        tokenize: bool = True,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> str | list[int]:
        """transformers' ``apply_chat_template``: the same jinja2 settings, filters and globals, and the
        same cut after the final message's text for ``continue_final_message``."""
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: time.strftime(fmt)
        prompt = env.from_string(chat_template or self.chat_template).render(
            messages=conversation, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs
        )
        if continue_final_message:
            final = conversation[-1]["content"]
            final = final if final in prompt else final.strip()
            prompt = prompt[: prompt.rindex(final) + len(final)]
        return self.encode(prompt, add_special_tokens=False) if tokenize else prompt


def tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson`` filter (jinja2's own escapes HTML characters)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def raise_exception(message: str) -> NoReturn:
    raise ValueError(message)


@functools.cache
def stand_in_tokenizer(alias: str) -> Tokenizer:
    return Tokenizer(alias)


def get_tokenizer(tokenizer_name: str, **_: Any) -> Any:
    alias = os.environ.get("LMPLEX_PEER_TOKENIZER")
    if not alias:
        pytest.skip(f"needs the Hugging Face tokenizer of {tokenizer_name}, which is not downloaded")
    return stand_in_tokenizer(alias)


class HfRunner:
    """vLLM's transformers runner, which loads the model from the Hugging Face Hub: the test is skipped."""

    def __init__(self, model_name: str, *args: Any, **kwargs: Any) -> None:
        pytest.skip(f"compares with {model_name} run by transformers, a Hub download")


@pytest.fixture(scope="session")
def hf_runner() -> type[HfRunner]:
    return HfRunner


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: dict[str, Any] | None = None
    completion_tokens_details: dict[str, Any] | None = None


class EmbeddingResponseData(OpenAIBaseModel):
    index: int
    object: str = "embedding"
    embedding: list[float] | str


class EmbeddingResponse(OpenAIBaseModel):
    """vLLM's ``EmbeddingResponse``, with its defaults for the fields a response may leave out."""

    id: str = Field(default_factory=lambda: f"embd-{uuid.uuid4().hex}")
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str | None = None
    data: list[EmbeddingResponseData]
    usage: UsageInfo


def iinfo(_dtype: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(min=-(2**63), max=2**63 - 1, bits=64)


OVERRIDES: dict[str, dict[str, Any]] = {
    "torch": {"long": "int64", "iinfo": iinfo},
    "vllm.config": {"ModelConfig": ModelConfig},
    "vllm.tokenizers": {"get_tokenizer": get_tokenizer},
    "vllm.entrypoints.pooling.embed.protocol": {"EmbeddingResponse": EmbeddingResponse},
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

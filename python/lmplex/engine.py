"""The Python face of one loaded model: :class:`Engine`, and the :func:`generate` one-liner.

:class:`Engine` resolves a model id (a path or a fetched alias, see :mod:`lmplex.models`) and wraps
``lmplex._core.Engine``; the work happens in Rust with the GIL released. This module only shapes
arguments.

Invariants:

* ``Engine.generate`` always returns ``list[RequestOutput]``, one per prompt, in prompt order.
* A prompt is a ``str`` (sent as is, no chat template), a list of message dicts (rendered with the
  model's chat template) or a list of token ids (sent as they are, like vLLM's ``TokensPrompt``). A
  list whose items are all mappings, or all ints, is *one* prompt; a list of strings, message lists or
  token-id lists is a batch. Anything else is :class:`InvalidRequest`, raised before the core sees it.
* The module-level :func:`generate` keeps one Engine per model id for the life of the process.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Union

from lmplex import _core, models
from lmplex._core import InvalidRequest, ModelConfig, RequestOutput, SamplingParams

__all__ = ["Engine", "generate"]

Message = dict[str, str]

_ASYNC_USED = threading.Event()


def _async_used() -> None:
    """Registers, once, the exit hook that gives up the GIL briefly so the async runtime's threads
    finish handing results to Python before the interpreter finalizes (without it, about one exit in
    ten after a batch of ``agenerate`` calls aborted or segfaulted: PyO3/pyo3-async-runtimes#40)."""
    if not _ASYNC_USED.is_set():
        _ASYNC_USED.set()
        atexit.register(_core.drain_async, 1.0)


Prompt = Union[str, Sequence[Mapping[str, str]], Sequence[int]]


class Engine:
    """One loaded model.

    ``Engine("smollm2-135m-instruct")`` or ``Engine(ModelConfig(path, max_model_len=2048))``; with a model
    id string, keyword arguments go to :class:`ModelConfig`.
    """

    def __init__(self, config: ModelConfig | str, **config_kwargs: Any) -> None:
        if isinstance(config, str):
            config = ModelConfig(config, **config_kwargs)
        elif config_kwargs:
            raise TypeError("keyword arguments are only accepted with a model id string, not a ModelConfig")
        path = models.resolve(config.model_id)
        self._engine = _core.Engine(config, path)
        self._path = path

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        priority: int | Sequence[int] | None = None,
        cache_salt: str | None = None,
    ) -> list[RequestOutput]:
        """Run one prompt or a batch of prompts to completion; one :class:`RequestOutput` per prompt.

        The prompts run as one continuous batch, together with whatever else this engine is running.
        ``params`` is one :class:`SamplingParams` for all prompts or one per prompt; the default is
        ``SamplingParams()``. ``priority`` (one for all or one per prompt; lower runs first) matters
        under ``ModelConfig(scheduling_policy="priority")``. ``cache_salt`` (e.g. a tenant id) keeps
        these prompts' cached prefixes apart from requests with another salt.
        """
        batch, params = _batch_and_params(prompts, params)
        return self._engine.generate(batch, params, priority, cache_salt) if batch else []

    async def agenerate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        priority: int | Sequence[int] | None = None,
        cache_salt: str | None = None,
    ) -> list[RequestOutput]:
        """:meth:`generate` for asyncio: awaits the outputs without blocking the event loop."""
        batch, params = _batch_and_params(prompts, params)
        _async_used()
        return await self._engine.agenerate(batch, params, priority, cache_salt) if batch else []

    def stream(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> _core.StreamIterator:
        """Stream one prompt's reply as :class:`StreamChunk` pieces; the last one has ``finish_reason``.

        Closing the iterator (``close()``) or dropping it before the end aborts the request and
        frees its KV memory at once.
        """
        params = params if params is not None else SamplingParams()
        return self._engine.stream(_one(prompt, "stream"), params, priority, cache_salt)

    def astream(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> _core.AsyncStreamIterator:
        """:meth:`stream` for asyncio: ``async for chunk in engine.astream(...)``."""
        params = params if params is not None else SamplingParams()
        _async_used()
        return self._engine.astream(_one(prompt, "astream"), params, priority, cache_salt)

    def abort(self, request_id: int) -> None:
        """Abort a running request by the ``request_id`` of its stream; unknown ids are ignored."""
        self._engine.abort(request_id)

    def stats(self) -> dict[str, int]:
        """Scheduler and KV-pool counters: running, waiting, free blocks, prefix-cache hits, ..."""
        return self._engine.stats()

    def chat(
        self, messages: Sequence[Mapping[str, str]], params: SamplingParams | None = None
    ) -> RequestOutput:
        """Reply to a conversation (a list of ``{"role": ..., "content": ...}`` dicts)."""
        if isinstance(messages, str) or not _is_messages(messages):
            raise InvalidRequest("chat takes a list of message dicts with 'role' and 'content'")
        return self.generate([messages], params)[0]

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special tokens (e.g. BOS) are added only where the model asks for them."""
        return self._engine.tokenize(text, add_special_tokens)

    def detokenize(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``token_ids``."""
        return self._engine.detokenize(token_ids, skip_special_tokens)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """The prompt text the model's chat template makes of ``messages``."""
        return self._engine.apply_chat_template(_messages(messages), add_generation_prompt)

    def memory(self) -> dict[str, int]:
        """Bytes by category: ``weights``; ``kv_cache`` (the pool, reserved at load) split into
        ``kv_cache_used``, ``kv_cache_cached`` (free but holding reusable prefixes) and
        ``kv_cache_free``; ``other``; ``total``."""
        return self._engine.memory()

    @property
    def info(self) -> dict[str, str | int | float | bool]:
        """What was loaded: architecture, sizes, quantization, device, ..."""
        return self._engine.info

    @property
    def max_model_len(self) -> int:
        """The most tokens (prompt plus reply) one request may hold."""
        return self._engine.max_model_len

    @property
    def config(self) -> ModelConfig:
        """The :class:`ModelConfig` this engine was built with."""
        return self._engine.config

    @property
    def path(self) -> str:
        """The checkpoint file or folder that was loaded."""
        return self._path

    def __repr__(self) -> str:
        return f"Engine(model_id={self.config.model_id!r}, path={self._path!r})"


_ENGINES: dict[str, Engine] = {}
_ENGINES_LOCK = threading.Lock()


def generate(prompt: Prompt, model: str = models.DEFAULT_MODEL, **sampling_kwargs: Any) -> str:
    """Generate a reply to one prompt and return its text; keyword arguments go to SamplingParams.

    A ``str`` prompt is sent as is; pass ``[{"role": "user", "content": ...}]`` for the chat template.
    The Engine for ``model`` is loaded on first use and kept for the life of the process.
    """
    with _ENGINES_LOCK:
        engine = _ENGINES.get(model)
        if engine is None:
            engine = _ENGINES[model] = Engine(model)
    batch = _as_batch(prompt)
    if len(batch) != 1:
        raise InvalidRequest(
            f"generate() takes one prompt, got {len(batch)}; use Engine.generate for batches"
        )
    return engine.generate(batch, SamplingParams(**sampling_kwargs))[0].text


def _batch_and_params(
    prompts: Prompt | Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None
) -> tuple[list[str | list[Message] | list[int]], SamplingParams | list[SamplingParams]]:
    """The batch of prompts and one SamplingParams for all or one each (checked against the batch)."""
    batch = _as_batch(prompts)
    if params is None:
        return batch, SamplingParams()
    if isinstance(params, SamplingParams):
        return batch, params
    each = list(params)
    if len(each) != len(batch):
        raise InvalidRequest(f"got {len(each)} SamplingParams for {len(batch)} prompts")
    return batch, each


def _one(prompt: Prompt, what: str) -> str | list[Message] | list[int]:
    """The single prompt of a streaming call."""
    batch = _as_batch(prompt)
    if len(batch) != 1:
        raise InvalidRequest(f"{what} takes one prompt, got {len(batch)}")
    return batch[0]


def _is_messages(value: Sequence[Any]) -> bool:
    """True for a non-empty sequence of mappings (one chat prompt)."""
    return len(value) > 0 and all(isinstance(item, Mapping) for item in value)


def _is_token_ids(value: Sequence[Any]) -> bool:
    """True for a non-empty sequence of ints (one pre-tokenized prompt); bools are not token ids."""
    return len(value) > 0 and all(isinstance(item, int) and not isinstance(item, bool) for item in value)


def _token_ids(value: Sequence[Any]) -> list[int]:
    """A fresh list of ints from a sequence already checked by :func:`_is_token_ids`."""
    return [int(item) for item in value]


def _messages(value: Sequence[Any]) -> list[Message]:
    """A fresh list of plain dicts from a sequence already checked by :func:`_is_messages`."""
    return [dict(item) for item in value]


def _as_batch(prompts: Prompt | Sequence[Prompt]) -> list[str | list[Message] | list[int]]:
    """A list of prompts, each a str, a list of message dicts or a list of token ids;
    :class:`InvalidRequest` otherwise."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, Mapping) or not isinstance(prompts, Sequence):
        raise InvalidRequest(
            f"a prompt is a str, a list of message dicts or a list of token ids, got {type(prompts).__name__}"
        )
    if _is_messages(prompts):
        return [_messages(prompts)]
    if _is_token_ids(prompts):
        return [_token_ids(prompts)]
    batch: list[str | list[Message] | list[int]] = []
    for index, item in enumerate(prompts):
        if isinstance(item, str):
            batch.append(item)
        elif isinstance(item, Sequence) and not isinstance(item, (bytes, bytearray)) and _is_messages(item):
            batch.append(_messages(item))
        elif isinstance(item, Sequence) and not isinstance(item, (bytes, bytearray)) and _is_token_ids(item):
            batch.append(_token_ids(item))
        else:
            raise InvalidRequest(
                f"prompt {index} is neither a str, a non-empty list of message dicts nor a non-empty list "
                f"of token ids (got {type(item).__name__}); a list mixing these is not allowed"
            )
    return batch

"""The Python face of one loaded model: :class:`Engine`, and the :func:`generate` one-liner.

:class:`Engine` resolves a model id (a path or a fetched alias, see :mod:`lmplex.models`) and wraps
``lmplex._core.Engine``; the work happens in Rust with the GIL released. This module only shapes
arguments.

Invariants:

* ``Engine.generate`` always returns ``list[RequestOutput]``, one per prompt, in prompt order.
* A prompt is a ``str`` (sent as is, no chat template), a list of message dicts (rendered with the
  model's chat template) or a list of token ids (sent as they are, like vLLM's ``TokensPrompt``). A
  list whose items are all mappings, or all ints, is *one* prompt; a list of strings, message lists or
  token-id lists is a batch. A numpy integer array is token ids: one prompt when 1-D, a batch of its
  rows when 2-D. The core classifies prompts (once, in Rust); anything else, an empty batch
  included, is :class:`InvalidRequest`.
* The module-level :func:`generate` keeps one Engine per model id for the life of the process.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Union

import numpy as np
from numpy.typing import NDArray

from lmplex import _core, models
from lmplex._core import CallArgs, InvalidRequest, ModelConfig, RequestOutput, SamplingParams, Tenant
from lmplex.reports import EngineStats, MemoryReport, ModelInfo

__all__ = ["Engine", "generate"]

_ASYNC_USED = threading.Event()


def _async_used() -> None:
    """Registers, once, the exit hook that gives up the GIL briefly so the async runtime's threads
    finish handing results to Python before the interpreter finalizes (without it, about one exit in
    ten after a batch of ``agenerate`` calls aborted or segfaulted: PyO3/pyo3-async-runtimes#40)."""
    if not _ASYNC_USED.is_set():
        _ASYNC_USED.set()
        atexit.register(_core.drain_async, 1.0)


Prompt = Union[str, Sequence[Mapping[str, Any]], Sequence[int], "NDArray[np.integer[Any]]"]
ToolChoice = Union[str, Mapping[str, Any], None]


class Engine:
    """One loaded model.

    ``Engine("smollm2-135m-instruct")`` or ``Engine(ModelConfig(path, max_model_len=2048))``; with a model
    id string, keyword arguments go to :class:`ModelConfig`. ``tenants`` (a list of :class:`Tenant`)
    sets the quotas and fairness weights that requests naming a ``tenant`` answer to; with tenants, the
    default scheduling policy is ``fair``. ``usage_store`` keeps their usage: ``"memory"`` (the default)
    or ``"sqlite:PATH"`` (kept across restarts, shared with every process on the file; docs/tenants.md).
    """

    def __init__(
        self,
        config: ModelConfig | str,
        *,
        tenants: Sequence[Tenant] | None = None,
        usage_store: str | None = None,
        **config_kwargs: Any,
    ) -> None:
        if isinstance(config, str):
            config = ModelConfig(config, **config_kwargs)
        elif config_kwargs:
            raise TypeError("keyword arguments are only accepted with a model id string, not a ModelConfig")
        path = models.resolve(config.model_id, config.revision)
        config = models.with_resolved_adapters(config)
        self._engine = _core.Engine(config, path, tenants, usage_store)
        self._path = path

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        priority: int | Sequence[int] | None = None,
        cache_salt: str | None = None,
        tenant: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: ToolChoice = None,
        parallel_tool_calls: bool | None = None,
        lora: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Run one prompt or a batch of prompts to completion; one :class:`RequestOutput` per prompt.

        The prompts run as one continuous batch, together with whatever else this engine is running.
        ``params`` is one :class:`SamplingParams` for all prompts or one per prompt; the default is
        ``SamplingParams()``. ``priority`` (one for all or one per prompt; lower runs first) matters
        under the ``priority`` and ``fair`` policies. ``cache_salt`` keeps these prompts' cached
        prefixes apart from requests with another salt. ``tenant`` names whose call this is: its
        quotas admit the call as one request (or raise :class:`RateLimited`), its weight orders it
        under ``fair``, and its prompts are cached apart from other tenants'. ``tools``,
        ``tool_choice`` and ``parallel_tool_calls`` are OpenAI's (chat prompts only): the calls the
        model makes come back in ``RequestOutput.tool_calls`` (``finish_reason`` ``"tool_calls"``),
        and go back into the chat as an assistant message's ``tool_calls`` (docs/tools.md).
        ``lora`` runs the prompts under one of the model's LoRA adapters, by name (docs/lora.md).
        ``chat_template_kwargs`` are more variables for the chat template (chat prompts), e.g.
        ``{"enable_thinking": False}`` for Qwen3; a reasoning model's reasoning comes back apart
        from the answer, in ``RequestOutput.reasoning`` (docs/server.md, "Reasoning").
        """
        call = CallArgs(
            prompts,
            params,
            priority,
            cache_salt,
            tenant,
            tools,
            tool_choice,
            parallel_tool_calls,
            lora,
            chat_template_kwargs,
        )
        return self._engine.generate(call)

    async def agenerate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        priority: int | Sequence[int] | None = None,
        cache_salt: str | None = None,
        tenant: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: ToolChoice = None,
        parallel_tool_calls: bool | None = None,
        lora: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """:meth:`generate` for asyncio: awaits the outputs without blocking the event loop."""
        _async_used()
        call = CallArgs(
            prompts,
            params,
            priority,
            cache_salt,
            tenant,
            tools,
            tool_choice,
            parallel_tool_calls,
            lora,
            chat_template_kwargs,
        )
        return await self._engine.agenerate(call)

    def stream(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        priority: int = 0,
        cache_salt: str | None = None,
        tenant: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: ToolChoice = None,
        parallel_tool_calls: bool | None = None,
        lora: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> _core.StreamIterator:
        """Stream one prompt's reply as :class:`StreamChunk` pieces; the last one has ``finish_reason``.

        Closing the iterator (``close()``) or dropping it before the end aborts the request and
        frees its KV memory at once.
        """
        call = CallArgs(
            prompt,
            params,
            priority,
            cache_salt,
            tenant,
            tools,
            tool_choice,
            parallel_tool_calls,
            lora,
            chat_template_kwargs,
        )
        return self._engine.stream(call)

    def astream(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        priority: int = 0,
        cache_salt: str | None = None,
        tenant: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: ToolChoice = None,
        parallel_tool_calls: bool | None = None,
        lora: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> _core.AsyncStreamIterator:
        """:meth:`stream` for asyncio: ``async for chunk in engine.astream(...)``."""
        _async_used()
        call = CallArgs(
            prompt,
            params,
            priority,
            cache_salt,
            tenant,
            tools,
            tool_choice,
            parallel_tool_calls,
            lora,
            chat_template_kwargs,
        )
        return self._engine.astream(call)

    def load_lora_adapter(self, name: str, adapter: str) -> None:
        """Serve the PEFT LoRA adapter ``adapter`` (a folder or a Hub id) as ``name``, replacing an
        adapter of that name; :class:`ModelLoadError` if it cannot be read, and nothing changes."""
        self._engine.load_lora_adapter(name, models.resolve_adapter(adapter))

    def unload_lora_adapter(self, name: str) -> None:
        """Stop serving the adapter ``name``; requests running under it finish under it."""
        self._engine.unload_lora_adapter(name)

    def lora_adapters(self) -> list[str]:
        """The names of the LoRA adapters this model serves, sorted."""
        return self._engine.lora_adapters()

    def abort(self, request_id: int) -> None:
        """Abort a running request by the ``request_id`` of its stream; unknown ids are ignored."""
        self._engine.abort(request_id)

    def tenant_usage(self, tenant: str) -> dict[str, Any]:
        """A tenant's totals since its usage store was made (in memory: since the engine started;
        ``requests``, ``prompt_tokens``,
        ``completion_tokens``, ``cost``, ``cost_today``, ``in_flight``) and its windows now
        (``requests_window``, ``tokens_window``: ``(limit, remaining, reset_seconds)`` or ``None``)."""
        return self._engine.tenant_usage(tenant)

    def stats(self) -> EngineStats:
        """Scheduler and KV-pool counters: running, waiting, free blocks, prefix-cache hits, ..."""
        return self._engine.stats()

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        params: SamplingParams | None = None,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: ToolChoice = None,
        parallel_tool_calls: bool | None = None,
        lora: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> RequestOutput:
        """Reply to a conversation (a list of ``{"role": ..., "content": ...}`` dicts), with the
        ``tools`` the model may call, under the LoRA adapter ``lora`` if given, with
        ``chat_template_kwargs`` for the template (see :meth:`generate`)."""
        if isinstance(messages, str) or not all(isinstance(m, Mapping) for m in messages):
            raise InvalidRequest("chat takes a list of message dicts with 'role' and 'content'")
        return self.generate(
            [list(messages)],
            params,
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=parallel_tool_calls,
            lora=lora,
            chat_template_kwargs=chat_template_kwargs,
        )[0]

    def score(
        self,
        prompts: Prompt | Sequence[Prompt],
        *,
        cache_salt: str | None = None,
        tenant: str | None = None,
    ) -> list[NDArray[np.float32]]:
        """Each prompt's per-token log-probabilities under the model, one float32 array per prompt.

        Element ``i`` of a prompt's array is ``log p(token_i | tokens before it)``, and element 0 is
        NaN (no token comes before it), so ``arr[len(context):].sum()`` is a continuation's
        log-likelihood (lm-evaluation-harness's ``loglikelihood``). Prompts are those of
        :meth:`generate`, numpy integer arrays included (a 2-D array is a batch of its rows); they run
        as one batch of scoring requests, whose results do not depend on the batch.
        """
        return self._engine.score(prompts, cache_salt, tenant)

    def embed(
        self,
        prompts: Prompt | Sequence[Prompt],
        *,
        dimensions: int | None = None,
        normalize: bool = True,
        cache_salt: str | None = None,
        tenant: str | None = None,
    ) -> list[NDArray[np.float32]]:
        """Each prompt's embedding, one float32 array per prompt, on a model loaded with ``task="embed"``.

        The vector is the prompt's final hidden states (after the final norm) pooled as the model's
        ``pooling`` says (``last`` or ``mean``), cut to its first ``dimensions`` elements, then scaled
        to unit length when ``normalize``. Prompts are those of :meth:`generate`; they run as one batch,
        and each vector depends on its prompt alone.
        """
        return self._engine.embed(prompts, dimensions, normalize, cache_salt, tenant)

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
        return self._engine.apply_chat_template(messages, add_generation_prompt)

    def memory(self) -> MemoryReport:
        """Bytes by category, now: weights, the KV pool (used, cached, free), the swap space, the
        CUDA workspace, other, total; see :class:`MemoryReport`."""
        return MemoryReport.from_core(self._engine.memory())

    @property
    def info(self) -> ModelInfo:
        """What was loaded: format, quantization, architecture and sizes, device and dtypes, KV
        blocks; see :class:`ModelInfo`."""
        return ModelInfo.from_core(self._engine.info)

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
    # A stream takes exactly one prompt (a batch is refused before anything runs); its chunks'
    # texts add up to the reply.
    return "".join(chunk.text for chunk in engine.stream(prompt, SamplingParams(**sampling_kwargs)))

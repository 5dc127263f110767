"""Compiled core of lmplex (Rust, PyO3). Use the re-exports in :mod:`lmplex`."""

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, final

import numpy as np
from numpy.typing import NDArray
from typing_extensions import TypeAlias

from lmplex.reports import EngineStats

_Message: TypeAlias = Mapping[str, Any]
_Prompt: TypeAlias = str | Sequence[_Message] | Sequence[int] | NDArray[np.integer[Any]]

__all__ = [
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "AsyncStreamIterator",
    "BudgetUnsatisfiable",
    "CallArgs",
    "CapacityError",
    "Engine",
    "InvalidRequest",
    "LmplexError",
    "Logprob",
    "ModelConfig",
    "ModelHost",
    "ModelLoadError",
    "RateLimited",
    "RequestOutput",
    "Route",
    "SamplingParams",
    "ServerThread",
    "StreamChunk",
    "StreamIterator",
    "StructuredOutputsParams",
    "Tenant",
    "TierSet",
    "TokenLogprobs",
    "Usage",
    "__version__",
    "compile_kernels",
    "drain_async",
    "export_gguf_to_hf",
    "gpu_model_report",
    "quantize_gguf",
    "serve",
    "start_server",
    "usage_report",
    "write_llama_shape",
]

__version__: str
DEFAULT_MAX_NUM_BATCHED_TOKENS: int

class LmplexError(Exception):
    """Base class of every lmplex error."""

class ModelLoadError(LmplexError):
    """A checkpoint could not be loaded: missing or corrupt file, unknown architecture, unsupported quant."""

class InvalidRequest(LmplexError, ValueError):
    """A request or parameter is invalid: prompt too long, bad sampling parameters, bad messages."""

class CapacityError(LmplexError):
    """The engine cannot take the request now: queue full or not enough memory."""

class RateLimited(CapacityError):
    """A tenant's quota refuses the request now; retry after ``retry_after`` seconds.

    ``limit`` names the quota: ``requests``, ``tokens``, ``concurrency`` or ``cost``.
    """

    retry_after: float
    limit: str
    def __init__(self, message: str, retry_after: float = 0.0, limit: str = "requests") -> None: ...

class BudgetUnsatisfiable(LmplexError):
    """No model can serve the request within its ``max_latency_ms`` or ``max_cost`` (routing)."""

@final
class SamplingParams:
    """How to pick tokens: ``SamplingParams(**fields)``, vLLM's names and defaults.

    The defaults give plain sampling at temperature 1.0; ``temperature=0`` is greedy. ``stop`` may be one
    string or a list. A bad value raises ``InvalidRequest`` naming the field; an unknown keyword ``TypeError``.
    """

    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    seed: int | None
    stop: list[str]
    stop_token_ids: list[int]
    ignore_eos: bool
    min_tokens: int
    logprobs: int | None
    prompt_logprobs: int | None
    skip_special_tokens: bool
    structured_outputs: StructuredOutputsParams | None
    logit_bias: dict[int, float]
    def __new__(
        cls,
        *,
        max_tokens: int = 256,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        stop_token_ids: Sequence[int] | None = None,
        ignore_eos: bool = False,
        min_tokens: int = 0,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
        skip_special_tokens: bool = True,
        structured_outputs: StructuredOutputsParams | None = None,
        logit_bias: Mapping[int, float] | None = None,
    ) -> SamplingParams: ...
    @staticmethod
    def from_dict(fields: Mapping[str, Any]) -> SamplingParams:
        """A ``SamplingParams`` from a dict of its fields (what :meth:`to_dict` returns)."""
    def to_dict(self) -> dict[str, Any]:
        """Every field by name (``structured_outputs`` as vLLM writes it: ``{"json": ...}``,
        ``"json_object"``, ``{"regex": ...}``, ...)."""
    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]: ...

@final
class StructuredOutputsParams:
    """Constrain the output: ``json`` (a JSON schema as a dict, JSON text or a pydantic model class),
    ``json_object`` (any JSON object), ``regex``, ``choice`` (one of these strings) or
    ``grammar`` (llguidance's Lark dialect). Exactly one."""

    @property
    def kind(self) -> str: ...
    @property
    def value(self) -> str: ...
    def __new__(
        cls,
        *,
        json: str | Mapping[str, Any] | type | None = None,
        json_object: bool = False,
        regex: str | None = None,
        choice: Sequence[str] | None = None,
        grammar: str | None = None,
    ) -> StructuredOutputsParams: ...

@final
class ModelConfig:
    """One model to serve: ``ModelConfig(model_id, **fields)``.

    ``model_id`` is a local HF folder, a ``.gguf`` file or a known alias. The fields and their defaults
    are the Rust core's ``ModelConfig`` (docs/config.md); the server TOML's ``[[models]]`` entries take the
    same keys. A bad value raises ``InvalidRequest`` naming the field; an unknown keyword ``TypeError``.
    """

    @property
    def model_id(self) -> str: ...
    @property
    def served_model_name(self) -> str | None: ...
    @property
    def revision(self) -> str | None: ...
    @property
    def max_model_len(self) -> int | None: ...
    @property
    def max_model_concurrency(self) -> int: ...
    @property
    def model_batch_execute_timeout_ms(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def kv_cache_dtype(self) -> str: ...
    @property
    def kv_cache_bytes(self) -> int | None: ...
    @property
    def max_num_batched_tokens(self) -> int | None: ...
    @property
    def max_queue_len(self) -> int: ...
    @property
    def enable_prefix_caching(self) -> bool: ...
    @property
    def scheduling_policy(self) -> str | None: ...
    @property
    def kv_swap_bytes(self) -> int | None: ...
    @property
    def preemption_mode(self) -> str: ...
    @property
    def enforce_eager(self) -> bool: ...
    @property
    def keep_alive_s(self) -> float | None: ...
    @property
    def price_per_million_input_tokens(self) -> float: ...
    @property
    def price_per_million_output_tokens(self) -> float: ...
    @property
    def quality(self) -> float: ...
    @property
    def tool_call_parser(self) -> str | None: ...
    @property
    def reasoning_parser(self) -> str | None: ...
    @property
    def lora_modules(self) -> dict[str, str]: ...
    @property
    def max_loras(self) -> int: ...
    @property
    def max_lora_rank(self) -> int: ...
    @property
    def task(self) -> str: ...
    @property
    def pooling(self) -> str | None: ...
    @property
    def speculative(self) -> dict[str, Any] | None: ...
    @property
    def limit_mm_per_prompt(self) -> dict[str, int]: ...
    @property
    def mmproj(self) -> str | None: ...
    def __new__(
        cls,
        model_id: str,
        *,
        revision: str | None = None,
        served_model_name: str | None = None,
        max_model_len: int | None = None,
        max_model_concurrency: int = 8,
        model_batch_execute_timeout_ms: int = 0,
        dtype: str = "auto",
        device: str = "auto",
        enforce_eager: bool = False,
        kv_cache_dtype: str = "auto",
        kv_cache_bytes: int | None = None,
        max_num_batched_tokens: int | None = None,
        max_queue_len: int = 1024,
        enable_prefix_caching: bool = True,
        scheduling_policy: str | None = None,
        kv_swap_bytes: int | None = None,
        preemption_mode: str = "auto",
        keep_alive_s: float | None = None,
        price_per_million_input_tokens: float = 0.0,
        price_per_million_output_tokens: float = 0.0,
        quality: float = 0.0,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        lora_modules: Mapping[str, str] | None = None,
        max_loras: int = 8,
        max_lora_rank: int = 64,
        task: str = "generate",
        pooling: str | None = None,
        speculative: Mapping[str, Any] | None = None,
        limit_mm_per_prompt: Mapping[str, int] | None = None,
        mmproj: str | None = None,
    ) -> ModelConfig: ...
    @staticmethod
    def from_dict(fields: Mapping[str, Any]) -> ModelConfig:
        """A ``ModelConfig`` from a dict of its fields (what :meth:`to_dict` returns)."""
    def to_dict(self) -> dict[str, Any]:
        """Every field by name, defaults included (``None`` where unset)."""
    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]: ...

@final
class Tenant:
    """One tenant of a shared engine or server: ``Tenant(name, **fields)``.

    The fields and defaults are the Rust core's ``TenantConfig`` (docs/tenants.md); the server TOML's
    ``[[tenants]]`` entries take the same keys. A bad value raises ``InvalidRequest`` naming the field;
    an unknown keyword ``TypeError``.
    """

    @property
    def name(self) -> str:
        """The tenant's name (metrics' ``tenant`` label, the default cache salt)."""
    @property
    def route(self) -> Route | None:
        """The default route of the tenant's calls, or ``None``."""
    @property
    def has_api_key(self) -> bool:
        """Whether an API key (or its SHA-256) is set; the key itself is not readable back."""
    @property
    def weight(self) -> float:
        """Share of the engine under the ``fair`` policy."""
    @property
    def models(self) -> list[str] | None:
        """The served model names the tenant may use; ``None`` is all."""
    @property
    def priority(self) -> int:
        """Default priority of its requests (lower runs first)."""
    @property
    def requests_per_minute(self) -> int | None:
        """Most requests per window."""
    @property
    def tokens_per_minute(self) -> int | None:
        """Most tokens (prompt plus ``max_tokens``, unused given back) per window."""
    @property
    def max_concurrency(self) -> int | None:
        """Most requests in flight."""
    @property
    def max_cost_per_day(self) -> float | None:
        """Most money per UTC day at the models' prices."""
    @property
    def cache_salt(self) -> str | None:
        """Prefix-cache salt; ``None`` keeps the tenant's cache to itself."""
    @property
    def quota_window_s(self) -> float:
        """Length of the rate-limit window in seconds."""
    def __new__(
        cls,
        name: str,
        *,
        api_key: str | None = None,
        api_key_sha256: str | None = None,
        weight: float = 1.0,
        models: Sequence[str] | None = None,
        priority: int = 0,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        max_concurrency: int | None = None,
        max_cost_per_day: float | None = None,
        cache_salt: str | None = None,
        quota_window_s: float = 60.0,
        route: Route | Mapping[str, Any] | None = None,
    ) -> Tenant: ...
    @staticmethod
    def from_dict(fields: Mapping[str, Any]) -> Tenant:
        """A ``Tenant`` from a dict of its fields (what :meth:`to_dict` returns)."""
    def to_dict(self) -> dict[str, Any]:
        """Every field by name, defaults included (``None`` where unset); the key too."""
    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]: ...

_Mode: TypeAlias = Literal["fixed", "balanced", "deep", "max"]
_Tier: TypeAlias = Literal["fast", "balanced", "deep", "max"]

@final
class Route:
    """How a call to ``lmplex:auto`` (or a tier) is routed: ``Route(mode=..., tier=..., max_latency_ms=...,
    max_cost=...)``.

    ``mode`` is ``fixed``, ``balanced``, ``deep`` or ``max`` (unset: ``fixed`` with a tier, else
    ``balanced``); ``tier`` one of ``fast``, ``balanced``, ``deep``, ``max``; the budgets bound the
    predicted end-to-end latency (ms) and the cost bound (docs/routing.md). Every field is optional.
    """

    @property
    def mode(self) -> _Mode | None:
        """The mode set, or ``None``."""
    @property
    def tier(self) -> _Tier | None:
        """The tier set, or ``None``."""
    @property
    def max_latency_ms(self) -> float | None:
        """Most predicted end-to-end latency, in ms."""
    @property
    def max_cost(self) -> float | None:
        """Most cost (the bound: every prompt token and every ``max_tokens`` at the model's prices)."""
    def __new__(
        cls,
        *,
        mode: _Mode | None = None,
        tier: _Tier | None = None,
        max_latency_ms: float | None = None,
        max_cost: float | None = None,
    ) -> Route: ...
    @staticmethod
    def from_dict(fields: Mapping[str, Any]) -> Route:
        """A ``Route`` from a dict of its fields (what :meth:`to_dict` returns)."""
    def to_dict(self) -> dict[str, Any]:
        """The set fields by name (the API's ``lmplex`` object)."""
    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]: ...

@final
class TierSet:
    """Served model names per tier: ``TierSet(fast=[...], balanced=[...], deep=[...], max=[...])`` (the
    server TOML's ``[tiers]``). A tier may be empty; a model may be in several.
    """

    @property
    def fast(self) -> list[str]:
        """Low latency, lower quality."""
    @property
    def balanced(self) -> list[str]:
        """The default trade-off."""
    @property
    def deep(self) -> list[str]:
        """High quality."""
    @property
    def max(self) -> list[str]:
        """The best resources."""
    def __new__(
        cls,
        *,
        fast: Sequence[str] = (),
        balanced: Sequence[str] = (),
        deep: Sequence[str] = (),
        max: Sequence[str] = (),
    ) -> TierSet: ...
    @staticmethod
    def from_dict(fields: Mapping[str, Any]) -> TierSet:
        """A ``TierSet`` from a dict of its fields (what :meth:`to_dict` returns)."""
    def to_dict(self) -> dict[str, list[str]]:
        """Every tier's list by name."""
    def models(self) -> list[str]:
        """Every served name in any tier, each once, in tier order."""
    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]: ...

@final
class Logprob:
    token_id: int
    token: str
    logprob: float

@final
class TokenLogprobs:
    """The sampled token's log-probability and the ``n`` most likely alternatives at that step."""

    token_id: int
    token: str
    logprob: float
    top: list[Logprob]

@final
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int
    reasoning_tokens: int

@final
class RequestOutput:
    """The finished result of one request."""

    prompt: str
    text: str
    reasoning: str | None
    token_ids: list[int]
    finish_reason: Literal["stop", "length", "abort", "tool_calls"]
    stop_reason: str | int | None
    usage: Usage
    logprobs: list[TokenLogprobs] | None
    prompt_logprobs: list[TokenLogprobs | None] | None
    model: str | None
    tool_calls: list[dict[str, Any]]

@final
class StreamChunk:
    """A piece of a streamed reply: text and token ids new since the previous chunk."""

    text: str
    reasoning: str | None
    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None
    prompt_logprobs: list[TokenLogprobs | None] | None
    finish_reason: Literal["stop", "length", "abort", "tool_calls"] | None
    usage: Usage | None
    tool_calls: list[dict[str, Any]]

@final
class StreamIterator:
    """Chunks of one request as they are produced; closing or dropping it aborts the request."""

    @property
    def request_id(self) -> int: ...
    @property
    def model(self) -> str:
        """The served model that runs the request (for a routed call, the one chosen)."""
    def __iter__(self) -> StreamIterator: ...
    def __next__(self) -> StreamChunk: ...
    def close(self) -> None:
        """Aborts the request (if unfinished) and frees its KV blocks; iteration then stops."""

@final
class AsyncStreamIterator:
    """``async for`` over one request's chunks; ``aclose()`` or dropping it aborts the request."""

    @property
    def request_id(self) -> int: ...
    def __aiter__(self) -> AsyncStreamIterator: ...
    def __anext__(self) -> Awaitable[StreamChunk]: ...
    def aclose(self) -> Awaitable[None]:
        """Aborts the request (if unfinished) and frees its KV blocks; iteration then stops."""

@final
class CallArgs:
    """One call's options, converted once: ``CallArgs(prompts, params=None, priority=None,
    cache_salt=None, tenant=None, tools=None, tool_choice=None, parallel_tool_calls=None,
    lora=None, chat_template_kwargs=None)`` with the meanings of ``lmplex.Engine.generate``. Streaming
    calls take exactly one prompt."""

    def __new__(
        cls,
        prompts: _Prompt | Sequence[_Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        priority: int | Sequence[int] | None = None,
        cache_salt: str | None = None,
        tenant: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        lora: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> CallArgs: ...

@final
class Engine:
    """One loaded model. ``path`` is the resolved checkpoint (a ``.gguf`` file or an HF folder)."""

    def __new__(
        cls,
        config: ModelConfig,
        path: str,
        tenants: Sequence[Tenant] | None = None,
        usage_store: str | None = None,
    ) -> Engine: ...
    def generate(self, call: CallArgs) -> list[RequestOutput]:
        """Runs a call's prompts to completion as one batch."""
    def score(
        self,
        prompts: _Prompt | Sequence[_Prompt],
        cache_salt: str | None = None,
        tenant: str | None = None,
    ) -> list[NDArray[np.float32]]: ...
    def embed(
        self,
        prompts: _Prompt | Sequence[_Prompt],
        dimensions: int | None = None,
        normalize: bool = True,
        cache_salt: str | None = None,
        tenant: str | None = None,
    ) -> list[NDArray[np.float32]]: ...
    def stream(self, call: CallArgs) -> StreamIterator:
        """Streams a call's one prompt."""
    def agenerate(self, call: CallArgs) -> Awaitable[list[RequestOutput]]:
        """``generate`` as an awaitable."""
    def astream(self, call: CallArgs) -> AsyncStreamIterator:
        """``stream`` as an async iterator."""
    def load_lora_adapter(self, name: str, path: str) -> None:
        """Reads the PEFT adapter folder ``path`` and serves it as ``name``."""
    def unload_lora_adapter(self, name: str) -> None:
        """Stops serving the adapter ``name``."""
    def lora_adapters(self) -> list[str]:
        """The served adapters' names, sorted."""
    def abort(self, request_id: int) -> None: ...
    def tenant_usage(self, name: str) -> dict[str, Any]:
        """Tenant ``name``'s totals and quota windows now (``lmplex.Engine.tenant_usage`` wraps it)."""
    def stats(self) -> EngineStats:
        """The engine's counters now, by their Rust names (``StatsSnapshot``)."""
    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def detokenize(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...
    def apply_chat_template(
        self, messages: Sequence[_Message], add_generation_prompt: bool = True
    ) -> str: ...
    def memory(self) -> dict[str, Any]:
        """``MemoryReport``'s fields as a dict (``lmplex.Engine.memory`` wraps it)."""
    @property
    def info(self) -> dict[str, Any]:
        """``ModelInfo``'s fields as a dict (``lmplex.Engine.info`` wraps it)."""
    @property
    def max_model_len(self) -> int: ...
    @property
    def config(self) -> ModelConfig: ...

def export_gguf_to_hf(
    gguf: str, out: str, dtype: str = "bfloat16", max_shard_bytes: int = 5000000000
) -> list[str]:
    """Dequantize the GGUF file ``gguf`` into the Hugging Face folder ``out``; returns the paths written."""

def quantize_gguf(src: str, out: str, file_type: str) -> list[tuple[str, str, int]]:
    """Rewrite the GGUF ``src`` as ``out`` in ``file_type``; returns each tensor's (name, type, bytes)."""

def serve(
    config_toml: str,
    resolve: Callable[[str, str | None], str] | None = None,
    host: str | None = None,
    port: int | None = None,
    address_file: str | None = None,
    api_keys: Sequence[str] | None = None,
    scheduling_policy: str | None = None,
    allowed_origins: Sequence[str] | None = None,
    usage_store: str | None = None,
    config_path: str | None = None,
    usage_store_fail_open: bool = False,
) -> None:
    """Serves the models of ``config_toml`` (see ``lmplex serve --help``) until SIGTERM or Ctrl-C.
    With ``address_file``, the server's URL is written there once it listens (whole, by rename).
    ``api_keys`` are added to the config's; ``scheduling_policy``, ``allowed_origins`` (CORS) and
    ``usage_store`` replace its top-level ones; ``usage_store_fail_open`` sets it when true.
    ``config_path``, the file ``config_toml`` was read from, places relative paths and the
    default usage store (``ServerConfig::default_usage_store``)."""

def usage_report(usage_store: str | None = None, config_path: str | None = None) -> list[dict[str, Any]]:
    """Every tenant's usage in a server's usage store (SQLite or Redis), as dicts (``lmplex usage``): the store
    ``usage_store`` names, else the one the config read from ``config_path`` uses (its
    ``usage_store``, or the default beside it)."""

def start_server(
    config_toml: str,
    resolve: Callable[[str, str | None], str] | None = None,
    host: str | None = None,
    port: int | None = None,
    api_keys: Sequence[str] | None = None,
    scheduling_policy: str | None = None,
    allowed_origins: Sequence[str] | None = None,
) -> ServerThread:
    """Starts the server of ``config_toml`` on threads of its own and returns once it listens; the
    models load in the background (``/ready`` says when they have). Arguments as for ``serve``.
    No signal handler is installed: the server runs until ``ServerThread.shutdown()``."""

@final
class ServerThread:
    """A server started by ``start_server``. It stops on ``shutdown()`` or when dropped."""

    @property
    def url(self) -> str:
        """The server's URL, ``http://HOST:PORT``."""
    def running(self) -> bool:
        """Whether the server still serves: false once it was shut down or stopped by a load failure."""
    def shutdown(self) -> None:
        """Drains (open requests finish, new ones get 503) and stops; returns once it has. Raises the
        error that stopped the server, if one did (a model that failed to load). Idempotent."""

def compile_kernels(roots: Sequence[str], arch: int, cache_dir: str) -> list[tuple[str, str, int, bool]]:
    """Compile every CUDA kernel for ``sm_{arch}`` with NVRTC (found under ``roots``, then the usual places),
    caching CUBINs in ``cache_dir``; returns ``(kernel, cubin_path, cubin_bytes, from_cache)`` per kernel."""

def gpu_model_report() -> str:
    """The GPU path's device-free figures as JSON text: per Llama shape, the launches of decode and prefill
    steps on the counting executor, their bytes against the step's minimum and a modeled H100 time."""

def write_llama_shape(path: str, shape: str) -> None:
    """Writes a checkpoint of the Llama shape ``shape`` (``llama-3.2-1b`` or ``llama-3-8b``) into the folder
    ``path``: config, tokenizer and zero weights in a sparse file (no disk); for the counting executor."""

def drain_async(timeout_s: float) -> int:
    """With the GIL released: waits 20 ms, then up to ``timeout_s`` for the async runtime's tasks to end;
    returns how many are still alive. ``lmplex`` calls it at exit after any async call
    (PyO3/pyo3-async-runtimes#40)."""

@final
class ModelHost:
    """Several models in one process and one memory budget: ``ModelHost([(config, path), ...], ...)``."""

    @property
    def models(self) -> list[str]:
        """The served model names, sorted."""
    def lora_adapters(self) -> dict[str, str]:
        """Every served LoRA adapter with its parent model, by adapter name."""
    def load_lora_adapter(self, name: str, path: str, model: str | None = None) -> None:
        """Reads the PEFT adapter folder ``path`` into ``model`` and serves it as ``name``."""
    def unload_lora_adapter(self, name: str) -> None:
        """Stops serving the adapter ``name``."""
    @property
    def tiers(self) -> TierSet:
        """The tiers routed calls choose from."""
    @property
    def memory_budget_bytes(self) -> int:
        """The CPU's memory budget, in bytes."""
    def __new__(
        cls,
        models: Sequence[tuple[ModelConfig, str]],
        memory_budget_bytes: int | None = None,
        tenants: Sequence[Tenant] | None = None,
        tiers: TierSet | None = None,
        gpu_memory_utilization: float | None = None,
        usage_store: str | None = None,
    ) -> ModelHost: ...
    def ready_seconds(self, name: str) -> float | None:
        """Seconds from the start of ``name``'s last load or reload to ready (warm-up included);
        ``None`` for a name the host does not know or before its first load ends."""
    def memory(self) -> dict[str, Any]:
        """``HostMemory``'s fields as a dict (``lmplex.ModelHost.memory`` wraps it)."""
    def generate(
        self, call: CallArgs, model: str | None = None, route: Route | None = None
    ) -> list[RequestOutput]:
        """Runs a call on ``model`` or, without one, where the tiers' router chooses under ``route``."""
    def stream(self, call: CallArgs, model: str | None = None, route: Route | None = None) -> StreamIterator:
        """Streams a call's one prompt on ``model`` or where the router chooses."""

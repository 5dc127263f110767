"""Typed reports: :class:`ModelInfo` (``Engine.info``), :class:`MemoryReport` (``Engine.memory()``),
:class:`HostMemory` (``ModelHost.memory()``) and :class:`EngineStats` (``Engine.stats()``).

The fields are the Rust core's (``lmplex_engine::report``), one name per figure everywhere: the core
hands a dict of them over, and a field added there without one here fails the first test that reads
a report (``from_core`` refuses unknown keys).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["EngineStats", "HostMemory", "MemoryReport", "ModelInfo"]


class EngineStats(TypedDict):
    """``Engine.stats()``: the engine's counters now, by the names of the Rust core's ``StatsSnapshot``."""

    num_kv_blocks: int
    """Blocks in the KV pool (fixed at load)."""
    num_free_kv_blocks: int
    """KV pool blocks no request holds (cached prefixes included)."""
    num_cached_free_kv_blocks: int
    """Of ``num_free_kv_blocks``, those still holding a reusable prefix."""
    num_running: int
    """Requests the scheduler is running."""
    num_waiting: int
    """Requests in the scheduler's waiting queue (new, preempted or swapped out)."""
    num_queued: int
    """Requests accepted and not yet scheduled once (the bounded queue)."""
    num_steps: int
    """Steps that ran a forward pass."""
    num_preemptions: int
    """Requests preempted to make room."""
    prefix_cache_queries: int
    """Prompt tokens looked up in the prefix cache."""
    prefix_cache_hits: int
    """Of those, the tokens found cached."""
    num_swap_blocks: int
    """Blocks in the swap space preempted requests swap to (fixed at load)."""
    num_free_swap_blocks: int
    """Swap-space blocks no swapped-out request holds."""
    num_swaps: int
    """Requests swapped out (each swap-out counts once)."""
    spec_decode_num_drafts: int
    """Decode steps of a request that verified drafted tokens (speculative decoding)."""
    spec_decode_num_draft_tokens: int
    """Tokens drafted and verified."""
    spec_decode_num_accepted_tokens: int
    """Of those, the tokens accepted (each the token plain decoding picks there)."""
    num_encoder_passes: int
    """Passes of the vision tower, each over the images of every request waiting for it."""
    num_images_encoded: int
    """Images run through the vision tower (those found in the feature cache not counted)."""


class _Report:
    """What both reports share: built from the core's dict, checked field for field; ``to_dict``."""

    @classmethod
    def from_core(cls, fields: Mapping[str, Any]) -> Self:
        """The report from the core's dict of fields."""
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        if set(fields) != known:
            raise TypeError(f"{cls.__name__}: the core's fields {sorted(fields)} are not {sorted(known)}")
        return cls(**fields)

    def to_dict(self) -> dict[str, Any]:
        """Every field by name."""
        fields: dict[str, Any] = dataclasses.asdict(self)  # type: ignore[call-overload]
        return fields


@dataclasses.dataclass(frozen=True)
class ModelInfo(_Report):
    """What was loaded and how it runs."""

    format: str
    """``gguf`` or ``safetensors``."""
    quantization: str
    """The GGUF file type (``Q4_K_M``, ...) or ``none``."""
    name: str | None
    """The checkpoint's own name, if it has one."""
    architecture: str
    """The architecture family (``llama``, ``qwen2``, ``gemma3``, ``mixtral``, ...; see docs/families.md)."""
    num_parameters: int
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    """Width of a dense layer's MLP (``gate_proj``/``up_proj`` outputs)."""
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    """The checkpoint's trained context."""
    max_model_len: int
    """The most tokens (prompt plus reply) one request may hold here."""
    has_chat_template: bool
    kv_block_size: int
    """Tokens per KV block."""
    kv_num_blocks: int
    """Blocks in the KV pool."""
    kv_swap_num_blocks: int
    """Blocks in the swap space (host memory for preempted requests)."""
    device: str
    """``cpu`` or ``cuda``."""
    compute_dtype: str
    kv_dtype: str
    """The KV cache's element type."""
    decode_weight_bytes: int
    """Weight bytes one decode step reads (all but an embedding table that is not the head)."""
    gpu_name: str | None
    """The GPU's name (CUDA only)."""
    cuda_arch: str | None
    """The GPU's architecture, e.g. ``sm_90`` (CUDA only)."""


@dataclasses.dataclass(frozen=True)
class MemoryReport(_Report):
    """One model's bytes by category, at the moment it was asked for."""

    weights: int
    """The weights as held (quantized ones at their quantized size)."""
    expert_weights: int
    """Of ``weights``, the routed experts of Mixture-of-Experts layers (0 for dense models)."""
    kv_cache: int
    """The KV pool, reserved at load: ``kv_cache_used + kv_cache_cached + kv_cache_free``."""
    kv_cache_used: int
    """Blocks held by requests."""
    kv_cache_cached: int
    """Free blocks still holding reusable prefixes."""
    kv_cache_free: int
    """Free blocks holding nothing."""
    kv_swap: int
    """The swap space (host memory, committed as it is used)."""
    kv_swap_used: int
    """Swap blocks held by swapped-out requests."""
    workspace: int
    """The CUDA backend's step buffers (0 on the CPU)."""
    graphs: int
    """Captured CUDA graphs, as the driver counts them (0 on the CPU and before any capture)."""
    other: int
    """Everything else the model holds (rope tables; a draft model's weights and KV pool; a vision tower's weights)."""
    lora_adapters: int
    """The LoRA adapters held in memory now: the ``max_loras`` most recently used, and any more
    that queued requests hold."""
    total: int
    """``weights + kv_cache + kv_swap + workspace + graphs + other + lora_adapters``."""
    device_used: int | None
    """The whole device's bytes in use now, every process included (CUDA only)."""
    device_total: int | None
    """The device's bytes (CUDA only)."""


@dataclasses.dataclass(frozen=True)
class HostMemory(_Report):
    """A :class:`~lmplex.ModelHost`'s budgets and each loaded model's :class:`MemoryReport`."""

    budget: int
    """Bytes the CPU's models may reserve together (host memory)."""
    reserved: int
    """Bytes reserved by the CPU's loading and ready models."""
    free: int
    """``budget - reserved``."""
    cuda: dict[str, dict[str, int | None]]
    """Each CUDA device's ``budget``, ``reserved`` and ``free`` bytes, by ``cuda:N``, for the devices
    models were planned on; and ``context``, what its CUDA context and kernels took when opened by
    the driver's count (NVML), ``None`` before a model opens it."""
    idle_models: int
    """Models unloaded after their keep-alive (they reserve nothing until reloaded)."""
    models: dict[str, MemoryReport]
    """Each loaded model's report, by served name."""

    @classmethod
    def from_core(cls, fields: Mapping[str, Any]) -> Self:
        """The report from the core's dict of fields (each model's as a :class:`MemoryReport`)."""
        models = {name: MemoryReport.from_core(m) for name, m in fields.get("models", {}).items()}
        return super().from_core({**fields, "models": models})

"""``ModelHost``: several models in one process and one memory budget, generating on a named model or
routed by tiers (``route=``), as ``lmplex serve`` does (docs/routing.md).

It resolves each model id (a path or a fetched alias, see :mod:`lmplex.models`) and wraps
``lmplex._core.ModelHost``; loading and generation run in Rust with the GIL released.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lmplex import _core
from lmplex._core import CallArgs, ModelConfig, RequestOutput, Route, SamplingParams, Tenant, TierSet
from lmplex.engine import Prompt, ToolChoice
from lmplex.models import resolve, resolve_adapter, with_resolved_adapters
from lmplex.reports import HostMemory

__all__ = ["ModelHost"]


class ModelHost:
    """Several models in one process inside one memory budget (default: the memory available now).

    ``ModelHost([ModelConfig("smollm2-135m-instruct", served_model_name="fast"), ...], tiers=TierSet(...))``;
    a model id string stands for ``ModelConfig(model_id)``. Each model's weights and KV pool are planned
    from its checkpoint's headers before anything loads; one that does not fit raises
    :class:`CapacityError` with the numbers. ``tenants`` are the quotas and shares calls answer to,
    ``usage_store`` where their usage is kept (``"memory"``, the default, or ``"sqlite:PATH"``: kept
    across restarts and shared with every process on the file), and ``tiers`` the served names routed
    calls choose from.
    """

    def __init__(
        self,
        models: Sequence[ModelConfig | str],
        memory_budget_bytes: int | None = None,
        *,
        tenants: Sequence[Tenant] | None = None,
        tiers: TierSet | None = None,
        gpu_memory_utilization: float | None = None,
        usage_store: str | None = None,
    ) -> None:
        configs = [ModelConfig(m) if isinstance(m, str) else m for m in models]
        specs = [(with_resolved_adapters(c), resolve(c.model_id, c.revision)) for c in configs]
        self._host = _core.ModelHost(
            specs,
            memory_budget_bytes,
            list(tenants) if tenants else None,
            tiers,
            gpu_memory_utilization,
            usage_store,
        )

    @property
    def models(self) -> list[str]:
        """The served model names, sorted."""
        return self._host.models

    def lora_adapters(self) -> dict[str, str]:
        """Every served LoRA adapter (a model of its own: ``generate(..., model=NAME)``) with its
        parent model, by adapter name."""
        return self._host.lora_adapters()

    def load_lora_adapter(self, name: str, adapter: str, *, model: str | None = None) -> None:
        """Serve the PEFT LoRA adapter ``adapter`` (a folder or a Hub id) as the model ``name`` on the
        base ``model`` (the only model when ``None``)."""
        self._host.load_lora_adapter(name, resolve_adapter(adapter), model)

    def unload_lora_adapter(self, name: str) -> None:
        """Stop serving the adapter ``name``; requests running under it finish under it."""
        self._host.unload_lora_adapter(name)

    @property
    def tiers(self) -> TierSet:
        """The tiers routed calls choose from."""
        return self._host.tiers

    @property
    def memory_budget_bytes(self) -> int:
        """The memory budget the CPU's models share, in bytes."""
        return self._host.memory_budget_bytes

    def ready_seconds(self, name: str) -> float | None:
        """Seconds from the start of model ``name``'s last load or reload to ready, its warm-up
        included (``lmplex_model_ready_seconds`` in ``/metrics``); ``None`` for a name the host does
        not know or before the model's first load ends."""
        return self._host.ready_seconds(name)

    def memory(self) -> HostMemory:
        """The budgets (the CPU's and each CUDA device's) and each loaded model's bytes, now."""
        return HostMemory.from_core(self._host.memory())

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        model: str | None = None,
        route: Route | None = None,
        tenant: str | None = None,
        priority: int | Sequence[int] | None = None,
        cache_salt: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: ToolChoice = None,
        parallel_tool_calls: bool | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Run one prompt or a batch to completion, as :meth:`Engine.generate` does, on ``model`` or, without
        one, on the model the tiers' router chooses for ``route`` (its mode, tier and budgets; a tenant's
        default route fills what it leaves out). Each output's ``model`` names the model that ran it. A
        budget no model can meet raises :class:`BudgetUnsatisfiable`; a named model is held to ``route``'s
        budgets too. ``tools``, ``tool_choice``, ``parallel_tool_calls`` and ``chat_template_kwargs`` as in
        :meth:`Engine.generate`."""
        call = CallArgs(
            prompts,
            params,
            priority,
            cache_salt,
            tenant,
            tools,
            tool_choice,
            parallel_tool_calls,
            chat_template_kwargs=chat_template_kwargs,
        )
        return self._host.generate(call, model, route)

    def stream(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        model: str | None = None,
        route: Route | None = None,
        tenant: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: ToolChoice = None,
        parallel_tool_calls: bool | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> _core.StreamIterator:
        """Stream one prompt's reply, as :meth:`Engine.stream` does, on ``model`` or where the router
        chooses for ``route`` (as :meth:`generate`); the iterator's ``model`` names the model that runs it.
        Closing the iterator (also from another thread) or dropping it aborts the request."""
        call = CallArgs(
            prompt,
            params,
            priority,
            cache_salt,
            tenant,
            tools,
            tool_choice,
            parallel_tool_calls,
            chat_template_kwargs=chat_template_kwargs,
        )
        return self._host.stream(call, model, route)

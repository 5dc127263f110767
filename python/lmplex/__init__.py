"""lmplex: a lightweight LLM inference runtime with a Rust core and a thin, typed Python front.

Quick start::

    import lmplex
    lmplex.models.fetch("smollm2-135m-instruct")          # explicit, once: downloads and verifies
    engine = lmplex.Engine("smollm2-135m-instruct")
    out = engine.chat([{"role": "user", "content": "Hi!"}], lmplex.SamplingParams(temperature=0))
    print(out.text)

This module only re-exports: the compiled core (:mod:`lmplex._core`), :class:`Engine` and
:func:`generate` (:mod:`lmplex.engine`), the model registry (:mod:`lmplex.models`) and Hub ids
(:mod:`lmplex.hub`). Every error the package raises on purpose derives from :class:`LmplexError`.
"""

from __future__ import annotations

from lmplex import cuda, hub, models
from lmplex._core import (
    AsyncStreamIterator,
    BudgetUnsatisfiable,
    CapacityError,
    InvalidRequest,
    LmplexError,
    Logprob,
    ModelConfig,
    ModelLoadError,
    RateLimited,
    RequestOutput,
    Route,
    SamplingParams,
    StreamChunk,
    StreamIterator,
    StructuredOutputsParams,
    Tenant,
    TierSet,
    TokenLogprobs,
    Usage,
    __version__,
)
from lmplex.block import GPUS, LMLiteBlock
from lmplex.engine import Engine, generate
from lmplex.evaluate import PerplexityResult, perplexity
from lmplex.host import ModelHost
from lmplex.quant import QuantizeResult, quantize
from lmplex.reports import EngineStats, HostMemory, MemoryReport, ModelInfo
from lmplex.structured import StructuredOutputError

cuda.export_roots()

__all__ = [
    "GPUS",
    "AsyncStreamIterator",
    "BudgetUnsatisfiable",
    "CapacityError",
    "Engine",
    "EngineStats",
    "HostMemory",
    "InvalidRequest",
    "LMLiteBlock",
    "LmplexError",
    "Logprob",
    "MemoryReport",
    "ModelConfig",
    "ModelHost",
    "ModelInfo",
    "ModelLoadError",
    "PerplexityResult",
    "QuantizeResult",
    "RateLimited",
    "RequestOutput",
    "Route",
    "SamplingParams",
    "StreamChunk",
    "StreamIterator",
    "StructuredOutputError",
    "StructuredOutputsParams",
    "Tenant",
    "TierSet",
    "TokenLogprobs",
    "Usage",
    "__version__",
    "generate",
    "hub",
    "models",
    "perplexity",
    "quantize",
]

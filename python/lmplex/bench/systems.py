"""The systems a benchmark compares, behind one small interface.

Every system gets the same prompt token ids (made by lmplex's tokenizer from the same GGUF), decodes
greedily and ignores EOS, so each run generates exactly ``max_tokens`` tokens. ``run`` is one request
(time to first token and total time); ``run_mix`` is N requests, each with its own output length, submitted
together as the system's Python API allows (lmplex batches them; llama-cpp-python runs them one after
another, which is what its users get from it).

Peers are optional: a peer whose package is not importable is skipped with the reason, never faked.
llama.cpp comes from ``llama-cpp-python`` built from source (``benches/setup_llama_cpp.sh``).
"""

from __future__ import annotations

import asyncio
import importlib
import time
from dataclasses import dataclass
from typing import Any, Protocol

import lmplex
from lmplex import ModelConfig, SamplingParams

__all__ = ["LlamaCpp", "Lmplex", "System", "Timing", "load_peers"]


@dataclass
class Timing:
    ttft_s: float
    total_s: float
    tokens: int

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first over the time after the first (the decode rate)."""
        return (self.tokens - 1) / max(self.total_s - self.ttft_s, 1e-9)


class System(Protocol):
    name: str
    version: str

    def run(self, prompt: list[int], max_tokens: int) -> Timing: ...

    def run_mix(self, requests: list[tuple[list[int], int]]) -> tuple[float, int]: ...


class Lmplex:
    """lmplex's engine in process (continuous batching, CPU backend)."""

    name = "lmplex"
    version = lmplex.__version__

    def __init__(self, path: str, max_model_len: int, concurrency: int) -> None:
        # No prefix caching: the peers reuse nothing across requests, so neither does lmplex here.
        config = ModelConfig(
            path, max_model_len=max_model_len, max_model_concurrency=concurrency, enable_prefix_caching=False
        )
        self.engine = lmplex.Engine(config)

    def _params(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)

    def run(self, prompt: list[int], max_tokens: int) -> Timing:
        t0 = time.perf_counter()
        first, tokens = 0.0, 0
        for chunk in self.engine.stream(prompt, self._params(max_tokens)):
            if chunk.token_ids and not tokens:
                first = time.perf_counter() - t0
            tokens += len(chunk.token_ids)
        return Timing(first, time.perf_counter() - t0, tokens)

    def run_mix(self, requests: list[tuple[list[int], int]]) -> tuple[float, int]:
        async def all_at_once() -> list[Any]:
            return await asyncio.gather(*[self.engine.agenerate([p], self._params(n)) for p, n in requests])

        t0 = time.perf_counter()
        outs = asyncio.run(all_at_once())
        return time.perf_counter() - t0, sum(len(o[0].token_ids) for o in outs)


class LlamaCpp:
    """llama.cpp through llama-cpp-python (one sequence at a time; its KV cache is reset per request)."""

    name = "llama.cpp"

    def __init__(self, path: str, max_model_len: int, threads: int) -> None:
        llama_cpp = importlib.import_module("llama_cpp")  # optional: typed as Any
        self.version = str(llama_cpp.__version__)
        self.llm = llama_cpp.Llama(
            model_path=path,
            n_ctx=max_model_len,
            n_threads=threads,
            n_threads_batch=threads,
            n_batch=512,
            verbose=False,
        )

    def run(self, prompt: list[int], max_tokens: int) -> Timing:
        self.llm.reset()  # no prefix reuse from the previous request
        t0 = time.perf_counter()
        first, tokens = 0.0, 0
        for _ in self.llm.generate(
            prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True
        ):
            tokens += 1
            if tokens == 1:
                first = time.perf_counter() - t0
            if tokens == max_tokens:
                break
        return Timing(first, time.perf_counter() - t0, tokens)

    def run_mix(self, requests: list[tuple[list[int], int]]) -> tuple[float, int]:
        t0 = time.perf_counter()
        tokens = sum(self.run(p, n).tokens for p, n in requests)
        return time.perf_counter() - t0, tokens


def load_peers(
    names: list[str], path: str, max_model_len: int, threads: int
) -> tuple[list[Any], dict[str, str]]:
    """The peers among ``names`` that can run here, and why each other one was skipped."""
    peers: list[Any] = []
    skipped: dict[str, str] = {}
    for name in names:
        if name == "llama.cpp":
            try:
                peers.append(LlamaCpp(path, max_model_len, threads))
            except ImportError:
                skipped[name] = "llama-cpp-python is not installed (benches/setup_llama_cpp.sh builds it)"
        else:
            skipped[name] = "no adapter for this peer yet"
    return peers, skipped

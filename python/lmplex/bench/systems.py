"""The systems a benchmark compares, behind one small interface.

Every system gets the same prompt token ids (made by lmplex's tokenizer from the same GGUF), decodes
greedily and ignores EOS, so each run generates exactly ``max_tokens`` tokens. ``run`` is one request
(time to first token and total time); ``run_mix`` is N requests, each with its own output length, submitted
together as the system's Python API allows (lmplex batches them; llama-cpp-python runs them one after
another, which is what its users get from it).

Peers are optional: a peer whose package is not importable is skipped with the reason, never faked.
``benches/setup_peers.sh`` installs them: llama.cpp through ``llama-cpp-python`` built from source,
mistral.rs through its ``mistralrs`` wheel, and (with ``--transformers``) Hugging Face transformers on
CPU torch, which loads the same GGUF dequantized to f32 (``from_pretrained(gguf_file=...)``), or the
same Hugging Face folder in its own dtype (the dense path's peer).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import lmplex
from lmplex import ModelConfig, SamplingParams

__all__ = ["LlamaCpp", "Lmplex", "MistralRs", "System", "Timing", "Transformers", "load_peers"]


@dataclass
class Timing:
    ttft_s: float
    total_s: float
    tokens: int
    prompt_tokens: int = 0
    """Prompt tokens the system itself counted, where it tokenizes on its own (mistral.rs); else 0."""

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

    def __init__(self, path: str, max_model_len: int, concurrency: int, dtype: str = "auto") -> None:
        # No prefix caching: the peers reuse nothing across requests, so neither does lmplex here.
        config = ModelConfig(
            path,
            max_model_len=max_model_len,
            max_model_concurrency=concurrency,
            enable_prefix_caching=False,
            dtype=dtype,
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


class MistralRs:
    """mistral.rs through the ``mistralrs`` wheel (its CPU build), on the same GGUF.

    Its Python API takes text, so the prompt ids are decoded with lmplex's tokenizer and mistral.rs
    tokenizes the text again (``Timing.prompt_tokens`` is its own count). The wheel does not stream
    completions, so the time to first token is a separate one-token request; its prefix cache is off,
    so that request leaves nothing for the next. The wheel's ``Runner`` takes one call at a time (a
    second thread gets "Already borrowed"), so a mix runs one request after another.
    """

    name = "mistral.rs"

    def __init__(self, path: str, engine: Any, concurrency: int) -> None:
        self.mr = importlib.import_module("mistralrs")  # optional: typed as Any
        self.version = importlib.metadata.version("mistralrs")
        gguf = Path(path)
        which = self.mr.Which.GGUF(quantized_model_id=str(gguf.parent), quantized_filename=gguf.name)
        self.runner = self.mr.Runner(which=which, max_seqs=concurrency, prefix_cache_n=0, token_source="none")
        self.engine = engine

    def _complete(self, text: str, max_tokens: int) -> tuple[float, int, int]:
        request = self.mr.CompletionRequest(
            prompt=text, model="default", max_tokens=max_tokens, temperature=0.0, ignore_eos=True
        )
        t0 = time.perf_counter()
        usage = self.runner.send_completion_request(request).usage
        return time.perf_counter() - t0, int(usage.completion_tokens), int(usage.prompt_tokens)

    def run(self, prompt: list[int], max_tokens: int) -> Timing:
        text = self.engine.detokenize(prompt, skip_special_tokens=False)
        first, _, seen = self._complete(text, 1)
        if max_tokens == 1:
            return Timing(first, first, 1, seen)
        total, tokens, seen = self._complete(text, max_tokens)
        return Timing(first, total, tokens, seen)

    def run_mix(self, requests: list[tuple[list[int], int]]) -> tuple[float, int]:
        texts = [(self.engine.detokenize(p, skip_special_tokens=False), n) for p, n in requests]
        t0 = time.perf_counter()
        tokens = sum(self._complete(text, n)[1] for text, n in texts)
        return time.perf_counter() - t0, tokens


class Transformers:
    """Hugging Face transformers on CPU torch: a Hugging Face folder in its own dtype (bf16, f16 or
    f32, ``dtype="auto"``) or in ``dtype``, or the same GGUF dequantized to f32 weights.

    Greedy decoding in a plain loop over ``model(...)`` with its KV cache, one request at a time
    (transformers has no continuous batching), ``torch.set_num_threads(threads)``.
    """

    name = "transformers"

    def __init__(self, path: str, threads: int, dtype: str = "auto") -> None:
        self.torch = importlib.import_module("torch")
        transformers = importlib.import_module("transformers")
        self.torch.set_num_threads(threads)
        src = Path(path)
        if src.is_dir():
            want = "auto" if dtype == "auto" else getattr(self.torch, dtype)
            model = transformers.AutoModelForCausalLM.from_pretrained(str(src), dtype=want)
        else:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(src.parent), gguf_file=src.name, dtype=self.torch.float32
            )
        self.model = model.eval()
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        self.version = f"{transformers.__version__} (torch {self.torch.__version__}, {dtype})"

    def run(self, prompt: list[int], max_tokens: int) -> Timing:
        torch = self.torch
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model(input_ids=torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
            token = out.logits[0, -1].argmax()
            first, tokens = time.perf_counter() - t0, 1
            while tokens < max_tokens:
                out = self.model(
                    input_ids=token.view(1, 1), past_key_values=out.past_key_values, use_cache=True
                )
                token = out.logits[0, -1].argmax()
                tokens += 1
            return Timing(first, time.perf_counter() - t0, tokens)

    def run_mix(self, requests: list[tuple[list[int], int]]) -> tuple[float, int]:
        t0 = time.perf_counter()
        tokens = sum(self.run(p, n).tokens for p, n in requests)
        return time.perf_counter() - t0, tokens


PEERS = ["llama.cpp", "mistral.rs", "transformers"]


def load_peers(
    names: list[str],
    path: str,
    max_model_len: int,
    threads: int,
    engine: Any,
    concurrency: int,
    dtype: str = "auto",
) -> tuple[list[Any], dict[str, str]]:
    """The peers among ``names`` that can run here, and why each other one was skipped.

    ``engine`` is lmplex's engine on the same file (its tokenizer turns prompt ids into text for
    peers that only take text); ``concurrency`` is the batch limit given to peers that batch;
    ``dtype`` is what transformers loads a Hugging Face folder in.
    """
    peers: list[Any] = []
    skipped: dict[str, str] = {}
    setup = "benches/setup_peers.sh installs it"
    for name in names:
        try:
            if name == "llama.cpp":
                peers.append(LlamaCpp(path, max_model_len, threads))
            elif name == "mistral.rs":
                peers.append(MistralRs(path, engine, concurrency))
            elif name == "transformers":
                peers.append(Transformers(path, threads, dtype))
            else:
                skipped[name] = f"no adapter for this peer (known: {', '.join(PEERS)})"
        except ImportError as e:
            skipped[name] = f"{e.name or e} is not installed ({setup})"
        except Exception as e:  # noqa: BLE001 (a peer that cannot load this file is skipped, with its words)
            skipped[name] = f"failed to load: {type(e).__name__}: {e}"
    return peers, skipped

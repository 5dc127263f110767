"""Model quality: perplexity over a text, by llama.cpp's method (``lmplex eval perplexity``).

The method is ``llama-perplexity``'s, so the two tools' figures compare directly on the same text and
weights:

* the text is tokenized once, with the special tokens the model asks for (a BOS only where the GGUF's
  ``add_bos_token`` says so; SmolLM2's and Qwen's do not);
* it is cut into ``len(tokens) // ctx`` non-overlapping chunks of ``ctx`` tokens (the rest is dropped),
  and where the model adds a BOS, each chunk's first token is replaced by it;
* each chunk runs alone from an empty context, and only its second half is scored: the tokens at
  positions ``ctx // 2 + 1 .. ctx - 1``, each from the logits of the position before it (``ctx - 1 -
  ctx // 2`` tokens a chunk), so every scored token has at least half a context before it;
* perplexity is ``exp(mean(nll))`` over all scored tokens, and its error is llama.cpp's:
  ``ppl * sqrt((mean(nll^2) - mean(nll)^2) / (count - 1))``.

Invariants: a chunk's log-probabilities come from the engine's prompt scoring (``Engine.score``), which
is batch-invariant, so ``batch`` (chunks submitted together) changes the speed, never the figure.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from lmplex._core import InvalidRequest, ModelConfig
from lmplex.engine import Engine

__all__ = ["PerplexityResult", "add_parser", "perplexity"]


@dataclass(frozen=True)
class PerplexityResult:
    """The outcome of :func:`perplexity`."""

    perplexity: float
    """``exp`` of the mean negative log-likelihood of the scored tokens."""
    stderr: float
    """The perplexity's standard error (llama.cpp's ``+/-``)."""
    tokens_scored: int
    chunks: int
    ctx: int
    tokens_evaluated: int
    """Tokens run through the model (``chunks * ctx``)."""
    seconds: float
    tokens_per_second: float
    """``tokens_evaluated / seconds``."""

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def perplexity(
    engine: Engine,
    text: str,
    *,
    ctx: int = 512,
    batch: int = 1,
    chunks: int | None = None,
    progress: bool = False,
) -> PerplexityResult:
    """The perplexity of ``engine``'s model over ``text`` in chunks of ``ctx`` tokens (module docs).

    ``batch`` chunks are submitted together (a speed setting only); ``chunks`` scores only the first
    that many (llama.cpp's ``--chunks``). With ``progress``, a line per chunk
    goes to stderr with the running estimate. Raises :class:`lmplex.InvalidRequest` when ``ctx`` is
    below 4 or not below the engine's ``max_model_len`` (a prompt must leave room for one more token),
    or when the text holds fewer than two chunks.
    """
    if ctx < 4:
        raise InvalidRequest(f"ctx must be at least 4 tokens, got {ctx}")
    if batch < 1:
        raise InvalidRequest(f"batch must be at least 1, got {batch}")
    if chunks is not None and chunks < 1:
        raise InvalidRequest(f"chunks must be at least 1, got {chunks}")
    limit = engine.info.max_model_len
    if ctx >= limit:
        raise InvalidRequest(f"ctx {ctx} needs a max_model_len above it; the engine's is {limit}")
    tokens = engine.tokenize(text, add_special_tokens=True)
    if len(tokens) < 2 * ctx:
        raise InvalidRequest(
            f"the text holds {len(tokens)} tokens; perplexity with ctx {ctx} needs at least {2 * ctx} "
            "(two chunks)"
        )
    # The special tokens the model adds around a text: a BOS before it, never anything after it
    # (llama.cpp refuses a model that adds an EOS, whose chunks could not be scored this way).
    plain, special = (
        engine.tokenize("a", add_special_tokens=False),
        engine.tokenize("a", add_special_tokens=True),
    )
    at = special.index(plain[0]) if plain and plain[0] in special else len(special)
    bos, after = special[:at], special[at + len(plain) :]
    if after:
        raise InvalidRequest(
            "the model's tokenizer adds tokens after a text (an EOS); perplexity needs it not to"
        )
    n_chunks, first = len(tokens) // ctx, ctx // 2
    if chunks is not None:
        n_chunks = min(n_chunks, chunks)
    pieces = [tokens[i * ctx : (i + 1) * ctx] for i in range(n_chunks)]
    if bos:
        for c in pieces:
            c[0] = bos[-1]
    nll = nll2 = 0.0
    count = 0
    start = time.perf_counter()
    for lo in range(0, n_chunks, batch):
        for i, lps in enumerate(engine.score(pieces[lo : lo + batch])):
            if lps.shape != (ctx,):
                raise RuntimeError(f"chunk {lo + i}: the engine scored {lps.size} of {ctx}")
            scored = -lps[first + 1 :].astype(np.float64)
            if not np.isfinite(scored).all():
                raise RuntimeError(f"chunk {lo + i}: a scored position has no finite log-probability")
            nll += float(scored.sum())
            nll2 += float((scored * scored).sum())
            count += scored.size
            if progress:
                print(f"[{lo + i + 1}/{n_chunks}] {math.exp(nll / count):.4f}", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    mean, mean2 = nll / count, nll2 / count
    ppl = math.exp(mean)
    var = mean2 - mean * mean
    stderr = ppl * math.sqrt(var / (count - 1)) if var > 0 and count > 1 else 0.0
    evaluated = n_chunks * ctx
    return PerplexityResult(
        perplexity=ppl,
        stderr=stderr,
        tokens_scored=count,
        chunks=n_chunks,
        ctx=ctx,
        tokens_evaluated=evaluated,
        seconds=seconds,
        tokens_per_second=evaluated / max(seconds, 1e-9),
    )


# --- command line ----------------------------------------------------------------------------------------

_EPILOG = """\
examples:
  lmplex eval perplexity smollm2-135m-instruct --file book.txt
  lmplex eval perplexity ./model.gguf --file book.txt --ctx 1024 --batch 4 --json
  lmplex eval perplexity ./qwen-bf16 --file book.txt --dtype float32 --kv-cache-dtype float32
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``eval`` subcommand (``eval perplexity``)."""
    ev = sub.add_parser("eval", help="measure a model's quality (perplexity)")
    esub = ev.add_subparsers(dest="eval_command", metavar="EVAL", required=True)
    p = esub.add_parser(
        "perplexity",
        help="perplexity over a text file, by llama.cpp's method",
        description=__doc__,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL", help="a known alias, a Hub id, a .gguf file or an HF folder")
    p.add_argument("--file", "-f", required=True, metavar="TEXT", help="a UTF-8 text file")
    p.add_argument(
        "--ctx", type=int, default=512, metavar="N", help="tokens per chunk (default: %(default)s)"
    )
    p.add_argument(
        "--batch", type=int, default=1, metavar="N", help="chunks submitted together (default: %(default)s)"
    )
    p.add_argument("--chunks", type=int, metavar="N", help="score only the first N chunks (default: all)")
    p.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float16", "float32"],
        default="auto",
        help="compute and dense-weight dtype (default: %(default)s)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=["auto", "float16", "float32", "int8"],
        default="auto",
        help="KV cache element type (default: %(default)s)",
    )
    p.add_argument(
        "--device", default="auto", metavar="DEVICE", help="auto, cpu, cuda or cuda:N (default: auto)"
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        metavar="N",
        help="context to load with, above --ctx (default: --ctx + 1)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (with a perplexity key)")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-chunk progress on stderr")
    p.set_defaults(func=_cmd_perplexity)


def _cmd_perplexity(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InvalidRequest(f"cannot read {path} as UTF-8 text: {err}") from None
    if args.max_model_len is not None and args.max_model_len <= args.ctx:
        raise InvalidRequest(f"--max-model-len {args.max_model_len} must be above --ctx {args.ctx}")
    config = ModelConfig(
        args.model,
        max_model_len=args.max_model_len or max(args.ctx, 4) + 1,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        device=args.device,
        enable_prefix_caching=False,
    )
    engine = Engine(config)
    res = perplexity(
        engine, text, ctx=args.ctx, batch=args.batch, chunks=args.chunks, progress=not args.quiet
    )
    if args.json:
        print(json.dumps({"model": args.model, "file": str(path), **res.to_dict()}, indent=2))
    else:
        print(
            f"perplexity: {res.perplexity:.4f} +/- {res.stderr:.5f} over {res.tokens_scored} tokens "
            f"({res.chunks} chunks of {res.ctx}; {res.tokens_per_second:.1f} tok/s)"
        )
    return 0

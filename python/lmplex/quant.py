"""``lmplex quantize``: a GGUF or Hugging Face checkpoint written as a GGUF of a file type, as
``convert_hf_to_gguf.py`` and ``llama-quantize`` do.

The source is a GGUF of any type lmplex reads (F32, F16, BF16 or quantized; a known alias or a Hub
``ORG/NAME:QUANT`` id resolves to one), or a Hugging Face folder of a llama, qwen2 or qwen3 model with
a byte-level BPE tokenizer (Llama 3, Qwen, SmolLM): its config, tokenizer (llama.cpp's
``tokenizer.ggml.*`` keys, the pre-tokenizer found as convert_hf_to_gguf.py finds it) and chat
template become the GGUF's metadata, and llama's q/k rows are permuted to llama.cpp's layout. Every tensor is dequantized to f32 and quantized to the type
llama.cpp's rules give it for the file type (``q4_k_m``: Q4_K, with Q6_K for the head and for
``attn_v``/``ffn_down`` in the layers llama.cpp picks, and Q5_0/Q8_0 where a row is not a multiple of
256); Q4_K and Q5_K blocks are made by ggml's reference quantizer, without an importance matrix. The
metadata, tokenizer and chat template included, is copied, with ``general.file_type`` set.

Invariant: ``out`` appears only once it is complete (written under a temporary name beside it and
renamed); on any failure nothing is left behind.
"""

from __future__ import annotations

import argparse
import collections
from dataclasses import dataclass
from pathlib import Path

from lmplex import _core, models
from lmplex._core import InvalidRequest

__all__ = ["FILE_TYPES", "QuantizeResult", "add_parser", "quantize"]

FILE_TYPES = ["q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k", "f16", "bf16", "f32"]


@dataclass(frozen=True)
class QuantizeResult:
    """What :func:`quantize` wrote."""

    path: str
    file_type: str
    tensors: list[tuple[str, str, int]]
    """Each tensor's (GGUF name, ggml type, bytes), in file order."""

    @property
    def bytes(self) -> int:
        return sum(b for _, _, b in self.tensors)

    def type_counts(self) -> dict[str, int]:
        """Tensors per ggml type."""
        return dict(collections.Counter(t for _, t, _ in self.tensors))


def quantize(src: str, out: str, file_type: str) -> QuantizeResult:
    """Write ``src`` (a GGUF file or Hugging Face folder, an alias or a Hub id) as the GGUF ``out`` in
    ``file_type`` (one of :data:`FILE_TYPES`). Raises :class:`lmplex.InvalidRequest` for an unknown
    type, a folder of a family or tokenizer not taken yet, or ``out`` naming the source,
    :class:`lmplex.ModelLoadError` for a source that cannot be read or an ``out`` that cannot be
    written."""
    if file_type.lower() not in FILE_TYPES:
        raise InvalidRequest(f"unknown quantization type {file_type!r}; known: {', '.join(FILE_TYPES)}")
    path = Path(models.resolve(src))
    if Path(out).resolve() == path.resolve():
        raise InvalidRequest("the output would overwrite the source; give another path")
    tensors = _core.quantize_gguf(str(path), out, file_type.lower())
    return QuantizeResult(path=out, file_type=file_type.lower(), tensors=tensors)


_EPILOG = """\
examples:
  lmplex quantize ./model-f16.gguf ./model-q4_k_m.gguf --type q4_k_m
  lmplex quantize qwen2.5-coder-0.5b-instruct ./qwen-q8_0.gguf --type q8_0
  lmplex quantize ./SmolLM2-135M-Instruct ./smollm2-q4_k_m.gguf --type q4_k_m    (an HF folder)
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``quantize`` subcommand."""
    p = sub.add_parser(
        "quantize",
        help="write a GGUF or HF checkpoint as a GGUF of a quantization type, as llama-quantize does",
        description=__doc__,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", metavar="SRC", help="a GGUF file, an HF folder, a known alias or a Hub id")
    p.add_argument("out", metavar="OUT.gguf", help="the file to write")
    p.add_argument("--type", required=True, choices=FILE_TYPES, type=str.lower, help="the file type")
    p.set_defaults(func=_cmd_quantize)


def _cmd_quantize(args: argparse.Namespace) -> int:
    res = quantize(args.src, args.out, args.type)
    counts = ", ".join(f"{n} {t}" for t, n in sorted(res.type_counts().items()))
    print(f"wrote {res.path}: {res.bytes / 1e6:.1f} MB of tensors ({counts})")
    return 0

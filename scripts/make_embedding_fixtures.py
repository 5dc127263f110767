#!/usr/bin/env python3
"""Make embedding reference fixtures with Hugging Face transformers: pooled final hidden states.

Not run by CI: it needs torch and transformers (a multi-GB install). CI checks lmplex against the
fixtures this script writes (``crates/lmplex-model/tests/embeddings.rs`` for the tiny families,
``tests/test_embeddings.py`` for real models). Run it in a separate environment:

    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install torch transformers gguf numpy
    /tmp/refenv/bin/python scripts/make_embedding_fixtures.py --families
    lmplex models fetch smollm2-135m-instruct
    /tmp/refenv/bin/python scripts/make_embedding_fixtures.py --model smollm2-135m-instruct

What an embedding model pools is the base model's ``last_hidden_state`` (``AutoModel``: after the
final norm, before the head), as sentence-transformers and vLLM read it; each input records the last
position's state (``last`` pooling) and the mean over every position (``mean`` pooling), float32 and
not normalized. ``--families`` builds each tiny family exactly as ``make_family_fixtures.py`` does
(its config, its hashed weights) and pools the prompt of each of its cases; ``--model`` loads a
fetched GGUF through transformers' GGUF loader (dequantized to float32), tokenizes ``INPUTS`` with
the GGUF's tokenizer (special tokens added) and records the ids too.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
from hashed import hashed_values
from make_family_fixtures import SHAPE, families, init_for
from make_hf_fixtures import default_gguf

OUT = ROOT / "tests" / "fixtures"
INPUTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A KV cache keeps the keys and values of earlier tokens.",
    "Paris is the capital of France.",
    "def reverse(s):\n    return s[::-1]",
]


def pooled(torch: Any, base: Any, ids: list[int]) -> dict[str, list[float]]:
    """The ``last`` and ``mean`` pooling of ``ids``' final hidden states."""
    with torch.no_grad():
        h = base(torch.tensor([ids])).last_hidden_state[0].to(torch.float32)
    return {"last": h[-1].tolist(), "mean": h.mean(dim=0).tolist()}


def oracle(torch: Any, T: Any) -> str:
    return f"transformers {T.__version__}, torch {torch.__version__}, float32, eager, CPU"


def write_families(torch: Any, T: Any) -> None:
    out: dict[str, Any] = {"oracle": oracle(torch, T), "python": platform.python_version(), "families": {}}
    for name, fam in families(T).items():
        config = fam["config"](**{**SHAPE, **fam["fields"]})
        config._attn_implementation = "eager"
        model = T.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.eval()
        for pname, param in model.named_parameters():
            std, mean = init_for(pname, "gemma" in name)
            values = hashed_values(pname, param.numel(), std, mean).reshape(tuple(param.shape))
            with torch.no_grad():
                param.copy_(torch.from_numpy(values))
        base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        cases = [{"prompt": c["prompt"], **pooled(torch, base, c["prompt"])} for c in fam["cases"]]
        out["families"][name] = cases
        print(f"{name}: {len(cases)} cases", file=sys.stderr)
    path = OUT / "embed_families.json"
    path.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"-> {path.relative_to(ROOT)}", file=sys.stderr)


def write_model(torch: Any, T: Any, alias: str) -> None:
    gguf = default_gguf(alias)
    tok = T.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    base = T.AutoModel.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    base.eval()
    cases = []
    for text in INPUTS:
        ids = tok(text)["input_ids"]
        cases.append({"input": text, "ids": ids, **pooled(torch, base, ids)})
    out = {"model": alias, "oracle": oracle(torch, T), "python": platform.python_version(), "cases": cases}
    path = OUT / f"embed_{alias}.json"
    path.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"{alias}: {[len(c['ids']) for c in cases]} tokens -> {path.relative_to(ROOT)}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", action="store_true", help="write embed_families.json")
    ap.add_argument("--model", action="append", default=[], help="a fetched alias (repeatable)")
    args = ap.parse_args()

    import torch
    import transformers as T

    torch.manual_seed(0)
    if args.families:
        write_families(torch, T)
    for alias in args.model:
        write_model(torch, T, alias)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Make the perplexity reference fixture with Hugging Face transformers from a GGUF checkpoint.

Not run by CI: it needs torch and transformers (a multi-GB install; see ``make_hf_fixtures.py`` for the
environment). CI checks ``lmplex.perplexity`` against the fixture it writes (``tests/test_perplexity.py``).

The text is the Zen of Python (``this.s``, decoded), which every CPython ships. It is tokenized by lmplex
(the token ids are recorded, so the fixture tests the scoring, not the tokenizer, which other tests
check), cut into chunks of ``--ctx`` tokens by llama.cpp's method (``lmplex.evaluate``'s docs: the second
half of each chunk scored, a chunk's first token replaced by BOS where the model adds one), and each
chunk runs through transformers' float32 implementation of the dequantized GGUF. The negative
log-likelihoods come from a float64 log-softmax of its logits.

    /tmp/refenv/bin/python scripts/make_ppl_fixture.py --model smollm2-135m-instruct --ctx 32
"""

from __future__ import annotations

import argparse
import codecs
import json
import math
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "fixtures"


def zen_of_python() -> str:
    """The Zen of Python as ``import this`` prints it (without printing it)."""
    import importlib.util

    spec = importlib.util.find_spec("this")
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).read_text(encoding="utf-8")
    encoded = source.split('s = """', 1)[1].split('"""', 1)[0]
    return codecs.decode(encoded, "rot13")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--ctx", type=int, default=32)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()

    import torch
    import transformers

    import lmplex

    gguf = Path(lmplex.models.resolve(args.model))
    engine = lmplex.Engine(lmplex.ModelConfig(str(gguf), max_model_len=max(args.ctx, 64)))
    text = zen_of_python()
    tokens = engine.tokenize(text, add_special_tokens=True)
    bos = engine.tokenize("", add_special_tokens=True)
    ctx, first = args.ctx, args.ctx // 2
    chunks = [tokens[i * ctx : (i + 1) * ctx] for i in range(len(tokens) // ctx)]
    if bos:
        for c in chunks:
            c[0] = bos[0]

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    nll: list[float] = []
    with torch.inference_mode():
        for c in chunks:
            logits = model(input_ids=torch.tensor([c])).logits[0].double()
            logp = torch.log_softmax(logits, dim=-1)
            nll += [-float(logp[j, c[j + 1]]) for j in range(first, ctx - 1)]
    mean = sum(nll) / len(nll)
    var = sum(x * x for x in nll) / len(nll) - mean * mean
    ppl = math.exp(mean)
    fixture = {
        "model": args.model,
        "text": "the Zen of Python (this.s, rot13-decoded)",
        "ctx": ctx,
        "token_ids": tokens,
        "chunks": len(chunks),
        "tokens_scored": len(nll),
        "nll": nll,
        "perplexity": ppl,
        "stderr": ppl * math.sqrt(var / (len(nll) - 1)),
        "generator": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"ppl_{args.model}.json"
    out.write_text(json.dumps(fixture, indent=1) + "\n")
    print(
        f"wrote {out}: perplexity {ppl:.4f} over {len(nll)} tokens in {len(chunks)} chunks", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

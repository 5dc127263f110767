#!/usr/bin/env python3
"""Images in: time to first token and decode speed of a SmolVLM-256M-shaped model, lmplex against
Hugging Face transformers, on the CPU, side by side in one run.

Needs torch and transformers beside lmplex (a multi-GB install; not run in CI):

    python3 -m venv /tmp/refenv && /tmp/refenv/bin/pip install torch transformers pillow lmplex
    /tmp/refenv/bin/python benches/vision.py --out docs/bench/vision-cpu.json

The model is an Idefics3 with SmolVLM-256M-Instruct's shapes (a SigLIP encoder of 12 layers of 768
on 512x512 tiles of 16x16 patches, pixel shuffle by 4: 64 tokens a tile; a Llama of 30 layers of 576,
vocabulary 49,280), random weights (the speed does not depend on them), bfloat16 as SmolVLM ships,
saved by transformers. Its processor settings are SmolVLM-256M's
(``tests/fixtures/images/smolvlm_256m``): the longest side to 2,048, tiles of 512, so an image of
any size becomes up to 16 tiles plus the global one. The tokenizer is a word-level stand-in with
the processor's tags as single tokens (SmolVLM's own is not at hand offline); the prompt is one user
turn of the image and a short question.

Both systems get the same folder, thread count, image bytes and prompt, and stream ``1 + N`` tokens
(``N`` = ``--decode-tokens``) per run, after one warm-up run. Time to first token is from the call
to the first streamed token, decoding, processing and encoding the image included; decode speed is
the ``N`` tokens after the first over the time they took. Each is the median of ``--repeats`` runs,
each run with another image (one pixel changed) so lmplex's image cache cannot help (its prefix cache
is off). transformers runs its PIL image processor (``Idefics3ImageProcessorPil``) and greedy
``generate`` with a streamer, ``torch.set_num_threads(threads)``.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROCESSOR = ROOT / "tests" / "fixtures" / "images" / "smolvlm_256m"
VOCAB = 49280
# SmolVLM's layout of its image tags at the end of the vocabulary.
TAGS = ["<global-img>", *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))]
TAGS += ["<fake_token_around_image>", "<image>", "<end_of_utterance>"]
FIRST_TAG = 49152
IMAGE_TOKEN = FIRST_TAG + TAGS.index("<image>")
TEMPLATE = (
    "{% for m in messages %}t1 t{{ 2 if m['role'] == 'user' else 3 }} {% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<image>{% else %}{{ p['text'] }}{% endif %}{% endfor %} <end_of_utterance> "
    "{% endfor %}{% if add_generation_prompt %}t1 t3 {% endif %}"
)
QUESTION = "t40 t41 t42 t43 t44 t45 t46 t47"
VISION = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "image_size": 512,
    "patch_size": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
TEXT = {
    "model_type": "llama",
    "vocab_size": VOCAB,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}


def transformers() -> Any:
    """The transformers module (typed loosely: it is not installed where lmplex's types are checked)."""
    return importlib.import_module("transformers")


def tokenizer_json() -> dict[str, Any]:
    vocab = {f"t{i}": i for i in range(FIRST_TAG)}
    added = []
    for i, tag in enumerate(TAGS):
        vocab[tag] = FIRST_TAG + i
        added.append({"id": FIRST_TAG + i, "content": tag, "single_word": False, "lstrip": False})
        added[-1].update({"rstrip": False, "normalized": False, "special": True})
    vocab.update({f"t{i}": i for i in range(FIRST_TAG + len(TAGS), VOCAB)})
    return {
        "version": "1.0",
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"},
    }


def write_model(folder: Path) -> None:
    torch: Any = importlib.import_module("torch")

    T = transformers()
    torch.manual_seed(0)
    config = T.Idefics3Config(
        vision_config=VISION,
        text_config=TEXT,
        scale_factor=4,
        image_token_id=IMAGE_TOKEN,
        tie_word_embeddings=False,
    )
    model = T.Idefics3ForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, "unk_token": "t0"}))
    for f in ("preprocessor_config.json", "processor_config.json"):
        shutil.copy(PROCESSOR / f, folder / f)


def image_png(side: int, variant: int) -> bytes:
    """A smooth RGB image of ``side`` squared with hashed noise; ``variant`` changes one pixel."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:side, 0:side]
    rng = np.random.default_rng(7)
    rgb = np.stack([x * 255 // side, y * 255 // side, (x + y) * 127 // side], axis=-1)
    rgb = (rgb + rng.integers(0, 24, size=rgb.shape)).clip(0, 255).astype(np.uint8)
    rgb[0, 0] = [variant % 256, variant // 256 % 256, 7]
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


class Clock:
    """Times one call: its start, its first generated token and its last (``token`` per token)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.stamps: list[float] = []

    def token(self, count: int = 1) -> None:
        self.stamps += [time.perf_counter()] * count

    def figures(self) -> tuple[float, float]:
        """(seconds to the first token, tokens per second after it)."""
        first, last = self.stamps[0], self.stamps[-1]
        return first - self.start, (len(self.stamps) - 1) / (last - first)


def bench_lmplex(folder: Path, images: list[bytes], n: int) -> dict[str, Any]:
    import lmplex

    engine = lmplex.Engine(lmplex.ModelConfig(str(folder), device="cpu", enable_prefix_caching=False))
    params = lmplex.SamplingParams(temperature=0, max_tokens=1 + n, ignore_eos=True)
    prompt_tokens = 0

    def ask(image: bytes) -> tuple[float, float]:
        nonlocal prompt_tokens
        turn = [
            {
                "role": "user",
                "content": [{"type": "image", "image": image}, {"type": "text", "text": QUESTION}],
            }
        ]
        clock = Clock()
        for chunk in engine.stream(turn, params):
            clock.token(len(chunk.token_ids))
            if chunk.usage is not None:
                prompt_tokens = chunk.usage.prompt_tokens
        return clock.figures()

    ask(images[0])  # warm-up: starts the thread team, pages in the weights
    return summary([ask(img) for img in images[1:]], prompt_tokens)


def bench_transformers(folder: Path, images: list[bytes], n: int, threads: int) -> dict[str, Any]:
    torch: Any = importlib.import_module("torch")
    from PIL import Image

    T = transformers()
    pil = importlib.import_module("transformers.models.idefics3.image_processing_pil_idefics3")

    torch.set_num_threads(threads)
    model = T.Idefics3ForConditionalGeneration.from_pretrained(folder, dtype=torch.bfloat16).eval()
    tokenizer = T.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), unk_token="t0")
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    pre.pop("image_processor_type", None)
    seq_len = json.loads((folder / "processor_config.json").read_text())["image_seq_len"]
    processor = T.Idefics3Processor(
        image_processor=pil.Idefics3ImageProcessorPil(**pre),
        tokenizer=tokenizer,
        image_seq_len=seq_len,
        chat_template=TEMPLATE,
    )
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    prompt_tokens = 0

    class Streamer:
        """``generate``'s streamer: ``put`` gets the prompt first, then each new token."""

        def __init__(self, clock: Clock) -> None:
            self.clock, self.prompt_seen = clock, False

        def put(self, value: Any) -> None:
            if self.prompt_seen:
                self.clock.token(int(value.numel()))
            self.prompt_seen = True

        def end(self) -> None:
            pass

    def ask(image: bytes) -> tuple[float, float]:
        nonlocal prompt_tokens
        clock = Clock()
        inputs = processor(text=prompt, images=[[Image.open(io.BytesIO(image))]], return_tensors="pt")
        prompt_tokens = int(inputs["input_ids"].shape[1])
        with torch.no_grad():
            model.generate(
                **inputs,
                max_new_tokens=1 + n,
                min_new_tokens=1 + n,
                do_sample=False,
                streamer=Streamer(clock),
            )
        return clock.figures()

    ask(images[0])
    return summary([ask(img) for img in images[1:]], prompt_tokens)


def summary(runs: list[tuple[float, float]], prompt_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "ttft_s": round(statistics.median(t for t, _ in runs), 3),
        "ttft_runs_s": [round(t, 3) for t, _ in runs],
        "decode_tok_s": round(statistics.median(d for _, d in runs), 2),
        "decode_runs_tok_s": [round(d, 2) for _, d in runs],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--side", type=int, default=512, help="the image's width and height (default %(default)s)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out", type=Path, help="write the JSON here too")
    args = p.parse_args()
    import lmplex
    from lmplex.bench.hardware import machine

    images = [image_png(args.side, v) for v in range(args.repeats + 1)]
    with tempfile.TemporaryDirectory(prefix="lmplex-vlm-") as d:
        folder = Path(d) / "smolvlm-256m-shaped"
        write_model(folder)
        print("lmplex ...", file=sys.stderr)
        ours = bench_lmplex(folder, images, args.decode_tokens)
        print("transformers ...", file=sys.stderr)
        theirs = bench_transformers(folder, images, args.decode_tokens, args.threads)
    assert ours["prompt_tokens"] == theirs["prompt_tokens"], (ours, theirs)
    report = {
        "model": "Idefics3 with SmolVLM-256M-Instruct's shapes, random weights, bfloat16",
        "image": f"{args.side}x{args.side} PNG",
        "systems": {"lmplex": ours, "transformers": theirs},
        "ttft_ratio": round(theirs["ttft_s"] / ours["ttft_s"], 2),
        "decode_ratio": round(ours["decode_tok_s"] / theirs["decode_tok_s"], 2),
        "settings": {
            "repeats": args.repeats,
            "decode_tokens": args.decode_tokens,
            "lmplex": lmplex.__version__ if hasattr(lmplex, "__version__") else "",
            "transformers": transformers().__version__,
            "machine": machine(args.threads),
        },
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

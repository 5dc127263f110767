#!/usr/bin/env python3
"""Make reference outputs of an Idefics3 (SmolVLM) vision tower with Hugging Face transformers.

Not run by CI: it needs torch and transformers (a multi-GB install). CI checks lmplex against the
fixture this script writes (``crates/lmplex-model/tests/hf_vision.rs``). Run it in a separate
environment, as ``make_family_fixtures.py``:

    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install torch transformers numpy
    /tmp/refenv/bin/python scripts/make_vlm_fixtures.py

A tiny ``Idefics3ForConditionalGeneration`` is built from an ``Idefics3Config``: a SigLIP encoder
(hidden 32, 2 layers, 2 heads, 32x32 tiles of 8x8 patches, ``gelu_pytorch_tanh``), the connector
(pixel shuffle by 2: 16 patches -> 4 image tokens per tile) and a tiny Llama (vocabulary 72: 64
text tokens, then ``<image>`` = 70 and ``<fake_token_around_image>`` = 71). Every parameter is
overwritten with ``hashed_values`` (``tests/hashed.py``: murmur3's finalizer over the tensor
name's FNV-1a hash and the element index), which the Rust test reproduces bit for bit, and so are
the pixel values (uniform in [-1, 1)): no weights are stored, only the config, the tensor list and
the oracle's outputs (float32, eager attention, CPU):

- ``image_features``: ``get_image_features`` for the 3 tiles and for tile 2 alone
  (``[tiles * 4, 64]``);
- ``forward``: a prompt with the 12 image tokens of the 3 tiles between text tokens, through
  ``model(input_ids, pixel_values)``: the last position's logits and the greedy token at every
  position, with the smallest top-1/top-2 logit gap (so the argmax never rests on a near tie);
- ``chat``: one user turn of an image and text through transformers' whole pipeline (a chat
  template, the Idefics3 processor with the PIL image processor, ``generate``): the rendered
  prompt, its token ids and the greedy tokens (``crates/lmplex-engine/tests/vision.rs``).
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from hashed import hashed_values

sys.path.insert(0, str(ROOT / "scripts"))
from vlm_fixtures import greedy, rounded, word_tokenizer

OUT = ROOT / "tests" / "fixtures" / "vision" / "idefics3.json"
TEXT_VOCAB, IMAGE_TOKEN, FAKE_TOKEN = 64, 70, 71
VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 32,
    "patch_size": 8,
    "num_channels": 3,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
TEXT = {
    "model_type": "llama",
    "vocab_size": 72,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
}
SCALE_FACTOR = 2
TILES = 3
TOKENS_PER_TILE = (VISION["image_size"] // VISION["patch_size"]) ** 2 // SCALE_FACTOR**2


def init_for(name: str) -> tuple[float, float]:
    """(std, mean) of a tensor by its HF name: norms near 1, biases small, projections 0.1-0.2."""
    if name.endswith(("norm.weight", "layernorm.weight", "layer_norm1.weight", "layer_norm2.weight")):
        return (0.1, 1.0)
    if name.endswith(".bias"):
        return (0.1, 0.0)
    if "embed_tokens" in name:
        return (0.5, 0.0)
    if "lm_head" in name:
        return (0.15, 0.0)
    if "connector" in name or "patch_embedding" in name:
        return (0.1, 0.0)
    return (0.2, 0.0)


def prompt() -> list[int]:
    """Text, then each tile's image tokens between fake tokens (as the processor lays them out), then text."""
    ids = [1, 17, 33, 5]
    for _ in range(TILES):
        ids += [FAKE_TOKEN] + [IMAGE_TOKEN] * TOKENS_PER_TILE
    ids += [FAKE_TOKEN, 9, 12, 40, 3]
    return ids


CHAT_TEMPLATE = (
    "{% for m in messages %}t1 {% for p in m['content'] %}{% if p['type'] == 'image' %}<image>"
    "{% else %}{{ p['text'] }}{% endif %}{% endfor %} t2 {% endfor %}{% if add_generation_prompt %}t3 {% endif %}"
)
CHAT_IMAGE = ROOT / "tests" / "fixtures" / "images" / "rgb.png"
CHAT_PROCESSOR = ROOT / "tests" / "fixtures" / "images" / "small"
CHAT_TOKENS = 8


def tokenizer_json() -> dict[str, Any]:
    """A word-level tokenizer over ``t0..t69`` with ``<image>`` and ``<fake_token_around_image>``
    as special added tokens (70, 71); what the processor's other tags split into is ``t0``."""
    return word_tokenizer(IMAGE_TOKEN, [(IMAGE_TOKEN, "<image>"), (FAKE_TOKEN, "<fake_token_around_image>")])


def chat(model: Any) -> dict[str, Any]:
    """A chat turn with an image (``CHAT_IMAGE``) through transformers' whole pipeline: the
    chat template, the Idefics3 processor (PIL image processor of ``CHAT_PROCESSOR``'s config,
    ``image_seq_len`` 4), then greedy ``generate`` of ``CHAT_TOKENS`` tokens (EOS not stopping)."""
    import tempfile

    import transformers as T
    from PIL import Image
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tok_json = tokenizer_json()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tokenizer.json"
        path.write_text(json.dumps(tok_json))
        tokenizer = T.PreTrainedTokenizerFast(tokenizer_file=str(path), unk_token="t0")
    pre = json.loads((CHAT_PROCESSOR / "preprocessor_config.json").read_text())
    pre = {k: v for k, v in pre.items() if k != "image_processor_type"}
    seq_len = json.loads((CHAT_PROCESSOR / "processor_config.json").read_text())["image_seq_len"]
    processor = T.Idefics3Processor(
        image_processor=Idefics3ImageProcessorPil(**pre),
        tokenizer=tokenizer,
        image_seq_len=seq_len,
        chat_template=CHAT_TEMPLATE,
    )
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "t5 t6 t7"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    image = Image.open(CHAT_IMAGE)
    inputs = processor(text=text, images=[[image]], return_tensors="pt")
    generated, margin = greedy(model, inputs, CHAT_TOKENS)
    prompt_ids = [int(i) for i in inputs["input_ids"][0]]
    return {
        "tokenizer_json": tok_json,
        "chat_template": CHAT_TEMPLATE,
        "image": str(CHAT_IMAGE.relative_to(ROOT)),
        "processor": str(CHAT_PROCESSOR.relative_to(ROOT)),
        "messages_text": "t5 t6 t7",
        "prompt": text,
        "prompt_ids": prompt_ids,
        "tiles": int(inputs["pixel_values"].shape[1]),
        "generated": generated,
        "min_margin": margin,
    }


def main() -> None:
    import torch
    import transformers as T

    config = T.Idefics3Config(
        vision_config=VISION,
        text_config=TEXT,
        scale_factor=SCALE_FACTOR,
        image_token_id=IMAGE_TOKEN,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    model = T.Idefics3ForConditionalGeneration(config).to(torch.float32)
    model.eval()
    assert model.model.vision_model.config._attn_implementation == "eager"
    tensors = []
    for pname, param in model.named_parameters():
        std, mean = init_for(pname)
        values = hashed_values(pname, param.numel(), std, mean).reshape(tuple(param.shape))
        with torch.no_grad():
            param.copy_(torch.from_numpy(values))
        tensors.append({"name": pname, "shape": list(param.shape), "std": std, "mean": mean})

    size = VISION["image_size"]
    n = TILES * VISION["num_channels"] * size * size
    std = 1.0 / 3.0**0.5  # uniform in [-1, 1)
    pixels = torch.from_numpy(hashed_values("pixel_values", n, std, 0.0)).reshape(TILES, 3, size, size)

    with torch.no_grad():
        # get_image_features takes [batch, images, 3, H, W] and returns one [images * 4, hidden] per batch row.
        feats_all = model.model.get_image_features(pixels[None], return_dict=True).pooler_output[0]
        feats_one = model.model.get_image_features(pixels[None, 2:3], return_dict=True).pooler_output[0]
        ids = prompt()
        assert ids.count(IMAGE_TOKEN) == feats_all.shape[0]
        out = model(input_ids=torch.tensor([ids]), pixel_values=pixels[None], use_cache=False)
        logits = out.logits[0].double()
        top2 = torch.topk(logits, 2, dim=-1).values
    fixture = {
        "model": "idefics3",
        "oracle": f"transformers {T.__version__}, torch {torch.__version__}, float32, eager, CPU",
        "python": platform.python_version(),
        # As config.json holds it (save_pretrained: only what differs from the defaults), and in full.
        "config_json": json.loads(config.to_json_string(use_diff=True)),
        "config": json.loads(config.to_json_string(use_diff=False)),
        "tensors": tensors,
        "pixel_values": {"name": "pixel_values", "shape": list(pixels.shape), "std": std, "mean": 0.0},
        "image_features": [
            {"tiles": [0, 1, 2], "shape": list(feats_all.shape), "values": rounded(feats_all)},
            {"tiles": [2], "shape": list(feats_one.shape), "values": rounded(feats_one)},
        ],
        "forward": {
            "input_ids": ids,
            "last_logits": rounded(logits[-1]),
            "argmax": [int(i) for i in torch.argmax(logits, dim=-1)],
            "min_argmax_margin": round(float((top2[:, 0] - top2[:, 1]).min()), 6),
        },
        "chat": chat(model),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(fixture, indent=None, separators=(",", ":")) + "\n")
    scale = float(feats_all.abs().max())
    print(
        f"features {list(feats_all.shape)} (max |x| {scale:.3f}), argmax {fixture['forward']['argmax']}, "
        f"margin {fixture['forward']['min_argmax_margin']} -> {OUT.relative_to(ROOT)}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

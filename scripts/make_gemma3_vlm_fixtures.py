#!/usr/bin/env python3
"""Make reference outputs of a tiny Gemma 3 vision-language model with Hugging Face transformers.

Not run by CI: it needs torch and transformers (a multi-GB install). CI checks lmplex against the
fixture this script writes (``crates/lmplex-model/tests/hf_vision_gemma3.rs`` and
``crates/lmplex-engine/tests/vision.rs``). Run it in a separate environment, as
``make_vlm_fixtures.py``:

    python3 -m venv /tmp/hf
    /tmp/hf/bin/pip install torch transformers pillow numpy
    /tmp/hf/bin/python scripts/make_gemma3_vlm_fixtures.py

A tiny ``Gemma3ForConditionalGeneration`` is built from a ``Gemma3Config``: a SigLIP tower
(hidden 32, 2 layers, 2 heads, 32x32 images of 8x8 patches), the projector (4x4 patches
average-pooled to 2x2 = 4 image tokens, RMSNorm, projection) and a tiny Gemma 3 text model
(vocabulary 80: ``<start_of_image>`` = 76, ``<end_of_image>`` = 77, ``<image_soft_token>`` = 78;
layers sliding, full, sliding with a window of 6 tokens, so image tokens past the window
exercise the sliding mask's composition with the bidirectional one). Every parameter is
overwritten with ``hashed_values`` (``tests/hashed.py``), which the Rust tests reproduce bit for
bit, and so are the pixel values (uniform in [-1, 1)); the oracle runs in float32, eager
attention, on the CPU:

- ``image_features``: ``get_image_features`` for 2 images and for image 1 alone (``[4, 64]``
  per image);
- ``forward``: a prompt with the 2 images' tokens (each between ``<start_of_image>`` and
  ``<end_of_image>``) among text tokens, through ``model(input_ids, pixel_values,
  token_type_ids)``: image tokens attend to their whole image bidirectionally. The last
  position's logits, the greedy token at every position with the smallest top-1/top-2 gap, and
  how far the last logits move when the mask is causal instead (the test must tell them apart);
- ``chat``: one user turn of an image and text through transformers' whole pipeline (a chat
  template, ``Gemma3Processor`` with ``Gemma3ImageProcessorPil``, ``generate``): the rendered
  prompt, its token ids and the greedy tokens (``min_new_tokens``: EOS banned until then, lmplex's
  ``min_tokens``);
- ``forward_long_image``: the same weights with ``mm_tokens_per_image`` 16 (the 4x4 patch grid
  pooled 1x1: ``config_json`` and ``config`` there), one image (image 0's pixels) of 16 tokens,
  longer than the sliding window, among text tokens. transformers' sliding layers mask
  ``(causal or same image) and within the window`` (``kv > q - window``; transformers PR #46850,
  "Fix bidirectional attention masking crossing sliding window boundaries"): an image token
  sees the rest of its image after it, but not its image's start past the window. Recorded: the
  logits at the image's last token, at the first text token after it and at the last position,
  the greedy token at every position with the smallest top-1/top-2 gap, and how far those three
  rows move under wrong masks (``wrong_masks_move_logits_by``), each built by hand and passed to
  the model as its per-layer-type mask dict: ``causal`` (no image block: causal and the window),
  ``block_past_window`` (``(causal and within the window) or same image``: transformers before
  PR #46850, an image token seeing its image's start past the window) and
  ``image_rows_without_window`` (image tokens' rows see their whole causal context and their
  image, the window ignored for them). The hand-built right mask gives transformers' logits
  exactly (asserted).
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

OUT = ROOT / "tests" / "fixtures" / "vision" / "gemma3.json"
BOI, EOI, IMAGE_TOKEN, VOCAB = 76, 77, 78, 80
VISION = {
    "model_type": "siglip_vision_model",
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
    "model_type": "gemma3_text",
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "query_pre_attn_scalar": 16,
    "sliding_window": 6,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
}
TOKENS_PER_IMAGE = 4
IMAGES = 2
LONG_TOKENS_PER_IMAGE = 16  # the 4x4 patch grid, pooled 1x1: longer than the window (6)
PREPROCESSOR = {
    "image_processor_type": "Gemma3ImageProcessor",
    "do_convert_rgb": True,
    "do_resize": True,
    "size": {"height": 32, "width": 32},
    "resample": 2,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_pan_and_scan": None,
}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}t1 {% for p in m['content'] %}{% if p['type'] == 'image' %}"
    "<start_of_image>{% else %}{{ p['text'] }}{% endif %}{% endfor %} t2 {% endfor %}"
    "{% if add_generation_prompt %}t3 {% endif %}"
)
CHAT_IMAGE = ROOT / "tests" / "fixtures" / "images" / "rgba.png"
CHAT_TOKENS = 8


def init_for(name: str) -> tuple[float, float]:
    """(std, mean) of a tensor by its HF name: LayerNorms near 1, Gemma's (1 + w) norms near 0,
    biases small, projections 0.1-0.2."""
    if name.endswith(("layer_norm1.weight", "layer_norm2.weight", "post_layernorm.weight")):
        return (0.1, 1.0)
    if "norm" in name:
        return (0.1, 0.0)
    if name.endswith(".bias"):
        return (0.1, 0.0)
    if "embed_tokens" in name:
        return (0.05, 0.0)  # scaled by sqrt(hidden) = 8, and tied to the head
    if "multi_modal_projector" in name or "patch_embedding" in name:
        return (0.1, 0.0)
    return (0.2, 0.0)


def prompt() -> tuple[list[int], list[int]]:
    """Text, an image, more text past the sliding window, the second image, text; and the
    token type ids (1 at image tokens) that transformers' processor gives it."""
    ids = [2, 5, 6, BOI] + [IMAGE_TOKEN] * TOKENS_PER_IMAGE + [EOI, 7, 8, 9, 10, 11, BOI]
    ids += [IMAGE_TOKEN] * TOKENS_PER_IMAGE + [EOI, 12, 13]
    return ids, [int(i == IMAGE_TOKEN) for i in ids]


def long_image_prompt() -> tuple[list[int], list[int]]:
    """Text, one image of ``LONG_TOKENS_PER_IMAGE`` tokens (positions 4..20), text; and its token
    type ids."""
    ids = [2, 5, 6, BOI] + [IMAGE_TOKEN] * LONG_TOKENS_PER_IMAGE + [EOI, 7, 8, 9]
    return ids, [int(i == IMAGE_TOKEN) for i in ids]


def gemma3_config(tokens_per_image: int) -> Any:
    """The tiny ``Gemma3Config`` with ``tokens_per_image`` image tokens, eager attention."""
    import transformers as T

    config = T.Gemma3Config(
        vision_config=VISION,
        text_config=TEXT,
        mm_tokens_per_image=tokens_per_image,
        boi_token_index=BOI,
        eoi_token_index=EOI,
        image_token_index=IMAGE_TOKEN,
    )
    for c in (config, config.vision_config, config.text_config):
        c._attn_implementation = "eager"
    return config


def masks(types: list[int], rule: str) -> dict[str, Any]:
    """Additive ``[1, 1, len, len]`` masks of the per-layer-type dict the model takes as its
    ``attention_mask``, by ``rule``: ``right`` (transformers': full layers ``causal or same
    image``, sliding layers that ``and kv > q - window``), ``causal`` (no image block),
    ``block_past_window`` (sliding: ``(causal and kv > q - window) or same image``) or
    ``image_rows_without_window`` (sliding: image rows ``causal or same image``, text rows
    ``causal and kv > q - window``)."""
    import torch

    n, w = len(types), TEXT["sliding_window"]
    block, b = [], -1
    for p, t in enumerate(types):
        b += int(t == 1 and (p == 0 or types[p - 1] != 1))
        block.append(b if t == 1 else -1)
    blk = torch.tensor(block)
    q, kv = torch.arange(n)[:, None], torch.arange(n)[None, :]
    causal = kv <= q
    window = kv > q - w
    same = (blk[:, None] == blk[None, :]) & (blk[:, None] >= 0)
    if rule == "causal":
        full, sliding = causal, causal & window
    elif rule == "right":
        full, sliding = causal | same, (causal | same) & window
    elif rule == "block_past_window":
        full, sliding = causal | same, (causal & window) | same
    elif rule == "image_rows_without_window":
        image_row = (blk >= 0)[:, None]
        full, sliding = causal | same, torch.where(image_row, causal | same, causal & window)
    else:
        raise ValueError(rule)
    low = torch.finfo(torch.float32).min

    def additive(allowed: Any) -> Any:
        return torch.where(allowed, 0.0, low).to(torch.float32)[None, None]

    return {"full_attention": additive(full), "sliding_attention": additive(sliding)}


def forward_long_image(model: Any, pixels: Any) -> dict[str, Any]:
    """``forward_long_image`` (the module docstring) with ``model``'s weights in a model of
    ``LONG_TOKENS_PER_IMAGE`` tokens an image, over image 0 of ``pixels``."""
    import torch
    import transformers as T

    config = gemma3_config(LONG_TOKENS_PER_IMAGE)
    long_model = T.Gemma3ForConditionalGeneration(config).to(torch.float32)
    long_model.eval()
    state = model.state_dict()
    assert sorted(long_model.state_dict()) == sorted(state)
    long_model.load_state_dict(state)
    image = pixels[0:1]
    ids, types = long_image_prompt()
    start = types.index(1)
    end = start + LONG_TOKENS_PER_IMAGE
    assert types[start:end] == [1] * LONG_TOKENS_PER_IMAGE and sum(types) == LONG_TOKENS_PER_IMAGE
    assert LONG_TOKENS_PER_IMAGE > TEXT["sliding_window"]
    rows = {"image_last": end - 1, "after_image": end, "last": len(ids) - 1}
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        feats = long_model.model.get_image_features(image, return_dict=True).pooler_output
        assert list(feats.shape) == [1, LONG_TOKENS_PER_IMAGE, TEXT["hidden_size"]]
        out = long_model(
            input_ids=input_ids, pixel_values=image, token_type_ids=torch.tensor([types]), use_cache=False
        )
        logits = out.logits[0].double()

        def under(rule: str) -> Any:
            o = long_model(
                input_ids=input_ids, pixel_values=image, attention_mask=masks(types, rule), use_cache=False
            )
            return o.logits[0].double()

        # The hand-built masks are transformers' own where they should be.
        assert torch.equal(under("right"), logits), "the hand-built mask is not transformers'"
        plain = long_model(input_ids=input_ids, pixel_values=image, use_cache=False).logits[0].double()
        assert torch.equal(under("causal"), plain), "the hand-built causal mask is not transformers'"
        moves = {}
        for rule in ("causal", "block_past_window", "image_rows_without_window"):
            wrong = under(rule)
            moves[rule] = {k: round(float((logits[r] - wrong[r]).abs().max()), 6) for k, r in rows.items()}
    top2 = torch.topk(logits, 2, dim=-1).values
    return {
        "config_json": json.loads(config.to_json_string(use_diff=True)),
        "config": json.loads(config.to_json_string(use_diff=False)),
        "images": [0],
        "input_ids": ids,
        "token_type_ids": types,
        "image_block": [start, end],
        "rows": rows,
        "image_last_logits": rounded(logits[rows["image_last"]]),
        "after_image_logits": rounded(logits[rows["after_image"]]),
        "last_logits": rounded(logits[rows["last"]]),
        "argmax": [int(i) for i in torch.argmax(logits, dim=-1)],
        "min_argmax_margin": round(float((top2[:, 0] - top2[:, 1]).min()), 6),
        "wrong_masks_move_logits_by": moves,
    }


def tokenizer_json() -> dict[str, Any]:
    """A word-level tokenizer over ``t0..t75`` with ``<bos>`` (2) and the three image tokens as
    special added tokens (76, 77, 78); unknown words are ``t0``."""
    specials = [(BOI, "<start_of_image>"), (EOI, "<end_of_image>"), (IMAGE_TOKEN, "<image_soft_token>")]
    return word_tokenizer(BOI, [(2, "<bos>"), *specials])


def chat(model: Any) -> dict[str, Any]:
    """A chat turn with an image (``CHAT_IMAGE``, RGBA) through transformers' whole pipeline:
    the chat template, ``Gemma3Processor`` (``Gemma3ImageProcessorPil`` of ``PREPROCESSOR``,
    ``image_seq_length`` 4), then greedy ``generate`` of ``CHAT_TOKENS`` tokens."""
    import tempfile

    import transformers as T
    from PIL import Image
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    tok_json = tokenizer_json()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tokenizer.json"
        path.write_text(json.dumps(tok_json))
        tokenizer = T.PreTrainedTokenizerFast(
            tokenizer_file=str(path),
            unk_token="t0",
            bos_token="<bos>",
            extra_special_tokens={
                "boi_token": "<start_of_image>",
                "eoi_token": "<end_of_image>",
                "image_token": "<image_soft_token>",
            },
        )
    pre = {k: v for k, v in PREPROCESSOR.items() if k != "image_processor_type"}
    processor = T.Gemma3Processor(
        image_processor=Gemma3ImageProcessorPil(**pre),
        tokenizer=tokenizer,
        image_seq_length=TOKENS_PER_IMAGE,
        chat_template=CHAT_TEMPLATE,
    )
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "t5 t6 t7"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    image = Image.open(CHAT_IMAGE)
    inputs = processor(text=text, images=[[image]], return_tensors="pt", add_special_tokens=False)
    generated, margin = greedy(model, inputs, CHAT_TOKENS)
    prompt_ids = [int(i) for i in inputs["input_ids"][0]]
    return {
        "tokenizer_json": tok_json,
        "tokenizer_config": {
            "bos_token": "<bos>",
            "unk_token": "t0",
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
        "chat_template": CHAT_TEMPLATE,
        "preprocessor_config": PREPROCESSOR,
        "processor_config": {"image_seq_length": TOKENS_PER_IMAGE, "processor_class": "Gemma3Processor"},
        "image": str(CHAT_IMAGE.relative_to(ROOT)),
        "messages_text": "t5 t6 t7",
        "prompt": text,
        "prompt_ids": prompt_ids,
        "token_type_ids": [int(i) for i in inputs["token_type_ids"][0]],
        "generated": generated,
        "min_margin": margin,
    }


def main() -> None:
    import torch
    import transformers as T

    config = gemma3_config(TOKENS_PER_IMAGE)
    model = T.Gemma3ForConditionalGeneration(config).to(torch.float32)
    model.eval()
    tensors = []
    for pname, param in model.named_parameters():
        std, mean = init_for(pname)
        values = hashed_values(pname, param.numel(), std, mean).reshape(tuple(param.shape))
        with torch.no_grad():
            param.copy_(torch.from_numpy(values))
        tensors.append({"name": pname, "shape": list(param.shape), "std": std, "mean": mean})

    size = VISION["image_size"]
    n = IMAGES * VISION["num_channels"] * size * size
    std = 1.0 / 3.0**0.5  # uniform in [-1, 1)
    pixels = torch.from_numpy(hashed_values("pixel_values", n, std, 0.0)).reshape(IMAGES, 3, size, size)

    with torch.no_grad():
        feats_all = model.model.get_image_features(pixels, return_dict=True).pooler_output
        feats_one = model.model.get_image_features(pixels[1:2], return_dict=True).pooler_output
        ids, types = prompt()
        assert ids.count(IMAGE_TOKEN) == feats_all.shape[0] * feats_all.shape[1]
        out = model(
            input_ids=torch.tensor([ids]),
            pixel_values=pixels,
            token_type_ids=torch.tensor([types]),
            use_cache=False,
        )
        causal = model(input_ids=torch.tensor([ids]), pixel_values=pixels, use_cache=False)
        logits = out.logits[0].double()
        top2 = torch.topk(logits, 2, dim=-1).values
        moved = float((logits[-1] - causal.logits[0, -1].double()).abs().max())
    fixture = {
        "model": "gemma3",
        "oracle": f"transformers {T.__version__}, torch {torch.__version__}, float32, eager, CPU",
        "python": platform.python_version(),
        # As config.json holds it (save_pretrained: only what differs from the defaults), and in full.
        "config_json": json.loads(config.to_json_string(use_diff=True)),
        "config": json.loads(config.to_json_string(use_diff=False)),
        "tensors": tensors,
        "pixel_values": {"name": "pixel_values", "shape": list(pixels.shape), "std": std, "mean": 0.0},
        "image_features": [
            {"images": [0, 1], "shape": list(feats_all.shape), "values": rounded(feats_all)},
            {"images": [1], "shape": list(feats_one.shape), "values": rounded(feats_one)},
        ],
        "forward": {
            "input_ids": ids,
            "token_type_ids": types,
            "last_logits": rounded(logits[-1]),
            "argmax": [int(i) for i in torch.argmax(logits, dim=-1)],
            "min_argmax_margin": round(float((top2[:, 0] - top2[:, 1]).min()), 6),
            "causal_mask_moves_last_logits_by": round(moved, 6),
        },
        "chat": chat(model),
        "forward_long_image": forward_long_image(model, pixels),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(fixture, indent=None, separators=(",", ":")) + "\n")
    print(
        f"features {list(feats_all.shape)}, argmax {fixture['forward']['argmax']}, margin "
        f"{fixture['forward']['min_argmax_margin']}, causal moves {moved:.4f}, chat "
        f"{fixture['chat']['generated']}; long image: argmax {fixture['forward_long_image']['argmax']}, "
        f"margin {fixture['forward_long_image']['min_argmax_margin']}, wrong masks move "
        f"{fixture['forward_long_image']['wrong_masks_move_logits_by']} -> {OUT.relative_to(ROOT)}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

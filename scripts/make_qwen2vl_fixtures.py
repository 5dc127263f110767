#!/usr/bin/env python3
"""Make reference outputs of tiny Qwen2-VL and Qwen2.5-VL models with Hugging Face transformers.

Not run by CI: it needs torch and transformers (a multi-GB install). CI checks lmplex against the
fixtures this script writes (``tests/fixtures/vision/qwen2_vl.json``, ``qwen2_5_vl.json``). Run it
in a separate environment, as ``make_vlm_fixtures.py``:

    python3 -m venv /tmp/hf
    /tmp/hf/bin/pip install torch transformers pillow numpy
    /tmp/hf/bin/python scripts/make_qwen2vl_fixtures.py

Per family, a tiny ``ForConditionalGeneration`` is built from its config: the vision transformer
(2 blocks of width 32, 2 heads, 4x4 patches over 2 frames, 2D rotary positions; Qwen2-VL's
LayerNorm and quick-GELU MLP, Qwen2.5-VL's RMSNorm, SwiGLU MLP and window attention over 2x2
merged units in block 0 with block 1 full), the patch merger (2x2 patches per token) and a tiny
Qwen2 text model with M-RoPE (sections 2, 3, 3 of the 8 frequencies; vocabulary 80 with
``<|vision_start|>`` = 76, ``<|vision_end|>`` = 77, ``<|image_pad|>`` = 78). Every parameter is
overwritten with ``hashed_values`` (``tests/hashed.py``), which the Rust tests reproduce bit for
bit, and so are the patch values (uniform in [-1, 1)); the oracle runs in float32, eager
attention, on the CPU:

- ``image_features``: ``get_image_features`` of 2 images (grids 1x4x6 and 1x8x4: 6 and 8
  tokens), together and the second alone;
- ``forward``: a prompt with both images' tokens among text, through ``model(input_ids,
  pixel_values, image_grid_thw, mm_token_type_ids)``: the M-RoPE position ids transformers
  computes (3 rows), the last position's logits, the greedy token at every position with the
  smallest top-1/top-2 gap, and 6 greedy tokens of ``generate`` (decoding goes on from the
  positions' maximum, ``rope_deltas``);
- ``chat``: one user turn of an image and text through transformers' pipeline (a chat template,
  ``Qwen2VLImageProcessorPil``, the processor's expansion of ``<|image_pad|>``, ``generate``).

``generate`` runs with ``min_new_tokens``, which bans EOS until then (lmplex's ``min_tokens``).
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

OUT = ROOT / "tests" / "fixtures" / "vision"
START, END, PAD, VOCAB = 76, 77, 78, 80
PATCH, TEMPORAL, MERGE = 4, 2, 2
GRIDS = [(1, 4, 6), (1, 8, 4)]
TEXT = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen2_vl": {
        "depth": 2,
        "embed_dim": 32,
        "hidden_size": 64,
        "mlp_ratio": 2,
        "num_heads": 2,
        "patch_size": PATCH,
        "spatial_merge_size": MERGE,
        "temporal_patch_size": TEMPORAL,
        "hidden_act": "quick_gelu",
    },
    "qwen2_5_vl": {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 48,
        "out_hidden_size": 64,
        "num_heads": 2,
        "patch_size": PATCH,
        "spatial_merge_size": MERGE,
        "temporal_patch_size": TEMPORAL,
        "hidden_act": "silu",
        "window_size": 16,  # 16 / 4 / 2 = 2 merged units a side
        "fullatt_block_indexes": [1],
    },
}
PREPROCESSOR = {
    "do_resize": True,
    "resample": 3,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "size": {"shortest_edge": 64, "longest_edge": 1024},
    "patch_size": PATCH,
    "temporal_patch_size": TEMPORAL,
    "merge_size": MERGE,
}
CHAT_TEMPLATE = (
    "{% for m in messages %}t1 {% for p in m['content'] %}{% if p['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ p['text'] }}{% endif %}{% endfor %} t2 "
    "{% endfor %}{% if add_generation_prompt %}t3 {% endif %}"
)
CHAT_IMAGE = ROOT / "tests" / "fixtures" / "images" / "rgb.png"
TOKENS = 6


def init_for(name: str) -> tuple[float, float]:
    """(std, mean) of a tensor by its HF name: norms near 1, biases small, projections 0.1-0.2."""
    if "norm" in name and name.endswith(".weight") or name.endswith(("ln_q.weight", "norm1.weight")):
        return (0.1, 1.0)
    if name.endswith(".bias"):
        return (0.1, 0.0)
    if "embed_tokens" in name:
        return (0.5, 0.0)
    if "lm_head" in name:
        return (0.15, 0.0)
    return (0.2, 0.0)


def prompt() -> tuple[list[int], list[int]]:
    """Text, the first image's 6 tokens, text, the second image's 8 tokens, text; and the
    ``mm_token_type_ids`` (1 at image tokens)."""
    ids = [1, 5, 6, START] + [PAD] * 6 + [END, 7, 8, 9, START] + [PAD] * 8 + [END, 10, 11]
    return ids, [int(i == PAD) for i in ids]


def tokenizer_json() -> dict[str, Any]:
    """A word-level tokenizer over ``t0..t75`` with the three vision tokens as special added
    tokens; unknown words are ``t0``."""
    return word_tokenizer(
        START, [(START, "<|vision_start|>"), (END, "<|vision_end|>"), (PAD, "<|image_pad|>")]
    )


def chat(family: str, model: Any) -> dict[str, Any]:
    """A chat turn with an image (``CHAT_IMAGE``) through transformers' whole pipeline."""
    import tempfile

    import torch
    import transformers as T
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok_json = tokenizer_json()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tokenizer.json"
        path.write_text(json.dumps(tok_json))
        tokenizer = T.PreTrainedTokenizerFast(tokenizer_file=str(path), unk_token="t0")
    # The processor classes need a video processor, which needs torchvision; their image part
    # is the image processor plus `replace_image_token` (each `<|image_pad|>` repeated
    # grid_t * grid_h * grid_w / merge_size^2 times) and 1 in `mm_token_type_ids` at those
    # tokens, done here as they do it.
    image_processor = Qwen2VLImageProcessorPil(**PREPROCESSOR)
    env = __import__("jinja2").Environment()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "t5 t6 t7"}]}]
    text = env.from_string(CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=True)
    image = Image.open(CHAT_IMAGE)
    pixels = image_processor(images=[image], return_tensors="pt")
    n = int(pixels["image_grid_thw"][0].prod()) // MERGE**2
    expanded = text.replace("<|image_pad|>", "<|image_pad|>" * n)
    ids = tokenizer(expanded, add_special_tokens=False, return_tensors="pt")["input_ids"]
    inputs = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "mm_token_type_ids": (ids == PAD).int(),
        "pixel_values": pixels["pixel_values"],
        "image_grid_thw": pixels["image_grid_thw"],
    }
    generated, margin = greedy(model, inputs, TOKENS)
    prompt_ids = [int(i) for i in inputs["input_ids"][0]]
    return {
        "tokenizer_json": tok_json,
        "chat_template": CHAT_TEMPLATE,
        "preprocessor_config": PREPROCESSOR | {"image_processor_type": "Qwen2VLImageProcessor"},
        "image": str(CHAT_IMAGE.relative_to(ROOT)),
        "messages_text": "t5 t6 t7",
        "prompt": text,
        "prompt_ids": prompt_ids,
        "image_grid_thw": [int(x) for x in inputs["image_grid_thw"][0]],
        "generated": generated,
        "min_margin": margin,
    }


def make(family: str) -> None:
    import torch
    import transformers as T

    config_cls = T.Qwen2VLConfig if family == "qwen2_vl" else T.Qwen2_5_VLConfig
    model_cls = (
        T.Qwen2VLForConditionalGeneration if family == "qwen2_vl" else T.Qwen2_5_VLForConditionalGeneration
    )
    config = config_cls(
        text_config=TEXT,
        vision_config=FAMILIES[family],
        image_token_id=PAD,
        vision_start_token_id=START,
        vision_end_token_id=END,
        tie_word_embeddings=False,
    )
    for c in (config, config.vision_config, config.text_config):
        c._attn_implementation = "eager"
    model = model_cls(config).to(torch.float32)
    model.eval()
    tensors = []
    for pname, param in model.named_parameters():
        std, mean = init_for(pname)
        values = hashed_values(pname, param.numel(), std, mean).reshape(tuple(param.shape))
        with torch.no_grad():
            param.copy_(torch.from_numpy(values))
        tensors.append({"name": pname, "shape": list(param.shape), "std": std, "mean": mean})

    width = 3 * TEMPORAL * PATCH * PATCH
    rows = sum(t * h * w for t, h, w in GRIDS)
    std = 1.0 / 3.0**0.5  # uniform in [-1, 1)
    patches = torch.from_numpy(hashed_values("pixel_values", rows * width, std, 0.0)).reshape(rows, width)
    grid = torch.tensor(GRIDS)
    first = GRIDS[0][0] * GRIDS[0][1] * GRIDS[0][2]

    with torch.no_grad():
        feats = model.model.get_image_features(patches, grid, return_dict=True).pooler_output
        feats_all = torch.cat(list(feats))
        feats_one = torch.cat(
            list(model.model.get_image_features(patches[first:], grid[1:], return_dict=True).pooler_output)
        )
        ids, types = prompt()
        inputs = {
            "input_ids": torch.tensor([ids]),
            "pixel_values": patches,
            "image_grid_thw": grid,
            "mm_token_type_ids": torch.tensor([types]),
        }
        positions, _ = model.model.get_rope_index(
            inputs["input_ids"], inputs["mm_token_type_ids"], image_grid_thw=grid
        )
        out = model(**inputs, use_cache=False)
        logits = out.logits[0].double()
        top2 = torch.topk(logits, 2, dim=-1).values
        gen = model.generate(**inputs, max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False)
    fixture = {
        "model": family,
        "oracle": f"transformers {T.__version__}, torch {torch.__version__}, float32, eager, CPU",
        "python": platform.python_version(),
        "config_json": json.loads(config.to_json_string(use_diff=True)),
        "config": json.loads(config.to_json_string(use_diff=False)),
        "tensors": tensors,
        "pixel_values": {"name": "pixel_values", "shape": [rows, width], "std": std, "mean": 0.0},
        "image_grid_thw": [list(g) for g in GRIDS],
        "image_features": [
            {"images": [0, 1], "shape": list(feats_all.shape), "values": rounded(feats_all)},
            {"images": [1], "shape": list(feats_one.shape), "values": rounded(feats_one)},
        ],
        "forward": {
            "input_ids": ids,
            "mm_token_type_ids": types,
            "position_ids": [[int(x) for x in row[0]] for row in positions],
            "last_logits": rounded(logits[-1]),
            "argmax": [int(i) for i in torch.argmax(logits, dim=-1)],
            "min_argmax_margin": round(float((top2[:, 0] - top2[:, 1]).min()), 6),
            "generated": [int(i) for i in gen[0][len(ids) :]],
        },
        "chat": chat(family, model),
    }
    path = OUT / f"{family}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fixture, indent=None, separators=(",", ":")) + "\n")
    print(
        f"{family}: features {list(feats_all.shape)}, argmax {fixture['forward']['argmax']}, margin "
        f"{fixture['forward']['min_argmax_margin']}, generated {fixture['forward']['generated']}, chat "
        f"{fixture['chat']['generated']} (grid {fixture['chat']['image_grid_thw']}) -> {path.relative_to(ROOT)}",
        file=sys.stderr,
    )


def main() -> None:
    for family in FAMILIES:
        make(family)


if __name__ == "__main__":
    main()

"""The tiny vision-language models of ``make_mmproj_fixtures.py``: per family, its config, the
processor configs the converter reads, and a builder that makes the model with hashed weights and
transformers' image features for hashed inputs.

Each builder makes a tiny ``ForConditionalGeneration`` (float32, eager attention) whose every
parameter is overwritten by ``hashed_values`` (``tests/hashed.py``, by the parameter's name in
``named_parameters``), and returns it with the hashing recipe of each parameter and its inputs and
``get_image_features`` outputs: pixels from ``hashed_values("pixel_values", n, 1/sqrt(3), 0)``
(uniform in [-1, 1)). The families are shaped by what llama.cpp's ``convert_hf_to_gguf.py
--mmproj`` can map:

- ``idefics3``: the model of ``make_vlm_fixtures.py`` unchanged (SigLIP hidden 32, 2 layers,
  32x32 tiles of 8x8 patches, pixel shuffle by 2, text hidden 64); features of 3 tiles, and of
  tile 2 alone. ``processor_config.json``'s ``image_seq_len`` is the tokens per tile;
- ``gemma3``: the model of ``make_gemma3_vlm_fixtures.py`` unchanged. transformers 5 saves its
  SigLIP tower as ``vision_tower.embeddings...``, which the converter cannot map: the run renames
  the saved keys as the Hub's checkpoints have them, ``vision_tower.vision_model.embeddings...``
  (the converter then drops the unused SigLIP head, ``vision_tower.vision_model.head.*``, and maps
  the rest). ``image_seq_length`` 4 in the processor configs gives llama.cpp's projector scale
  factor (32 / 8 / 2 = 2). llama.cpp always stores ``mm.input_projection.weight`` as float16,
  whatever ``--outtype`` says, so the builder also gives the features with that weight rounded to
  float16 (``image_features_gguf_weights``), what a loader of the GGUF must give;
- ``qwen2_vl`` and ``qwen2_5_vl``: not ``make_qwen2vl_fixtures.py``'s towers, whose depth 2 the
  converter cannot map (it maps the merger's ``mlp.0`` / ``mlp.2`` by block id, so depth >= 3)
  and whose 4x4 patches and 16-pixel windows llama.cpp cannot express (it writes no window size
  and uses 112 pixels). Here (``QWEN_VISION``): depth 4, width 16 (so the files stay small: the
  14x14x2 patch embedding alone is 16 x 1176 floats), 2 heads, 14x14 patches over 2 frames, 2x2
  merged units, text hidden 64; Qwen2-VL's MLP ratio 2 (fc1 32 wide), Qwen2.5-VL's SwiGLU 32
  wide, window 112 (4x4 merged units) with blocks 1 and 3 full. The text model is
  ``make_qwen2vl_fixtures.py``'s. Inputs are patch rows ``[rows, 3 * 2 * 14 * 14]`` of the grids
  ``QWEN_GRIDS`` (``image_grid_thw``); Qwen2.5-VL's entry also says how far the features move when
  every block attends fully, so a test can tell the windows are applied.

``FAMILIES`` maps each family to its builder, its ``preprocessor_config.json`` and a note;
``PROCESSOR`` to its ``processor_config.json`` (none for Qwen).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from hashed import hashed_values

sys.path.insert(0, str(ROOT / "scripts"))
import make_gemma3_vlm_fixtures as gemma3_fx
import make_qwen2vl_fixtures as qwen_fx
import make_vlm_fixtures as idefics3_fx
from vlm_fixtures import rounded

PIXEL_STD = 1.0 / 3.0**0.5  # uniform in [-1, 1)

QWEN_PATCH, QWEN_TEMPORAL, QWEN_MERGE = 14, 2, 2
# 16x16 patches: 2x2 windows of 4x4 merged units; 20x12: 10x6 units, so partial windows at the edges.
QWEN_GRIDS = [(1, 16, 16), (1, 20, 12)]
QWEN_VISION: dict[str, dict[str, Any]] = {
    "qwen2_vl": {
        "depth": 4,
        "embed_dim": 16,
        "hidden_size": 64,
        "mlp_ratio": 2,
        "num_heads": 2,
        "patch_size": QWEN_PATCH,
        "spatial_merge_size": QWEN_MERGE,
        "temporal_patch_size": QWEN_TEMPORAL,
        "hidden_act": "quick_gelu",
    },
    "qwen2_5_vl": {
        "depth": 4,
        "hidden_size": 16,
        "intermediate_size": 32,
        "out_hidden_size": 64,
        "num_heads": 2,
        "patch_size": QWEN_PATCH,
        "spatial_merge_size": QWEN_MERGE,
        "temporal_patch_size": QWEN_TEMPORAL,
        "hidden_act": "silu",
        "window_size": 112,  # llama.cpp's fixed window: 112 / 14 / 2 = 4 merged units a side
        "fullatt_block_indexes": [1, 3],
    },
}
QWEN_PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2VLProcessor",
    "do_resize": True,
    "resample": 3,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "min_pixels": 56 * 56,
    "max_pixels": 28 * 28 * 256,
    "patch_size": QWEN_PATCH,
    "temporal_patch_size": QWEN_TEMPORAL,
    "merge_size": QWEN_MERGE,
}
IDEFICS3_PREPROCESSOR = {
    "image_processor_type": "Idefics3ImageProcessor",
    "processor_class": "Idefics3Processor",
    "do_convert_rgb": True,
    "do_resize": True,
    "size": {"longest_edge": 96},
    "resample": 1,
    "do_image_splitting": True,
    "max_image_size": {"longest_edge": 32},
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_pad": True,
}
GEMMA3_PREPROCESSOR = gemma3_fx.PREPROCESSOR | {
    "image_seq_length": gemma3_fx.TOKENS_PER_IMAGE,
    "processor_class": "Gemma3Processor",
}
PROCESSOR: dict[str, dict[str, Any]] = {
    "idefics3": {"image_seq_len": idefics3_fx.TOKENS_PER_TILE, "processor_class": "Idefics3Processor"},
    "gemma3": {"image_seq_length": gemma3_fx.TOKENS_PER_IMAGE, "processor_class": "Gemma3Processor"},
}


def hash_parameters(model: Any, init_for: Callable[[str], tuple[float, float]]) -> dict[str, dict[str, Any]]:
    """Overwrite every parameter with ``hashed_values`` by its name; the recipe of each, by name."""
    import torch

    recipes = {}
    for pname, param in model.named_parameters():
        std, mean = init_for(pname)
        values = hashed_values(pname, param.numel(), std, mean).reshape(tuple(param.shape))
        with torch.no_grad():
            param.copy_(torch.from_numpy(values))
        recipes[pname] = {"name": pname, "shape": list(param.shape), "std": std, "mean": mean}
    return recipes


def pixels(n: int) -> Any:
    import torch

    return torch.from_numpy(hashed_values("pixel_values", n, PIXEL_STD, 0.0))


def build_idefics3() -> tuple[Any, Any, dict[str, Any]]:
    """The model of ``make_vlm_fixtures.py``, its inputs and features (3 tiles, and tile 2 alone)."""
    import torch
    import transformers as T

    fx = idefics3_fx
    config = T.Idefics3Config(
        vision_config=fx.VISION,
        text_config=fx.TEXT,
        scale_factor=fx.SCALE_FACTOR,
        image_token_id=fx.IMAGE_TOKEN,
        tie_word_embeddings=False,
    )
    for c in (config, config.vision_config, config.text_config):
        c._attn_implementation = "eager"
    model = T.Idefics3ForConditionalGeneration(config).to(torch.float32).eval()
    recipes = hash_parameters(model, fx.init_for)
    size = fx.VISION["image_size"]
    px = pixels(fx.TILES * 3 * size * size).reshape(fx.TILES, 3, size, size)
    with torch.no_grad():
        all_ = model.model.get_image_features(px[None], return_dict=True).pooler_output[0]
        one = model.model.get_image_features(px[None, 2:3], return_dict=True).pooler_output[0]
    inputs = {
        "pixel_values": {"name": "pixel_values", "shape": list(px.shape), "std": PIXEL_STD, "mean": 0.0},
        "image_features": [
            {"tiles": [0, 1, 2], "shape": list(all_.shape), "values": rounded(all_)},
            {"tiles": [2], "shape": list(one.shape), "values": rounded(one)},
        ],
    }
    return model, recipes, inputs


def build_gemma3() -> tuple[Any, Any, dict[str, Any]]:
    """The model of ``make_gemma3_vlm_fixtures.py``, its inputs and features (2 images, and
    image 1 alone)."""
    import torch
    import transformers as T

    fx = gemma3_fx
    config = T.Gemma3Config(
        vision_config=fx.VISION,
        text_config=fx.TEXT,
        mm_tokens_per_image=fx.TOKENS_PER_IMAGE,
        boi_token_index=fx.BOI,
        eoi_token_index=fx.EOI,
        image_token_index=fx.IMAGE_TOKEN,
    )
    for c in (config, config.vision_config, config.text_config):
        c._attn_implementation = "eager"
    model = T.Gemma3ForConditionalGeneration(config).to(torch.float32).eval()
    recipes = hash_parameters(model, fx.init_for)
    size = fx.VISION["image_size"]
    px = pixels(fx.IMAGES * 3 * size * size).reshape(fx.IMAGES, 3, size, size)

    def features() -> tuple[Any, Any]:
        both = model.model.get_image_features(px, return_dict=True).pooler_output
        return both, model.model.get_image_features(px[1:2], return_dict=True).pooler_output

    # llama.cpp stores mm.input_projection as float16 whatever --outtype says: the features of the
    # weights as the GGUF holds them too (the projection rounded to float16, the rest float32).
    w = model.model.multi_modal_projector.mm_input_projection_weight
    with torch.no_grad():
        all_, one = features()
        kept = w.detach().clone()
        w.copy_(w.half().float())
        all16, one16 = features()
        w.copy_(kept)
    inputs = {
        "pixel_values": {"name": "pixel_values", "shape": list(px.shape), "std": PIXEL_STD, "mean": 0.0},
        "image_features": [
            {"images": [0, 1], "shape": list(all_.shape), "values": rounded(all_)},
            {"images": [1], "shape": list(one.shape), "values": rounded(one)},
        ],
        "image_features_gguf_weights": [
            {"images": [0, 1], "shape": list(all16.shape), "values": rounded(all16)},
            {"images": [1], "shape": list(one16.shape), "values": rounded(one16)},
        ],
        "f16_projection_moves_features_by": round(float((all16 - all_).abs().max()), 6),
    }
    return model, recipes, inputs


def build_qwen(family: str) -> tuple[Any, Any, dict[str, Any]]:
    """A tiny Qwen2-VL / Qwen2.5-VL (``QWEN_VISION``), its patch rows and features (both images
    of ``QWEN_GRIDS``, and the second alone)."""
    import torch
    import transformers as T

    qwen2 = family == "qwen2_vl"
    config = (T.Qwen2VLConfig if qwen2 else T.Qwen2_5_VLConfig)(
        text_config=qwen_fx.TEXT,
        vision_config=QWEN_VISION[family],
        image_token_id=qwen_fx.PAD,
        vision_start_token_id=qwen_fx.START,
        vision_end_token_id=qwen_fx.END,
        tie_word_embeddings=False,
    )
    for c in (config, config.vision_config, config.text_config):
        c._attn_implementation = "eager"
    cls = T.Qwen2VLForConditionalGeneration if qwen2 else T.Qwen2_5_VLForConditionalGeneration
    model = cls(config).to(torch.float32).eval()
    recipes = hash_parameters(model, qwen_fx.init_for)
    width = 3 * QWEN_TEMPORAL * QWEN_PATCH * QWEN_PATCH
    rows = sum(t * h * w for t, h, w in QWEN_GRIDS)
    px = pixels(rows * width).reshape(rows, width)
    grid = torch.tensor(QWEN_GRIDS)
    first = QWEN_GRIDS[0][0] * QWEN_GRIDS[0][1] * QWEN_GRIDS[0][2]
    with torch.no_grad():
        all_ = torch.cat(list(model.model.get_image_features(px, grid, return_dict=True).pooler_output))
        one = torch.cat(
            list(model.model.get_image_features(px[first:], grid[1:], return_dict=True).pooler_output)
        )
    inputs: dict[str, Any] = {
        "pixel_values": {"name": "pixel_values", "shape": [rows, width], "std": PIXEL_STD, "mean": 0.0},
        "image_grid_thw": [list(g) for g in QWEN_GRIDS],
        "image_features": [
            {"images": [0, 1], "shape": list(all_.shape), "values": rounded(all_)},
            {"images": [1], "shape": list(one.shape), "values": rounded(one)},
        ],
    }
    if not qwen2:
        # How far the features move when every block attends fully (so the windows are exercised).
        visual = model.model.visual
        windowed = visual.fullatt_block_indexes
        visual.fullatt_block_indexes = list(range(QWEN_VISION[family]["depth"]))
        with torch.no_grad():
            full = torch.cat(list(model.model.get_image_features(px, grid, return_dict=True).pooler_output))
        visual.fullatt_block_indexes = windowed
        inputs["full_attention_moves_features_by"] = round(float((full - all_).abs().max()), 6)
    return model, recipes, inputs


FAMILIES: dict[str, tuple[Callable[[], tuple[Any, Any, dict[str, Any]]], dict[str, Any], str]] = {
    "idefics3": (
        build_idefics3,
        IDEFICS3_PREPROCESSOR,
        "the model of scripts/make_vlm_fixtures.py (tests/fixtures/vision/idefics3.json), unchanged",
    ),
    "gemma3": (
        build_gemma3,
        GEMMA3_PREPROCESSOR,
        (
            "the model of scripts/make_gemma3_vlm_fixtures.py (tests/fixtures/vision/gemma3.json), unchanged; "
            "its saved keys renamed vision_tower.* -> vision_tower.vision_model.* (the Hub's names)"
        ),
    ),
    "qwen2_vl": (
        lambda: build_qwen("qwen2_vl"),
        QWEN_PREPROCESSOR,
        "its own tower (depth 4, width 16, 14x14 patches): not the one of tests/fixtures/vision/qwen2_vl.json",
    ),
    "qwen2_5_vl": (
        lambda: build_qwen("qwen2_5_vl"),
        QWEN_PREPROCESSOR,
        (
            "its own tower (depth 4, width 16, 14x14 patches, window 112, full blocks 1 and 3): not the one "
            "of tests/fixtures/vision/qwen2_5_vl.json"
        ),
    ),
}

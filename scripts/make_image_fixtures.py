#!/usr/bin/env python3
"""Make the image fixtures: small test images, and what transformers' PIL image processor makes of them.

Not run by CI: it needs transformers, Pillow and numpy (torch comes with transformers' processor
imports). CI checks lmplex-image against the files this script writes
(``crates/lmplex-image/tests/hf_processor.rs``). Run it in a separate environment:

    python3 -m venv /tmp/hf
    /tmp/hf/bin/pip install torch transformers pillow numpy
    /tmp/hf/bin/python scripts/make_image_fixtures.py

It writes, under ``tests/fixtures/images/``:

- the images, deterministic (smooth gradients plus hashed noise, ``hashed_bytes`` below): an RGB
  PNG, an RGBA PNG whose alpha takes every value, a grayscale PNG, a CMYK JPEG, a palette GIF
  with a transparent index, a lossless RGBA WebP, a lossy RGB WebP and an RGB JPEG (4:2:0);
  for each JPEG also ``NAME.pil.png``, Pillow's decoding of it (libjpeg-turbo), stored losslessly;
  and tiny PNGs of rarer pixel formats (16-bit RGB, gray and gray-alpha, RGB with a tRNS colour,
  palette with tRNS alphas, 1-bit), checked for decoding only;
- one folder per processor config (``preprocessor_config.json`` + ``processor_config.json``):
  ``smolvlm_256m`` is SmolVLM-256M-Instruct's own; ``small`` and ``small_nosplit`` are made-up
  ones whose outputs are small (splitting off, BICUBIC and ImageNet mean/std for the second);
- ``idefics3.json``: per image the sha256 of ``np.array(convert_to_rgb(Image.open(path)))``
  (what decoding must give), and per image and config the shape of ``pixel_values``, rows,
  cols, the sha256 of the float32 little-endian bytes of ``pixel_values``, its first 8 values
  (and, to locate a difference, each tile's sha256 and 32 values at an even stride), and the
  prompt text of the image (``Idefics3Processor.replace_image_token``; its sha256 when long); plus one call
  with two images; with the versions of transformers, Pillow and numpy;
- ``resample.json``: Pillow's ``Image.resize`` of hashed-noise RGB images for random sizes (up
  and down, odd sizes, 1-pixel sides) and every filter that goes through ``ImagingResample``;
  the Rust test rebuilds each input with ``hashed_bytes`` and compares the sha256 of the output;
- Gemma 3 (``crates/lmplex-image/tests/hf_processor_gemma3.rs``): config folders ``gemma3``
  (gemma-3-4b-it's own values, typed in, with its tokenizer_config.json's image tokens) and
  ``gemma3_pan`` (pan-and-scan on, small views); ``gemma3.json``: per image (the images above plus
  ``tiny.png`` and ``wide.png``) and config, ``num_crops``, the pixel record and the text that
  replaces the image's placeholder (``Gemma3Processor.replace_image_token``), and
  ``pan_and_scan``'s crop boxes for random sizes under three settings;
- Qwen2-VL (``crates/lmplex-image/tests/hf_processor_qwen2vl.rs``): config folders ``qwen2vl``
  (Qwen2-VL-2B-Instruct's values) and ``qwen2vl_small`` (few pixels, patch 7, 3 frames);
  ``qwen2vl.json``: per image and config ``image_grid_thw``, the pixel record (a tile is one
  merge window of patches) and the replacement text (``Qwen2VLProcessor.replace_image_token``),
  and ``smart_resize``'s output for random sizes, or the sizes it refuses.

And more JPEGs, under ``jpeg/``, checked for decoding only (``tests/hf_processor.rs``): one per
encoder setting that changes what libjpeg-turbo's decoder does (4:4:4, 4:2:2 and 4:2:0 at odd
sizes, one row, gray, progressive RGB and CMYK, restart markers, optimized Huffman tables, quality
50 and 95, an EXIF orientation, saturated colours); ``jpeg.json`` holds per file Pillow's mode and
size and the sha256 of ``np.array(convert_to_rgb(Image.open(path)))``.

The processors are the PIL ones by name (``Idefics3ImageProcessorPil``, ...), so the reference does
not depend on whether torchvision is installed.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import struct
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import PIL
import transformers
from numpy.typing import NDArray
from PIL import Image
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from transformers.image_transforms import convert_to_rgb
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
from transformers.models.gemma3.processing_gemma3 import Gemma3Processor
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
from transformers.models.idefics3.processing_idefics3 import Idefics3Processor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize
from transformers.models.qwen2_vl.processing_qwen2_vl import Qwen2VLProcessor

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "images"

CONFIGS: dict[str, tuple[dict, dict]] = {
    # SmolVLM-256M-Instruct's preprocessor_config.json and processor_config.json.
    "smolvlm_256m": (
        {
            "do_convert_rgb": True,
            "do_image_splitting": True,
            "do_normalize": True,
            "do_pad": True,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_processor_type": "Idefics3ImageProcessor",
            "image_std": [0.5, 0.5, 0.5],
            "max_image_size": {"longest_edge": 512},
            "processor_class": "Idefics3Processor",
            "resample": 1,
            "rescale_factor": 0.00392156862745098,
            "size": {"longest_edge": 2048},
            "video_sampling": {"fps": 1, "max_frames": 64, "video_size": {"longest_edge": 512}},
        },
        {"image_seq_len": 64, "processor_class": "Idefics3Processor"},
    ),
    "small": (
        {
            "do_image_splitting": True,
            "image_processor_type": "Idefics3ImageProcessor",
            "max_image_size": {"longest_edge": 32},
            "resample": 1,
            "rescale_factor": 0.00392156862745098,
            "size": {"longest_edge": 96},
        },
        {"image_seq_len": 4},
    ),
    "small_nosplit": (
        {
            "do_image_splitting": False,
            "image_mean": [0.485, 0.456, 0.406],
            "image_processor_type": "Idefics3ImageProcessor",
            "image_std": [0.229, 0.224, 0.225],
            "max_image_size": {"longest_edge": 24},
            "resample": 3,
            "size": {"longest_edge": 60},
        },
        {"image_seq_len": 3},
    ),
}


# Gemma 3: (preprocessor_config.json, processor_config.json, tokenizer_config.json's image tokens).
GEMMA3_CONFIGS: dict[str, tuple[dict, dict, dict]] = {
    # gemma-3-4b-it's preprocessor_config.json and processor_config.json; its tokenizer_config.json's
    # image tokens (top-level keys there).
    "gemma3": (
        {
            "do_convert_rgb": None,
            "do_normalize": True,
            "do_pan_and_scan": None,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_processor_type": "Gemma3ImageProcessor",
            "image_seq_length": 256,
            "image_std": [0.5, 0.5, 0.5],
            "pan_and_scan_max_num_crops": None,
            "pan_and_scan_min_crop_size": None,
            "pan_and_scan_min_ratio_to_activate": None,
            "processor_class": "Gemma3Processor",
            "resample": 2,
            "rescale_factor": 0.00392156862745098,
            "size": {"height": 896, "width": 896},
        },
        {"image_seq_length": 256, "processor_class": "Gemma3Processor"},
        {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"},
    ),
    # Pan-and-scan on, small crops, other tokens given the transformers 5 way (extra_special_tokens).
    "gemma3_pan": (
        {
            "do_pan_and_scan": True,
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_processor_type": "Gemma3ImageProcessor",
            "image_std": [0.26862954, 0.26130258, 0.27577711],
            "pan_and_scan_max_num_crops": 3,
            "pan_and_scan_min_crop_size": 16,
            "pan_and_scan_min_ratio_to_activate": 1.2,
            "resample": 3,
            "size": {"height": 40, "width": 48},
        },
        {"image_seq_length": 3},
        {"extra_special_tokens": {"boi_token": "<boi>", "eoi_token": "<eoi>", "image_token": "<img>"}},
    ),
}

# Qwen2-VL: (preprocessor_config.json, tokenizer_config.json's image token, if any).
QWEN2VL_CONFIGS: dict[str, tuple[dict, dict]] = {
    # Qwen2-VL-2B-Instruct's preprocessor_config.json (Qwen2.5-VL's has the same values).
    "qwen2vl": (
        {
            "min_pixels": 3136,
            "max_pixels": 12845056,
            "patch_size": 14,
            "temporal_patch_size": 2,
            "merge_size": 2,
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711],
            "image_processor_type": "Qwen2VLImageProcessor",
            "processor_class": "Qwen2VLProcessor",
        },
        {},
    ),
    # Small: the transformers 5 form of the pixel bounds, few pixels (the images shrink), patch 7,
    # three frames per patch, LANCZOS, another image token.
    "qwen2vl_small": (
        {
            "size": {"shortest_edge": 1568, "longest_edge": 4704},
            "patch_size": 7,
            "temporal_patch_size": 3,
            "merge_size": 2,
            "resample": 1,
            "image_processor_type": "Qwen2VLImageProcessor",
        },
        {"extra_special_tokens": {"image_token": "<|img|>"}},
    ),
}


def hashed_bytes(name: str, n: int) -> NDArray[np.uint8]:
    """``n`` bytes from ``name``: the top byte of murmur3's finalizer over ``i * 0x9E3779B9 ^ fnv1a(name)``.
    The Rust tests compute the same bytes (``hashed_bytes`` in ``tests/hf_processor.rs``)."""
    h = 0x811C9DC5
    for b in name.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    with np.errstate(over="ignore"):
        x = (np.arange(n, dtype=np.uint32) * np.uint32(0x9E3779B9)) ^ np.uint32(h)
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x85EBCA6B)
        x ^= x >> np.uint32(13)
        x *= np.uint32(0xC2B2AE35)
        x ^= x >> np.uint32(16)
    return (x >> np.uint32(24)).astype(np.uint8)


def smooth(name: str, height: int, width: int, channels: int, noise: int = 24) -> NDArray[np.uint8]:
    """Gradients in different directions per channel, plus hashed noise of +-``noise``."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    planes = []
    for c in range(channels):
        angle = 0.7 + 1.9 * c
        g = (np.cos(angle) * x / max(width - 1, 1) + np.sin(angle) * y / max(height - 1, 1)) * 0.5 + 0.5
        planes.append(g * 255.0)
    base = np.stack(planes, axis=-1)
    n = hashed_bytes(name, base.size).reshape(base.shape).astype(np.float64) / 255.0 * 2 * noise - noise
    return np.clip(np.round(base + n), 0, 255).astype(np.uint8)


def write_images() -> list[str]:
    OUT.mkdir(parents=True, exist_ok=True)
    Image.fromarray(smooth("rgb", 53, 37, 3), "RGB").save(OUT / "rgb.png")

    rgba = smooth("rgba", 80, 120, 4)
    y, x = np.mgrid[0:80, 0:120]
    rgba[..., 3] = ((x * 2 + y * 3 + hashed_bytes("alpha", 80 * 120).reshape(80, 120) // 16) % 256).astype(
        np.uint8
    )
    rgba[:4, :, 3] = 0  # fully transparent rows
    rgba[-4:, :, 3] = 255  # opaque rows
    Image.fromarray(rgba, "RGBA").save(OUT / "rgba.png")

    Image.fromarray(smooth("gray", 64, 64, 1)[..., 0], "L").save(OUT / "gray.png")

    cmyk = Image.fromarray(smooth("cmyk", 31, 200, 4), "CMYK")
    cmyk.save(OUT / "cmyk.jpg", quality=90)

    # Palette GIF: 64 colours, index 5 transparent, a block of it in the middle.
    palette = smooth("palette", 1, 64, 3, noise=60)[0]
    y, x = np.mgrid[0:150, 0:90]
    idx = ((x // 6 + (y // 10) * 15 + hashed_bytes("gif", 150 * 90).reshape(150, 90) // 128) % 64).astype(
        np.uint8
    )
    idx[60:80, 30:50] = 5
    gif = Image.fromarray(idx, "P")
    gif.putpalette(palette.flatten().tolist())
    gif.save(OUT / "palette.gif", transparency=5)

    Image.fromarray(smooth("webp", 40, 48, 4), "RGBA").save(OUT / "rgba_lossless.webp", lossless=True)
    Image.fromarray(smooth("lossy", 44, 56, 3), "RGB").save(OUT / "rgb_lossy.webp", quality=80)
    Image.fromarray(smooth("photo", 48, 64, 3, noise=40), "RGB").save(OUT / "photo.jpg", quality=90)  # 4:2:0
    images = [
        "rgb.png",
        "rgba.png",
        "gray.png",
        "cmyk.jpg",
        "palette.gif",
        "rgba_lossless.webp",
        "rgb_lossy.webp",
        "photo.jpg",
    ]
    for name in images:
        if name.endswith(".jpg"):
            # libjpeg-turbo's decoding, kept losslessly: the tests check lmplex's JPEG decoding
            # (libjpeg-turbo's C decoder) against these bytes.
            rgb = convert_to_rgb(Image.open(OUT / name), return_numpy=True)
            Image.fromarray(rgb, "RGB").save(OUT / f"{name}.pil.png")
    return images


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(
    path: Path, size: tuple[int, int], color_type: int, depth: int, data: NDArray, extra: bytes = b""
) -> None:
    """A PNG written by hand, for what Pillow cannot save (16-bit RGB, tRNS on RGB)."""
    width, height = size
    rows = data.reshape(height, -1)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)
    ihdr = png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, 0))
    idat = png_chunk(b"IDAT", zlib.compress(raw))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + ihdr + extra + idat + png_chunk(b"IEND", b""))


def write_decode_only_images() -> list[str]:
    """Tiny images for the rarer pixel formats, checked for decoding only."""
    h, w = 9, 13
    v16 = hashed_bytes("v16", h * w * 4).astype(np.uint16) * 257 + hashed_bytes("v16low", h * w * 4)
    v16 = v16.astype(">u2")
    png(OUT / "rgb16.png", (w, h), 2, 16, v16[: h * w * 3])
    png(OUT / "la16.png", (w, h), 4, 16, v16[: h * w * 2])
    png(OUT / "gray16.png", (w, h), 0, 16, (np.arange(h * w) * 37 % 700).astype(">u2"))  # Pillow's I;16
    rgb = (hashed_bytes("trns", h * w * 3) // 64 * 85).astype(np.uint8)
    trns = png_chunk(b"tRNS", struct.pack(">HHH", 85, 170, 0))  # this colour is transparent
    png(OUT / "rgb_trns.png", (w, h), 2, 8, rgb, extra=trns)
    p = Image.fromarray((hashed_bytes("p", h * w) % 6).reshape(h, w).astype(np.uint8), "P")
    p.putpalette([10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 200, 0, 0, 0, 200, 9])
    p.save(OUT / "palette_trns.png", transparency=bytes([0, 128, 255, 7, 200]))
    Image.fromarray(hashed_bytes("bilevel", h * w).reshape(h, w) > 127).save(OUT / "bilevel.png")
    return ["rgb16.png", "la16.png", "gray16.png", "rgb_trns.png", "palette_trns.png", "bilevel.png"]


def write_configs() -> None:
    folders = {
        name: {"preprocessor_config.json": pre, "processor_config.json": proc}
        for name, (pre, proc) in CONFIGS.items()
    }
    for name, (pre, proc, tok) in GEMMA3_CONFIGS.items():
        folders[name] = {
            "preprocessor_config.json": pre,
            "processor_config.json": proc,
            "tokenizer_config.json": tok,
        }
    for name, (pre, tok) in QWEN2VL_CONFIGS.items():
        folders[name] = {"preprocessor_config.json": pre} | ({"tokenizer_config.json": tok} if tok else {})
    for name, files in folders.items():
        d = OUT / name
        d.mkdir(parents=True, exist_ok=True)
        for file, content in files.items():
            (d / file).write_text(json.dumps(content, indent=2) + "\n")


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A one-word tokenizer: ``Idefics3Processor`` needs one, its prompt text does not."""
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")))


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def pixel_record(pixel_values: NDArray[np.float32], tile_len: int | None = None) -> dict:
    """The sha256 of the whole, and for finding a difference: each tile's sha256 (16 hex digits)
    and 32 values at an even stride. A tile is ``[3, h, w]``, or ``tile_len`` values when given."""
    values = np.ascontiguousarray(pixel_values, dtype="<f4")
    flat = values.reshape(-1)
    stride = max(1, flat.size // 32)
    tiles = values.reshape(-1, *values.shape[-3:]) if tile_len is None else flat.reshape(-1, tile_len)
    return {
        "shape": list(values.shape),
        "sha256": hashlib.sha256(values.tobytes()).hexdigest(),
        "first": [float(v) for v in flat[:8]],
        "tile_sha256": [hashlib.sha256(t.tobytes()).hexdigest()[:16] for t in tiles],
        "sample_stride": stride,
        "samples": [float(v) for v in flat[::stride][:32]],
    }


def processor_cases(images: list[str]) -> tuple[list[dict], dict]:
    cases = []
    batch = {}
    for config in CONFIGS:
        image_processor = Idefics3ImageProcessorPil.from_pretrained(OUT / config)
        image_seq_len = CONFIGS[config][1]["image_seq_len"]
        processor = Idefics3Processor(image_processor, tiny_tokenizer(), image_seq_len=image_seq_len)
        for name in images:
            out = image_processor(
                images=[Image.open(OUT / name)], return_tensors="np", return_row_col_info=True
            )
            rows, cols = out["rows"][0][0], out["cols"][0][0]
            prompt = processor.replace_image_token({"rows": [[rows]], "cols": [[cols]]}, 0)
            mask = out["pixel_attention_mask"]
            assert mask.all(), f"{config} {name}: Idefics3 tiles are never padded"
            # Long prompts (SmolVLM's 64 <image> a tile) are kept as their sha256.
            text = {"prompt": prompt} if len(prompt) <= 2000 else {"prompt_sha256": sha256_text(prompt)}
            cases.append(
                {"image": name, "config": config, "rows": rows, "cols": cols}
                | text
                | pixel_record(out["pixel_values"])
            )
            print(config, name, cases[-1]["shape"], rows, cols, file=sys.stderr)
        if config == "small":
            pair = ["rgb.png", "palette.gif"]
            out = image_processor(images=[Image.open(OUT / n) for n in pair], return_tensors="np")
            batch = {"images": pair, "config": config} | pixel_record(out["pixel_values"])
    return cases, batch


def decoded(images: list[str], progressive: bool = False) -> dict:
    """Per image: Pillow's mode and size (and, with ``progressive``, whether a JPEG is), and the
    sha256 of what decoding must give."""
    out = {}
    for name in images:
        im = Image.open(OUT / name)
        rgb = np.ascontiguousarray(convert_to_rgb(im, return_numpy=True))
        out[name] = {"mode": im.mode, "width": im.width, "height": im.height}
        if progressive:
            out[name]["progressive"] = bool(im.info.get("progressive"))
        out[name]["rgb_sha256"] = hashlib.sha256(rgb.tobytes()).hexdigest()
        if name.endswith(".jpg") and not progressive:
            out[name]["pil_rgb"] = f"{name}.pil.png"
    return out


def resample_cases(count: int = 240) -> list[dict]:
    rng = random.Random(67)
    filters = [
        Image.Resampling.LANCZOS,
        Image.Resampling.BILINEAR,
        Image.Resampling.BICUBIC,
        Image.Resampling.BOX,
        Image.Resampling.HAMMING,
    ]
    sizes = [(1, 1, 9, 7), (9, 7, 1, 1), (64, 3, 5, 3), (3, 64, 3, 200), (50, 50, 50, 17), (17, 50, 40, 50)]
    cases = []
    for i in range(count):
        if i < len(sizes) * len(filters):
            in_w, in_h, out_w, out_h = sizes[i // len(filters)]
            resample = filters[i % len(filters)]
        else:
            in_w, in_h = rng.randint(1, 90), rng.randint(1, 90)
            out_w, out_h = rng.randint(1, 180), rng.randint(1, 180)
            resample = rng.choice(filters)
        name = f"resample-{i}"
        src = hashed_bytes(name, in_w * in_h * 3).reshape(in_h, in_w, 3)
        out = np.asarray(Image.fromarray(src, "RGB").resize((out_w, out_h), resample=resample))
        cases.append(
            {
                "name": name,
                "input": [in_w, in_h],
                "output": [out_w, out_h],
                "resample": int(resample),
                "sha256": hashlib.sha256(out.tobytes()).hexdigest(),
                "first": out.reshape(-1)[:6].tolist(),
            }
        )
    return cases


def write_vl_images() -> list[str]:
    """Two more images for Gemma 3 and Qwen2-VL: a tiny one (Qwen2-VL scales it up to
    ``min_pixels``) and a very wide one (Gemma 3 pan-and-scan cuts it into crops)."""
    Image.fromarray(smooth("tiny", 3, 2, 3), "RGB").save(OUT / "tiny.png")
    Image.fromarray(smooth("wide", 24, 260, 3), "RGB").save(OUT / "wide.png")
    return ["tiny.png", "wide.png"]


def tokenizer_from(tokenizer_config: dict) -> PreTrainedTokenizerFast:
    """A one-word tokenizer loaded with ``tokenizer_config`` the way ``from_pretrained`` reads it, so
    its image tokens are what transformers makes of that file."""
    with tempfile.TemporaryDirectory() as d:
        Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")).save(f"{d}/tokenizer.json")
        config = tokenizer_config | {"tokenizer_class": "PreTrainedTokenizerFast"}
        Path(d, "tokenizer_config.json").write_text(json.dumps(config))
        tokenizer = AutoTokenizer.from_pretrained(d)
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    return tokenizer


def prompt_record(prompt: str) -> dict:
    return {"prompt": prompt} if len(prompt) <= 2000 else {"prompt_sha256": sha256_text(prompt)}


def gemma3_cases(images: list[str]) -> list[dict]:
    """The image processor called as ``Gemma3Processor`` calls it: its ``images_kwargs`` (RGB, and the
    pan-and-scan settings) stand in for the config's nulls. ``Gemma3Processor`` passes those defaults
    over the config's own values; lmplex reads the config's, so ``gemma3_pan`` calls the image
    processor directly with them."""
    cases = []
    for config, (pre, proc, tok) in GEMMA3_CONFIGS.items():
        image_processor = Gemma3ImageProcessorPil.from_pretrained(OUT / config)
        processor = Gemma3Processor(
            image_processor, tokenizer_from(tok), image_seq_length=proc["image_seq_length"]
        )
        kwargs: dict[str, Any] = {
            k: v if pre.get(k) is None else pre[k] for k, v in Gemma3Processor.images_kwargs.items()
        }
        for name in images:
            image: Image.Image = Image.open(OUT / name)
            out = image_processor(images=[image], return_tensors="np", **kwargs)
            if not kwargs["do_pan_and_scan"]:
                # The whole processor, on a prompt with the image's placeholder, gives the same pixels.
                whole = processor(images=[image], text=[f"x {processor.boi_token} y"], return_tensors="np")
                assert np.array_equal(whole["pixel_values"], out["pixel_values"]), f"{config} {name}"
            num_crops = int(out["num_crops"][0])
            prompt = processor.replace_image_token({"num_crops": [num_crops]}, 0)
            cases.append(
                {"image": name, "config": config, "num_crops": num_crops}
                | prompt_record(prompt)
                | pixel_record(out["pixel_values"])
            )
            print(config, name, cases[-1]["shape"], num_crops, file=sys.stderr)
    return cases


def crop_boxes(height: int, width: int, min_crop_size: int, max_num_crops: int, min_ratio: float) -> list:
    """``Gemma3ImageProcessorPil.pan_and_scan``'s crops of a ``height x width`` image, as
    ``[x, y, width, height]`` (the position is the crop view's offset into the image)."""
    image = np.zeros((1, height, width), dtype=np.uint8)
    base = image.__array_interface__["data"][0]
    crops = Gemma3ImageProcessorPil().pan_and_scan(image, min_crop_size, max_num_crops, min_ratio)
    boxes = []
    for crop in crops:
        y, x = divmod(crop.__array_interface__["data"][0] - base, width)
        boxes.append([x, y, crop.shape[2], crop.shape[1]])
    return boxes


def random_sizes(name: str, count: int, largest: int) -> list[tuple[int, int]]:
    """Edge sizes, then ``count`` random ones, log-uniform up to ``largest`` a side."""
    rng = random.Random(name)
    sizes = [(1, 1), (1, 200), (200, 1), (1, 201), (201, 1), (2, 401), (28, 28), (27, 29), (14, 14), (42, 70)]

    def side() -> int:
        return int(math.exp(rng.uniform(0, math.log(largest))))

    return sizes + [(side(), side()) for _ in range(count)]


def pan_and_scan_cases() -> list[dict]:
    """Crop boxes for random sizes, with ``Gemma3Processor``'s defaults and with ``gemma3_pan``'s."""
    settings = [(256, 4, 1.2), (16, 3, 1.2), (100, 10, 2.5)]
    return [
        {
            "min_crop_size": size,
            "max_num_crops": crops,
            "min_ratio_to_activate": ratio,
            "cases": [
                [h, w, crop_boxes(h, w, size, crops, ratio)] for h, w in random_sizes(f"pas{size}", 150, 4000)
            ],
        }
        for size, crops, ratio in settings
    ]


def qwen2vl_processors(config: str) -> tuple[Qwen2VLImageProcessorPil, Qwen2VLProcessor]:
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(OUT / config)
    tokenizer = tokenizer_from(QWEN2VL_CONFIGS[config][1])
    # Qwen2VLProcessor's __init__ wants a video processor (torchvision); replace_image_token needs only
    # these two attributes, set as __init__ sets them.
    processor = Qwen2VLProcessor.__new__(Qwen2VLProcessor)
    processor.image_processor = image_processor
    processor.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
    return image_processor, processor


def qwen2vl_cases(images: list[str]) -> tuple[list[dict], list[dict]]:
    cases = []
    sizes = []
    for config in QWEN2VL_CONFIGS:
        image_processor, processor = qwen2vl_processors(config)
        for name in images:
            image: Image.Image = Image.open(OUT / name)
            out = image_processor(images=[image], return_tensors="np")
            grid = [int(v) for v in out["image_grid_thw"][0]]
            prompt = processor.replace_image_token(dict(out), 0)
            tile_len = out["pixel_values"].shape[1] * image_processor.merge_size**2
            cases.append(
                {"image": name, "config": config, "grid_thw": grid}
                | prompt_record(prompt)
                | pixel_record(out["pixel_values"], tile_len)
            )
            print(config, name, cases[-1]["shape"], grid, file=sys.stderr)
        min_pixels, max_pixels = image_processor.size["shortest_edge"], image_processor.size["longest_edge"]
        factor = image_processor.patch_size * image_processor.merge_size
        resized, refused = [], []
        for h, w in random_sizes(config, 200, 20000):
            try:
                resized.append([h, w, *smart_resize(h, w, factor, min_pixels, max_pixels)])
            except ValueError:
                refused.append([h, w])
        sizes.append({"config": config, "resized": resized, "refused": refused})
    return cases, sizes


def write_jpeg_images() -> list[str]:
    """Small JPEGs, one per encoder setting that changes the decoder's path, under ``jpeg/``."""
    (OUT / "jpeg").mkdir(parents=True, exist_ok=True)

    def rgb(name: str, height: int = 27, width: int = 37) -> Image.Image:
        return Image.fromarray(smooth(name, height, width, 3, noise=40), "RGB")

    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90; Image.open (and lmplex) leave the pixels as stored
    saturated = ((hashed_bytes("saturated", 24 * 40 * 3) > 127) * 255).astype(np.uint8).reshape(24, 40, 3)
    files: dict[str, tuple[Image.Image, dict[str, Any]]] = {
        "s444.jpg": (rgb("s444"), {"subsampling": 0}),
        "s422.jpg": (rgb("s422"), {"subsampling": 1}),
        "s420_odd.jpg": (rgb("s420", 19, 33), {"subsampling": 2}),
        "one_row.jpg": (rgb("one_row", 1, 5), {}),
        "gray.jpg": (Image.fromarray(smooth("gray_jpeg", 27, 37, 1)[..., 0], "L"), {}),
        "progressive.jpg": (rgb("progressive"), {"progressive": True}),
        "cmyk_progressive.jpg": (
            Image.fromarray(smooth("cmyk_progressive", 21, 30, 4), "CMYK"),
            {"progressive": True},
        ),
        "restart.jpg": (rgb("restart"), {"restart_marker_blocks": 1}),
        "optimized.jpg": (rgb("optimized"), {"optimize": True}),
        "q50.jpg": (rgb("quality"), {"quality": 50}),
        "q95.jpg": (rgb("quality"), {"quality": 95}),
        "exif.jpg": (rgb("exif", 20, 30), {"exif": exif.tobytes()}),
        "saturated.jpg": (Image.fromarray(saturated, "RGB"), {"quality": 70}),
    }
    for name, (image, options) in files.items():
        image.save(OUT / "jpeg" / name, **({"quality": 90} | options))
    return [f"jpeg/{name}" for name in files]


def main() -> None:
    images = write_images()
    decode_only = write_decode_only_images()
    write_configs()
    cases, batch = processor_cases(images)
    versions = {"transformers": transformers.__version__, "pillow": PIL.__version__, "numpy": np.__version__}
    fixture = versions | {"images": decoded(images + decode_only), "cases": cases, "batch": batch}
    (OUT / "idefics3.json").write_text(dumps(fixture))
    (OUT / "resample.json").write_text(dumps(versions | {"cases": resample_cases()}))
    vl_images = images + write_vl_images()
    gemma3 = {"cases": gemma3_cases(vl_images), "pan_and_scan": pan_and_scan_cases()}
    (OUT / "gemma3.json").write_text(dumps(versions | gemma3))
    cases, sizes = qwen2vl_cases(vl_images)
    (OUT / "qwen2vl.json").write_text(dumps(versions | {"cases": cases, "sizes": sizes}))
    jpegs = write_jpeg_images()
    (OUT / "jpeg.json").write_text(dumps(versions | {"images": decoded(jpegs, progressive=True)}))


def dumps(fixture: dict) -> str:
    """JSON with one line per top-level key, per image and per case."""
    lines = []
    for key, value in fixture.items():
        if isinstance(value, list):
            items = ",\n".join("  " + json.dumps(v) for v in value)
            lines.append(f"{json.dumps(key)}: [\n{items}\n]")
        elif isinstance(value, dict) and key == "images":
            items = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items())
            lines.append(f"{json.dumps(key)}: {{\n{items}\n}}")
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


if __name__ == "__main__":
    main()

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
  the Rust test rebuilds each input with ``hashed_bytes`` and compares the sha256 of the output.

The processor is ``Idefics3ImageProcessorPil`` by name, so the reference does not depend on
whether torchvision is installed.
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import PIL
import transformers
from numpy.typing import NDArray
from PIL import Image
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast
from transformers.image_transforms import convert_to_rgb
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

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
            # libjpeg-turbo's decoding, kept losslessly: lmplex decodes JPEGs with zune-jpeg, whose
            # IDCT and chroma upsampling round differently, so its tests compare within a bound and
            # check the processor on these bytes.
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
    for name, (pre, proc) in CONFIGS.items():
        d = OUT / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n")
        (d / "processor_config.json").write_text(json.dumps(proc, indent=2) + "\n")


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A one-word tokenizer: ``Idefics3Processor`` needs one, its prompt text does not."""
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")))


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def pixel_record(pixel_values: NDArray[np.float32]) -> dict:
    """The sha256 of the whole, and for finding a difference: each tile's sha256 (16 hex digits)
    and 32 values at an even stride."""
    values = np.ascontiguousarray(pixel_values, dtype="<f4")
    flat = values.reshape(-1)
    stride = max(1, flat.size // 32)
    return {
        "shape": list(values.shape),
        "sha256": hashlib.sha256(values.tobytes()).hexdigest(),
        "first": [float(v) for v in flat[:8]],
        "tile_sha256": [
            hashlib.sha256(t.tobytes()).hexdigest()[:16] for t in values.reshape(-1, *values.shape[-3:])
        ],
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


def decoded(images: list[str]) -> dict:
    out = {}
    for name in images:
        im = Image.open(OUT / name)
        rgb = np.ascontiguousarray(convert_to_rgb(im, return_numpy=True))
        out[name] = {
            "mode": im.mode,
            "width": im.width,
            "height": im.height,
            "rgb_sha256": hashlib.sha256(rgb.tobytes()).hexdigest(),
        }
        if name.endswith(".jpg"):
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


def main() -> None:
    images = write_images()
    decode_only = write_decode_only_images()
    write_configs()
    cases, batch = processor_cases(images)
    versions = {"transformers": transformers.__version__, "pillow": PIL.__version__, "numpy": np.__version__}
    fixture = versions | {"images": decoded(images + decode_only), "cases": cases, "batch": batch}
    (OUT / "idefics3.json").write_text(dumps(fixture))
    (OUT / "resample.json").write_text(dumps(versions | {"cases": resample_cases()}))


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

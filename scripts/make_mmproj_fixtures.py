#!/usr/bin/env python3
"""Make llama.cpp "mmproj" GGUF files of tiny vision-language models, with llama.cpp's own converter,
and transformers' image features for the same weights.

Not run by CI: it needs torch and transformers (a multi-GB install) and llama.cpp's converter. CI
checks lmplex's mmproj loader against what this script writes. Run it in a separate environment,
as ``make_vlm_fixtures.py``:

    python3 -m venv /tmp/hf
    /tmp/hf/bin/pip install torch transformers pillow numpy safetensors sentencepiece
    /tmp/hf/bin/python scripts/make_mmproj_fixtures.py [--llama-cpp DIR] [--cache DIR]

The oracle for the file format is llama.cpp itself: the script never writes GGUF.
``llama_cpp_converter.py`` gets llama.cpp's ``convert_hf_to_gguf.py`` from the pinned sdist of
``llama-cpp-python==0.3.36`` (downloaded into ``--cache``, default ``~/.cache/lmplex-mmproj``, its sha256
checked, unless ``--llama-cpp`` names an extracted ``vendor/llama.cpp``), runs it with its own
``gguf-py`` and reads the files back with that ``gguf-py``'s ``GGUFReader``.

Per family of ``mmproj_families.py`` (``FAMILIES``: Idefics3, Gemma 3, Qwen2-VL, Qwen2.5-VL; there,
what each tiny model is and why, given what the converter can map), a tiny
``ForConditionalGeneration`` with every parameter overwritten by ``hashed_values``
(``tests/hashed.py``, by the parameter's name in ``named_parameters``) is saved with
``save_pretrained`` (the Hub's tensor names, but for Gemma 3's tower: transformers 5 saves it as
``vision_tower.embeddings...``, renamed here ``vision_tower.vision_model.embeddings...`` as the
Hub's checkpoints have it, which the converter maps) into ``tiny-<family>``, beside a
``preprocessor_config.json`` and ``processor_config.json`` as the Hub's checkpoints hold them, and
converted with ``convert_hf_to_gguf.py <folder> --mmproj --outtype f32 --outfile
tests/fixtures/vision/<family>.mmproj.gguf``.

``tests/fixtures/vision/mmproj.json`` holds the converter's provenance and, per family: the
``config.json`` and processor configs the converter read, the GGUF's metadata and tensors (name,
GGML type, ``ne`` as gguf-py reports it, and which HF tensor each came from and how, found by
comparing the values), the HF tensors' hashing recipe, and transformers' ``get_image_features``
(float32, eager, CPU) for inputs from ``hashed_values("pixel_values", n, 1/sqrt(3), 0)`` (uniform in
[-1, 1)): images ``[N, 3, H, W]`` for Idefics3 and Gemma 3, patch rows ``[rows, 3 * 2 * 14 * 14]``
with ``image_grid_thw`` for Qwen. Every GGUF tensor is the HF tensor's float32 bits except Gemma 3's
``mm.input_projection.weight``, which llama.cpp always stores as float16: Gemma 3's entry also has
the features with that weight rounded to float16 (``image_features_gguf_weights``), what a loader
of the GGUF must give.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from hashed import hashed_values

sys.path.insert(0, str(ROOT / "scripts"))
from llama_cpp_converter import Tensor, convert, llama_cpp_dir, provenance, read_gguf, sha256_of
from mmproj_families import FAMILIES, PROCESSOR

OUT = ROOT / "tests" / "fixtures" / "vision"
CONVERT_ARGS = ("--mmproj", "--outtype", "f32")
# The conversion/ modules of llama.cpp that convert these families (their sha256 go in the fixture).
CONVERSION_MODULES = ("base", "gemma", "qwenvl", "smolvlm")


def hub_names(path: Path) -> None:
    """Rename transformers 5's saved Gemma 3 tower (``vision_tower.embeddings...``) as the Hub's
    checkpoints name it (``vision_tower.vision_model.embeddings...``), which the converter maps."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path))
    renamed = {re.sub(r"^vision_tower\.", "vision_tower.vision_model.", k): v for k, v in tensors.items()}
    save_file(renamed, str(path), metadata={"format": "pt"})


def sources(gtensor: Tensor, hf: dict[str, Any]) -> list[dict[str, Any]]:
    """The HF tensors (and how) whose values the GGUF tensor holds exactly: as is, as float16,
    plus one, a third of the first axis (q, k, v of a fused qkv) or one frame of a Conv3d."""
    import numpy as np

    g = np.asarray(gtensor.data)
    found = []
    for key, h in hf.items():
        cands: list[tuple[str, Any]] = [("identity", h), ("plus_one", h + np.float32(1))]
        if h.ndim >= 1 and h.shape[0] % 3 == 0:
            c = h.shape[0] // 3
            cands += [(f"rows[{i * c}:{(i + 1) * c}]", h[i * c : (i + 1) * c]) for i in range(3)]
        if h.ndim == 5:
            cands += [(f"[:, :, {t}]", h[:, :, t]) for t in range(h.shape[2])]
        for how, v in cands:
            if v.shape != g.shape:
                continue
            if g.dtype == np.float16:
                if np.array_equal(g, v.astype(np.float16)):
                    found.append({"hf": key, "transform": how, "cast": "f16"})
            elif np.array_equal(g, v):
                found.append({"hf": key, "transform": how})
    return found


def matched_tensors(path: Path, tensors: list[Tensor], hf: dict[str, Any]) -> list[dict[str, Any]]:
    """The GGUF's tensors (name, type, ne) and the one HF tensor each comes from (``sources``)."""
    matched = []
    for t in tensors:
        found = sources(t, hf)
        if len(found) != 1:
            raise SystemExit(f"{path.name}: {t.name} comes from {len(found)} HF tensors: {found}")
        matched.append({"name": t.name, "type": t.type, "ne": t.ne, "from": found[0]})
    return matched


def make(family: str, llama_cpp: Path, work: Path) -> dict[str, Any]:
    import numpy as np
    from safetensors.numpy import load_file

    build, preprocessor, note = FAMILIES[family]
    model, recipes, inputs = build()
    folder = work / f"tiny-{family}"
    model.save_pretrained(folder)
    if family == "gemma3":
        hub_names(folder / "model.safetensors")
    (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2) + "\n")
    processor = PROCESSOR.get(family)
    if processor is not None:
        (folder / "processor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    out = OUT / f"{family}.mmproj.gguf"
    convert(llama_cpp, folder, out, CONVERT_ARGS, cwd=work, label=family)

    saved = load_file(str(folder / "model.safetensors"))
    hf = {k: np.asarray(v) for k, v in saved.items()}
    metadata, gtensors = read_gguf(llama_cpp, out)
    tensors = matched_tensors(out, gtensors, hf)
    # The hashing recipe of each HF tensor a GGUF tensor comes from, by its saved (Hub) name.
    by_values = {}
    for pname, r in recipes.items():
        v = hashed_values(pname, int(np.prod(r["shape"])), r["std"], r["mean"]).reshape(r["shape"])
        by_values[pname] = v
    used = sorted({t["from"]["hf"] for t in tensors})
    hf_tensors = []
    for key in used:
        match = [p for p, v in by_values.items() if v.shape == hf[key].shape and np.array_equal(v, hf[key])]
        assert len(match) == 1, (key, match)
        hf_tensors.append({"saved_as": key, **recipes[match[0]]})
    return {
        "model": family,
        "note": note,
        "gguf": str(out.relative_to(ROOT)),
        "gguf_bytes": out.stat().st_size,
        "gguf_sha256": sha256_of(out),
        "config_json": json.loads((folder / "config.json").read_text()),
        "preprocessor_config": preprocessor,
        "processor_config": processor,
        "metadata": metadata,
        "tensors": tensors,
        "hf_tensors": hf_tensors,
        **inputs,
    }


def summary(entry: dict[str, Any]) -> str:
    lines = [f"{entry['gguf']}: {entry['gguf_bytes']} bytes, {len(entry['tensors'])} tensors"]
    for m in entry["metadata"]:
        v = m["value"]
        if isinstance(v, list) and len(v) > 8:
            v = f"[{len(v)} values]"
        lines.append(f"  {m['key']} ({m['type']}) = {v}")
    for t in entry["tensors"]:
        f = t["from"]
        how = f["transform"] + (f", {f['cast']}" if "cast" in f else "")
        lines.append(f"  {t['name']:28} {t['type']:4} ne={t['ne']}  <- {f['hf']} ({how})")
    feats = entry["image_features"][0]
    scale = max(abs(x) for x in feats["values"])
    lines.append(f"  image_features {feats['shape']} (max |x| {scale:.3f})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="Make llama.cpp mmproj GGUF fixtures and their features.")
    parser.add_argument("--llama-cpp", type=Path, help="an extracted vendor/llama.cpp of the sdist")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lmplex-mmproj",
        help="where the sdist is downloaded and extracted",
    )
    parser.add_argument("--family", action="append", choices=list(FAMILIES), help="only these (repeatable)")
    args = parser.parse_args()

    import torch
    import transformers as T

    llama_cpp = llama_cpp_dir(args.llama_cpp, args.cache)

    families = args.family or list(FAMILIES)
    path = OUT / "mmproj.json"
    entries: dict[str, Any] = {}
    if args.family and path.is_file():
        entries = json.loads(path.read_text())["families"]
    with tempfile.TemporaryDirectory() as d:
        for family in families:
            entries[family] = make(family, llama_cpp, Path(d))
            print(summary(entries[family]), file=sys.stderr)
    fixture = {
        "converter": {
            **provenance(llama_cpp, CONVERSION_MODULES),
            "command": f"convert_hf_to_gguf.py <folder> {' '.join(CONVERT_ARGS)} --outfile <family>.mmproj.gguf",
            "families": list(FAMILIES),
        },
        "oracle": f"transformers {T.__version__}, torch {torch.__version__}, float32, eager, CPU",
        "python": platform.python_version(),
        "families": {f: entries[f] for f in FAMILIES if f in entries},
    }
    OUT.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fixture, indent=None, separators=(",", ":")) + "\n")
    print(f"-> {path.relative_to(ROOT)} ({path.stat().st_size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()

"""A vision tower from a llama.cpp multimodal projector file (``ModelConfig(mmproj=...)``, llama-server's
``--mmproj``), from Python and the ``lmplex serve`` flag.

The text model is the tiny Idefics3 of ``tests/fixtures/vision/idefics3.json`` written as a folder with
no vision tensor and no processor config; the tower and the image settings come from
``tests/fixtures/vision/idefics3.mmproj.gguf``, which llama.cpp's own converter made of the same tower
(``scripts/make_mmproj_fixtures.py``). One image turn gives transformers' greedy tokens.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest
import tomllib
from hashed import hashed_values

import lmplex
from lmplex import InvalidRequest, SamplingParams, serve

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).parent.parent
FIXTURE: dict[str, Any] = json.loads((FIXTURES / "vision" / "idefics3.json").read_text())
CHAT = FIXTURE["chat"]
MMPROJ = FIXTURES / "vision" / "idefics3.mmproj.gguf"


@pytest.fixture(scope="module")
def text_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture's text model alone: its config, tokenizer, template and text weights."""
    from safetensors.numpy import save_file

    folder = tmp_path_factory.mktemp("mmproj") / "tiny-idefics3-text"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(FIXTURE["config_json"]))
    (folder / "tokenizer.json").write_text(json.dumps(CHAT["tokenizer_json"]))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT["chat_template"]}))
    tensors = {
        t["name"]: hashed_values(t["name"], math.prod(t["shape"]), t["std"], t["mean"]).reshape(t["shape"])
        for t in FIXTURE["tensors"]
        if "vision_model" not in t["name"] and "connector" not in t["name"]
    }
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_an_mmproj_gives_a_text_model_its_images(text_folder: Path) -> None:
    config = lmplex.ModelConfig(str(text_folder), device="cpu", mmproj=str(MMPROJ))
    assert config.mmproj == str(MMPROJ)
    assert lmplex.ModelConfig(str(text_folder)).mmproj is None
    engine = lmplex.Engine(config)
    content = [
        {"type": "image", "image": ROOT / CHAT["image"]},
        {"type": "text", "text": CHAT["messages_text"]},
    ]
    params = SamplingParams(temperature=0, max_tokens=len(CHAT["generated"]), ignore_eos=True)
    (out,) = engine.generate([[{"role": "user", "content": content}]], params)
    assert out.token_ids == CHAT["generated"]


def test_a_missing_or_wrong_mmproj_fails_the_load(text_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(lmplex.ModelLoadError, match="nothing.gguf"):
        lmplex.Engine(
            lmplex.ModelConfig(str(text_folder), device="cpu", mmproj=str(tmp_path / "nothing.gguf"))
        )
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf")
    with pytest.raises(lmplex.ModelLoadError, match="not a GGUF"):
        lmplex.Engine(lmplex.ModelConfig(str(text_folder), device="cpu", mmproj=str(junk)))


def test_the_serve_flag_gives_one_model_its_mmproj(
    text_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    monkeypatch.chdir(MMPROJ.parent)
    toml = serve.config_toml(parser.parse_args(["serve", str(text_folder), "--mmproj", MMPROJ.name]))
    assert tomllib.loads(toml)["models"][0]["mmproj"] == str(MMPROJ.resolve()), toml
    two = parser.parse_args(["serve", str(text_folder), str(text_folder), "--mmproj", MMPROJ.name])
    with pytest.raises(InvalidRequest, match="--mmproj"):
        serve.config_toml(two)

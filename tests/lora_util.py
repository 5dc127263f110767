"""The PEFT adapters of SmolLM2-135M that ``scripts/make_lora_model_fixture.py`` describes
(``fixtures/lora_smollm2-135m-instruct.json``: names, configs, shapes), rebuilt bit for bit from their
tensors' names (``hashed.py``), for every test that serves an adapter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hashed import hashed_values
from safetensors.numpy import save_file

FIXTURE = Path(__file__).parent / "fixtures" / "lora_smollm2-135m-instruct.json"


def fixture() -> dict[str, Any]:
    """The fixture: the adapters, the prompts and transformers + PEFT's tokens and log-probs."""
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    return data


def prod(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def write_adapter(folder: Path, adapter: dict[str, Any]) -> str:
    """The fixture's adapter as a PEFT folder: its config and its regenerated matrices."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(adapter["adapter_config"]))
    tensors = {
        t["name"]: hashed_values(t["name"], prod(t["shape"]), t["std"], 0.0).reshape(t["shape"])
        for t in adapter["tensors"]
    }
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return str(folder)


def write_adapters(root: Path) -> dict[str, str]:
    """Every adapter of the fixture as a folder under ``root``, by name."""
    return {a["name"]: write_adapter(root / a["name"], a) for a in fixture()["adapters"]}

"""LoRA adapters on CUDA (``LMPLEX_CUDA_LORA=1``; off by default until this passes on a device):
SmolLM2-135M under two of the fixture's PEFT adapters (``lora_util``) and the base gives the CPU
backend's first 8 greedy tokens of chat prompts (Q4_1 weights multiplied in bfloat16 on CUDA and
float32 on the CPU: tokens only, with ``test_engine_gpu.py``'s near-tie rule), and the adapters' device
pool shows in ``memory()``. Skips as the other engine tests do without a device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lora_util
import pytest

import lmplex
from lmplex import ModelConfig

from .test_engine_gpu import BF16_NEAR_TIE, compare_greedy, cuda_engine, greedy, lmplex_steps

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Name three colors."}],
]


def test_adapters_on_cuda_match_the_cpu_backend(
    torch: Any, smollm2_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fixture = lora_util.fixture()
    adapters = {a["name"]: lora_util.write_adapter(tmp_path / a["name"], a) for a in fixture["adapters"][:2]}
    cpu = lmplex.Engine(ModelConfig(smollm2_path, lora_modules=adapters))
    monkeypatch.setenv("LMPLEX_CUDA_LORA", "1")
    gpu = cuda_engine(smollm2_path, "auto", max_model_len=2048, lora_modules=adapters)
    assert gpu.info.device == "cuda"
    for lora in [None, *adapters]:
        mine, theirs = gpu.generate(CHATS, greedy(8), lora=lora), cpu.generate(CHATS, greedy(8), lora=lora)
        for m, t in zip(mine, theirs):
            compare_greedy(lmplex_steps(m), lmplex_steps(t), None, BF16_NEAR_TIE)
    assert gpu.memory().lora_adapters > 0

#!/usr/bin/env python3
"""Make LoRA reference logits with transformers + PEFT on tiny models of several families.

Not run by CI: it needs torch, transformers and peft. CI checks lmplex against the fixtures this
script writes (``crates/lmplex-model/tests/lora.rs``). Run it in a separate environment:

    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install torch transformers peft numpy
    /tmp/refenv/bin/python scripts/make_lora_fixtures.py

Each family's base is a tiny model built as ``make_family_fixtures.py`` builds it (weights from
``hashed_values``). Each adapter is made by PEFT's ``get_peft_model`` with its config below, then
every LoRA matrix (B too, which PEFT starts at zero) is overwritten with ``hashed_values`` of the
name PEFT saves it under, so the Rust test rebuilds the adapter folder bit for bit. The adapters
cover ranks 2-8, alpha != r, rsLoRA, ``rank_pattern``/``alpha_pattern``, every projection,
Phi-3's fused ``qkv_proj``/``gate_up_proj``, and Gemma, Gemma 3, Mistral (a window) and Mixtral (the
attention of a mixture of experts). Each case records the base's and every adapter's
logits after the prompt and after each greedy step (float32, eager attention, CPU).
"""

from __future__ import annotations

import copy
import json
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_family_fixtures import LONG_PROMPT, SHAPE, hashed_values, init_for, run_case
from make_family_fixtures import families as base_families

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "lora"
LORA_STD = 0.1
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PHI3_ALL = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]


def adapters(phi3: bool, moe: bool) -> dict[str, dict[str, Any]]:
    """Adapter name -> PEFT LoraConfig fields (attention only on a mixture of experts, whose experts
    lmplex does not adapt)."""
    if moe:
        return {
            "qv": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]},
            "attn": {
                "r": 4,
                "lora_alpha": 6,
                "use_rslora": True,
                "target_modules": ALL[:4],
                "alpha_pattern": {"o_proj": 3},
            },
        }
    return {
        "qv": {"r": 8, "lora_alpha": 16, "target_modules": ["qkv_proj"] if phi3 else ["q_proj", "v_proj"]},
        "all": {
            "r": 4,
            "lora_alpha": 6,
            "use_rslora": True,
            "target_modules": PHI3_ALL if phi3 else ALL,
            "rank_pattern": {"down_proj": 2},
            "alpha_pattern": {"o_proj": 3},
        },
        "mlp": {"r": 6, "lora_alpha": 3, "target_modules": PHI3_ALL[2:] if phi3 else ALL[4:]},
    }


def fill_lora(torch: Any, model: Any, std: float) -> list[dict[str, Any]]:
    """Overwrites every LoRA matrix of the PEFT ``model`` with ``hashed_values`` of the name PEFT saves
    it under (B too, which PEFT starts at zero); returns the fixture's tensor list."""
    tensors = []
    for pname, param in model.named_parameters():
        if ".lora_" not in pname:
            continue
        saved = pname.replace(".default", "")
        values = hashed_values(saved, param.numel(), std, 0.0).reshape(tuple(param.shape))
        with torch.no_grad():
            param.copy_(torch.from_numpy(values))
        tensors.append({"name": saved, "shape": list(param.shape), "std": std, "mean": 0.0})
    return tensors


def families(T: Any) -> dict[str, dict[str, Any]]:
    """The plain families, then Gemma (GeGLU, offset norms, scaled embeddings), Gemma 3 (q/k norms,
    sliding layers), Mistral (a window) and Mixtral (experts) as ``make_family_fixtures.py`` builds them."""
    made = base_families(T)
    return {
        "llama": {"config": T.LlamaConfig, "fields": {}},
        "qwen2": {"config": T.Qwen2Config, "fields": {}},
        "qwen3": {"config": T.Qwen3Config, "fields": {}},
        "phi3": {"config": T.Phi3Config, "fields": {"max_position_embeddings": 256}},
        **{name: made[name] for name in ("gemma", "gemma3", "mistral_window", "mixtral")},
    }


def main() -> None:
    import peft
    import torch
    import transformers as T
    from safetensors import safe_open

    torch.manual_seed(0)
    case = {"prompt": LONG_PROMPT, "steps": 6, "max_model_len": 64}
    for name, fam in families(T).items():
        config = fam["config"](**{**SHAPE, **fam["fields"]})
        config._attn_implementation = "eager"
        base = T.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        base.eval()
        tensors = []
        for pname, param in base.named_parameters():
            std, mean = init_for(pname, "gemma" in name)
            values = hashed_values(pname, param.numel(), std, mean).reshape(tuple(param.shape))
            with torch.no_grad():
                param.copy_(torch.from_numpy(values))
            tensors.append({"name": pname, "shape": list(param.shape), "std": std, "mean": mean})
        base_out = run_case(torch, base, case)
        made = []
        moe = getattr(config, "num_experts_per_tok", None) is not None
        for aname, fields in adapters(name == "phi3", moe).items():
            cfg = peft.LoraConfig(**fields, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
            model = peft.get_peft_model(copy.deepcopy(base), cfg)
            model.eval()
            lora_tensors = fill_lora(torch, model, LORA_STD)
            with tempfile.TemporaryDirectory() as saved_dir:
                model.save_pretrained(saved_dir)
                adapter_config = json.loads((Path(saved_dir) / "adapter_config.json").read_text())
                names = sorted(safe_open(str(Path(saved_dir) / "adapter_model.safetensors"), "np").keys())
            if names != sorted(t["name"] for t in lora_tensors):
                raise SystemExit(f"{name}/{aname}: PEFT saved {names}")
            out = run_case(torch, model, case)
            made.append(
                {"name": aname, "adapter_config": adapter_config, "tensors": lora_tensors, "outputs": out}
            )
            tokens = [o["next"] for o in out]
            print(f"{name}/{aname}: {tokens}", file=sys.stderr)
        fixture = {
            "family": name,
            "oracle": f"transformers {T.__version__}, peft {peft.__version__}, torch {torch.__version__}, "
            "float32, eager, CPU",
            "python": platform.python_version(),
            "config": json.loads(config.to_json_string()),
            "tensors": tensors,
            "case": {**case, "outputs": base_out},
            "adapters": made,
        }
        OUT.mkdir(parents=True, exist_ok=True)
        path = OUT / f"{name}.json"
        path.write_text(json.dumps(fixture, indent=None, separators=(",", ":")) + "\n")
        print(f"{name}: base {[o['next'] for o in base_out]} -> {path.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()

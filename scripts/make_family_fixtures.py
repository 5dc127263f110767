#!/usr/bin/env python3
"""Make per-family reference logits with Hugging Face transformers' own model classes.

Not run by CI: it needs torch and transformers (a multi-GB install). CI checks lmplex against the
fixtures this script writes (``crates/lmplex-model/tests/hf_families.rs``). Run it in a separate
environment:

    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install torch transformers numpy
    /tmp/refenv/bin/python scripts/make_family_fixtures.py            # every family
    /tmp/refenv/bin/python scripts/make_family_fixtures.py gemma2     # one

For each family a tiny model is built from its transformers config class (``FAMILIES`` below), and
every parameter is overwritten with values from ``hashed_values`` (murmur3's finalizer over the
tensor name's FNV-1a hash and the element index), which the Rust test reproduces bit for bit: no
weights are stored, only the config, the tensor list and the oracle's outputs. Each case runs the
prompt through the model (eager attention, float32, CPU), then feeds the greedy token for
``steps`` steps, and records the last position's logits after the prompt and after each step.
Windows, soft-caps and LongRoPE are sized so that the short prompts exercise them; the MoE
families have 4 experts, 2 per token, and record the routing margin (the smallest gap between a
token's last chosen and first unchosen router logit, over every token and layer), so a fixture
never rests on a near tie.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from hashed import hashed_values

OUT = ROOT / "tests" / "fixtures" / "families"
VOCAB, HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 64, 64, 64, 4, 2, 16
SHAPE = {
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": INTER,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "num_hidden_layers": 2,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-6,
}
LONG_PROMPT = [(i * 37 + 11) % VOCAB for i in range(24)]
SHORT_PROMPT = LONG_PROMPT[:9]


def init_for(name: str, gemma: bool) -> tuple[float, float]:
    """(std, mean) of a tensor by its HF name: norms near 1 (Gemma's ``1 + w``: w near 0)."""
    if name.endswith("norm.weight"):
        return (0.1, 0.0 if gemma else 1.0)
    if "embed_tokens" in name:
        # Gemma scales embeddings by sqrt(hidden): keep them from drowning the layers' output.
        return (0.1 if gemma else 0.5, 0.0)
    if name.endswith(".bias"):
        return (0.1, 0.0)
    if "lm_head" in name:
        return (0.15, 0.0)
    if name.endswith("mlp.gate.weight"):
        return (0.5, 0.0)
    if "shared_expert_gate" in name:
        return (0.5, 0.0)
    return (0.2, 0.0)


def families(T: Any) -> dict[str, dict[str, Any]]:
    """Family name -> config class, config fields and cases (prompt, steps, max_model_len)."""
    long_case = {"prompt": LONG_PROMPT, "steps": 8, "max_model_len": 256}
    return {
        "mistral_window": {
            "config": T.MistralConfig,
            "fields": {"sliding_window": 8, "rope_theta": 10000.0},
            "cases": [long_case],
        },
        "qwen2_window": {
            "config": T.Qwen2Config,
            "fields": {"sliding_window": 8, "use_sliding_window": True, "max_window_layers": 1},
            "cases": [long_case],
        },
        "phi3_longrope": {
            "config": T.Phi3Config,
            "fields": {
                "sliding_window": 12,
                "max_position_embeddings": 64,
                "original_max_position_embeddings": 16,
                "rope_scaling": {
                    "type": "longrope",
                    "short_factor": [1.0 + 0.1 * i for i in range(HEAD_DIM // 2)],
                    "long_factor": [1.5 + 0.5 * i for i in range(HEAD_DIM // 2)],
                },
            },
            # Up to 16 positions transformers takes the short factors, lmplex too when loaded
            # for 16; past them both take the long ones.
            "cases": [
                {"prompt": SHORT_PROMPT, "steps": 6, "max_model_len": 16},
                {"prompt": LONG_PROMPT, "steps": 8, "max_model_len": 64},
            ],
        },
        "gemma": {"config": T.GemmaConfig, "fields": {}, "cases": [long_case]},
        "gemma2": {
            "config": T.Gemma2Config,
            "fields": {
                "sliding_window": 8,
                "attn_logit_softcapping": 1.5,
                "final_logit_softcapping": 3.0,
                "query_pre_attn_scalar": 24,
                "num_hidden_layers": 3,
                "tie_word_embeddings": False,
            },
            "cases": [long_case],
        },
        "gemma3": {
            "config": T.Gemma3TextConfig,
            "fields": {
                "sliding_window": 8,
                "num_hidden_layers": 3,
                "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                "query_pre_attn_scalar": 24,
                "tie_word_embeddings": False,
                "rope_parameters": {
                    "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                },
            },
            "cases": [long_case],
        },
        "mixtral": {
            "config": T.MixtralConfig,
            "fields": {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
            "cases": [long_case],
        },
        "qwen2_moe": {
            "config": T.Qwen2MoeConfig,
            "fields": {
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "shared_expert_intermediate_size": 48,
                "norm_topk_prob": False,
                "mlp_only_layers": [1],
            },
            "cases": [long_case],
        },
        "qwen3_moe": {
            "config": T.Qwen3MoeConfig,
            "fields": {
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "norm_topk_prob": True,
            },
            "cases": [long_case],
        },
        "olmoe": {
            "config": T.OlmoeConfig,
            "fields": {"num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": False},
            "cases": [long_case],
        },
    }


def watch_routing(torch: Any, model: Any, top_k: int) -> list[float]:
    """Hooks every router (``*.mlp.gate``); the returned list fills with the routing margins seen."""
    margins: list[float] = []

    def hook(_module: Any, _inputs: Any, output: Any) -> None:
        logits = output[0] if isinstance(output, tuple) else output
        rows = logits.reshape(-1, logits.shape[-1]).double()
        top = torch.sort(rows, dim=-1, descending=True).values
        margins.append(float((top[:, top_k - 1] - top[:, top_k]).min()))

    for name, module in model.named_modules():
        if name.endswith("mlp.gate"):
            module.register_forward_hook(hook)
    return margins


def run_case(torch: Any, model: Any, case: dict[str, Any]) -> list[dict[str, Any]]:
    ids = list(case["prompt"])
    outputs = []
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        for step in range(case["steps"] + 1):
            logits = out.logits[0, -1].double()
            chosen = int(torch.argmax(logits))
            outputs.append({"logits": [round(float(x), 6) for x in logits], "next": chosen})
            if step == case["steps"]:
                break
            out = model(torch.tensor([[chosen]]), past_key_values=out.past_key_values, use_cache=True)
    return outputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="families to write (default: all)")
    args = ap.parse_args()

    import torch
    import transformers as T

    torch.manual_seed(0)
    table = families(T)
    for name in args.names or table:
        fam = table[name]
        config = fam["config"](**{**SHAPE, **fam["fields"]})
        config._attn_implementation = "eager"
        model = T.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.eval()
        gemma = "gemma" in name
        tensors = []
        for pname, param in model.named_parameters():
            std, mean = init_for(pname, gemma)
            values = hashed_values(pname, param.numel(), std, mean).reshape(tuple(param.shape))
            with torch.no_grad():
                param.copy_(torch.from_numpy(values))
            tensors.append({"name": pname, "shape": list(param.shape), "std": std, "mean": mean})
        cfg = json.loads(config.to_json_string())
        top_k = getattr(config, "num_experts_per_tok", None)
        margins = watch_routing(torch, model, top_k) if top_k else []
        cases = [{**case, "outputs": run_case(torch, model, case)} for case in fam["cases"]]
        fixture = {
            "family": name,
            "oracle": f"transformers {T.__version__}, torch {torch.__version__}, float32, eager, CPU",
            "python": platform.python_version(),
            "config": cfg,
            "tensors": tensors,
            "cases": cases,
        }
        if margins:
            fixture["min_routing_margin"] = round(min(margins), 6)
        OUT.mkdir(parents=True, exist_ok=True)
        path = OUT / f"{name}.json"
        path.write_text(json.dumps(fixture, indent=None, separators=(",", ":")) + "\n")
        tokens = [[o["next"] for o in c["outputs"]] for c in cases]
        margin = f" (routing margin {min(margins):.2e})" if margins else ""
        print(f"{name}: {tokens}{margin} -> {path.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Make greedy reference decodes of a real model under PEFT LoRA adapters, with transformers + PEFT.

Not run by CI: it needs torch, transformers, peft and gguf. CI checks lmplex against the fixture this
script writes (``tests/test_lora.py``). Run it in a separate environment:

    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install torch transformers peft gguf numpy
    lmplex models fetch smollm2-135m-instruct
    /tmp/refenv/bin/python scripts/make_lora_model_fixture.py --model smollm2-135m-instruct
    /tmp/refenv/bin/python scripts/make_lora_model_fixture.py --model qwen2.5-coder-0.5b-instruct --lora-std 0.02

transformers dequantizes the GGUF to float32 (as ``make_hf_fixtures.py`` does). Each adapter below is
made by PEFT's ``get_peft_model`` and every LoRA matrix is overwritten with ``hashed_values`` of the
name PEFT saves it under (B included, which PEFT starts at zero), so the test rebuilds the adapter
folder bit for bit from the fixture. The adapters span ranks 8, 16 and 64 (with a rank pattern),
alpha above and below r, and rsLoRA. Each case records, for the base and each adapter, the chosen
token and the top-5 log-probs at each greedy step.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_hf_fixtures import default_gguf, greedy_steps, sha256
from make_lora_fixtures import fill_lora

ROOT = Path(__file__).resolve().parent.parent
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS: dict[str, dict[str, Any]] = {
    "qv-r8": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]},
    "all-r16-rslora": {"r": 16, "lora_alpha": 8, "use_rslora": True, "target_modules": ALL},
    "mlp-r64": {
        "r": 64,
        "lora_alpha": 32,
        "target_modules": ["gate_proj", "up_proj", "down_proj"],
        "rank_pattern": {"down_proj": 32},
    },
}
LORA_STD = 0.04
PROMPTS = ["Name three colors.", "What is 7 times 6?"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="lmplex model alias")
    ap.add_argument("--steps", type=int, default=16, help="greedy tokens per prompt (default 16)")
    ap.add_argument(
        "--lora-std", type=float, default=LORA_STD, help="the LoRA values' spread (default %(default)s)"
    )
    args = ap.parse_args()

    import peft
    import torch
    import transformers
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = default_gguf(args.model)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    base = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    base.eval()
    eos = {tok.eos_token_id} | {tok.convert_tokens_to_ids("<|im_end|>")}
    prompts = []
    for p in PROMPTS:
        text = tok.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        prompts.append(tok(text, add_special_tokens=False)["input_ids"])
    runs: dict[str, list[list[dict[str, Any]]]] = {
        "": [greedy_steps(torch, base, ids, args.steps, eos) for ids in prompts]
    }
    adapters = []
    for name, fields in ADAPTERS.items():
        cfg = peft.LoraConfig(**fields, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
        model = peft.get_peft_model(copy.deepcopy(base), cfg)
        model.eval()
        tensors = fill_lora(torch, model, args.lora_std)
        with tempfile.TemporaryDirectory() as saved_dir:
            model.save_pretrained(saved_dir)
            adapter_config = json.loads((Path(saved_dir) / "adapter_config.json").read_text())
            names = sorted(safe_open(str(Path(saved_dir) / "adapter_model.safetensors"), "np").keys())
        if names != sorted(t["name"] for t in tensors):
            raise SystemExit(f"{name}: PEFT saved {names[:4]}...")
        runs[name] = [greedy_steps(torch, model, ids, args.steps, eos) for ids in prompts]
        adapters.append({"name": name, "adapter_config": adapter_config, "tensors": tensors})
    for name, cases in runs.items():
        for case in cases:
            reply = tok.decode([s["token_id"] for s in case], skip_special_tokens=True)
            print(f"{name or 'base'}: {reply!r}", file=sys.stderr)
    fixture = {
        "model": args.model,
        "gguf_sha256": sha256(gguf),
        "oracle": f"transformers {transformers.__version__}, peft {peft.__version__}, torch {torch.__version__}, "
        "float32, CPU",
        "python": platform.python_version(),
        "prompt_ids": prompts,
        "adapters": adapters,
        "runs": runs,
    }
    out = ROOT / "tests" / "fixtures" / f"lora_{args.model}.json"
    out.write_text(json.dumps(fixture, indent=None, separators=(",", ":")) + "\n")
    print(f"-> {out.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()

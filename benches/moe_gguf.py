#!/usr/bin/env python3
"""Write a synthetic Mixtral-shaped GGUF (random weights, a real tokenizer) for `lmplex bench`.

No Mixture-of-Experts model small enough for this machine ships on PyPI, so the MoE speed
comparison runs on a synthetic one: the layout llama.cpp's converter writes for Mixtral
(``general.architecture = llama`` with ``llama.expert_count``; ``blk.N.ffn_gate_inp`` routers in
F32; ``blk.N.ffn_{gate,up,down}_exps`` as one 3-D tensor each), random Gaussian weights, and the
tokenizer metadata copied from a real GGUF (SmolLM2's by default), so both engines tokenize and
decode real text. Quantization uses the ``gguf`` package's numpy quantizers (Q8_0 or Q4_0).

    python3 -m pip install gguf
    python3 benches/moe_gguf.py --out /tmp/moe.gguf                    # 8 experts, 2 per token
    lmplex bench --models /tmp/moe.gguf gemma-3-270m --workloads decode

Not part of CI.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokenizer-from", type=Path, help="GGUF to copy the tokenizer from (default: SmolLM2)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--expert-width", type=int, default=2816)
    ap.add_argument("--type", choices=["q8_0", "q4_0"], default="q4_0")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import gguf

    src_path = args.tokenizer_from
    if src_path is None:
        import lmplex.models

        src_path = Path(lmplex.models.resolve("smollm2-135m-instruct"))
    src = gguf.GGUFReader(src_path)
    qtype = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}[args.type]
    vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    h, hd = args.hidden, args.hidden // args.heads
    rng = np.random.default_rng(args.seed)

    def randn(*shape: int, std: float = 0.02) -> Any:
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)

    w = gguf.GGUFWriter(str(args.out), "llama")
    w.add_name(f"synthetic Mixtral-shaped {args.experts}x{args.expert_width}, top-{args.top_k}")
    w.add_context_length(8192)
    w.add_embedding_length(h)
    w.add_block_count(args.layers)
    w.add_feed_forward_length(args.expert_width)
    w.add_head_count(args.heads)
    w.add_head_count_kv(args.kv_heads)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(args.experts)
    w.add_expert_used_count(args.top_k)
    w.add_file_type(7 if args.type == "q8_0" else 2)
    for name, field in src.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, value, vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(name, value, vtype)

    def put(name: str, data: Any, quantize: bool = True) -> None:
        if quantize:
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, data)

    put("token_embd.weight", randn(vocab, h, std=0.5))
    put("output_norm.weight", np.ones(h, dtype=np.float32), quantize=False)
    put("output.weight", randn(vocab, h, std=0.05))
    kw = args.kv_heads * hd
    for i in range(args.layers):
        p = f"blk.{i}"
        put(f"{p}.attn_norm.weight", np.ones(h, dtype=np.float32), quantize=False)
        put(f"{p}.ffn_norm.weight", np.ones(h, dtype=np.float32), quantize=False)
        put(f"{p}.attn_q.weight", randn(h, h))
        put(f"{p}.attn_k.weight", randn(kw, h))
        put(f"{p}.attn_v.weight", randn(kw, h))
        put(f"{p}.attn_output.weight", randn(h, h))
        put(f"{p}.ffn_gate_inp.weight", randn(args.experts, h, std=0.5), quantize=False)
        put(f"{p}.ffn_gate_exps.weight", randn(args.experts, args.expert_width, h))
        put(f"{p}.ffn_up_exps.weight", randn(args.experts, args.expert_width, h))
        put(f"{p}.ffn_down_exps.weight", randn(args.experts, h, args.expert_width))
        print(f"layer {i + 1}/{args.layers}", file=sys.stderr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    size = args.out.stat().st_size
    print(f"wrote {args.out} ({size / 1e6:.0f} MB, vocab {vocab}, {args.experts} experts)", file=sys.stderr)


if __name__ == "__main__":
    main()

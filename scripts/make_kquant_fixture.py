#!/usr/bin/env python3
"""Make the k-quant golden fixture from files ``llama-quantize`` wrote.

Not run by CI: it needs llama.cpp's ``llama-quantize`` (it builds from the llama.cpp sources in the
llama-cpp-python sdist: ``cmake -B build && cmake --build build --target llama-quantize``). CI checks
lmplex's Q4_K, Q5_K and Q6_K encoders byte for byte against the fixture
(``crates/lmplex-model/tests/quantize.rs``).

The input is SmolLM2-135M's GGUF rewritten as F32 (``lmplex quantize SMOLLM2 smol-f32.gguf --type
f32``: exact, the Q4_1 values dequantized); the fixture holds the first ROWS rows of TENSOR from
``llama-quantize smol-f32.gguf OUT.gguf Q4_K_M`` (and Q5_K_M, Q6_K), where that tensor is Q4_K, Q5_K and
Q6_K respectively.

    python3 scripts/make_kquant_fixture.py --q4-k-m ll-q4_k_m.gguf --q5-k-m ll-q5_k_m.gguf --q6-k ll-q6_k.gguf
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gguf
import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "kquants_smollm2.json"
TENSOR = "blk.3.ffn_down.weight"
ROWS = 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--q4-k-m", type=Path, required=True)
    ap.add_argument("--q5-k-m", type=Path, required=True)
    ap.add_argument("--q6-k", type=Path, required=True)
    args = ap.parse_args()
    fixture: dict[str, object] = {"tensor": TENSOR, "rows": ROWS, "source": "llama-quantize from an F32 GGUF"}
    for kind, path in [("Q4_K", args.q4_k_m), ("Q5_K", args.q5_k_m), ("Q6_K", args.q6_k)]:
        (t,) = [t for t in gguf.GGUFReader(str(path)).tensors if t.name == TENSOR]
        assert t.tensor_type.name == kind, f"{path}: {TENSOR} is {t.tensor_type.name}"
        data = np.asarray(t.data).view(np.uint8)
        fixture[kind] = bytes(data[:ROWS].reshape(-1)).hex()
    OUT.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""``lmplex quantize`` against llama.cpp's ``llama-quantize``, whole file by whole file.

From one F32 GGUF (the model's PyPI GGUF written as F32 by ``lmplex quantize``: exact, the stored
values dequantized), each type of ``--types`` is made by both tools; then every tensor of the two files
is compared by name, order, type and bytes (``gguf``, llama.cpp's own reader). Not part of CI: it needs
``llama-quantize`` (``benches/llama_cpp_tools.sh``) and takes about 3 minutes on 2 cores. The JSON
(``--out``) records the machine, the commit and each type's counts; docs/quality.md quotes it, and
``tests/test_figures.py`` checks the quote.

    benches/llama_cpp_tools.sh /tmp/llama.cpp
    python benches/quantize_vs_llama.py --llama-bin /tmp/llama.cpp/bin --out docs/bench/quantize-vs-llama.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np

import lmplex
from lmplex import models
from lmplex.bench.provenance import provenance

TYPES = ["q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k"]


def tensors(path: Path) -> list[tuple[str, str, str]]:
    """Each tensor of a GGUF in file order: (name, type, SHA-256 of its bytes)."""
    out = []
    for t in gguf.GGUFReader(str(path)).tensors:
        data = np.ascontiguousarray(np.asarray(t.data)).view(np.uint8)
        out.append((t.name, t.tensor_type.name, hashlib.sha256(data.tobytes()).hexdigest()))
    return out


def compare(ours: Path, theirs: Path) -> dict[str, Any]:
    a, b = tensors(ours), tensors(theirs)
    by_name = {name: (kind, digest) for name, kind, digest in b}
    same_type = [n for n, k, _ in a if n in by_name and by_name[n][0] == k]
    same_bytes = [n for n, k, d in a if by_name.get(n) == (k, d)]
    return {
        "tensors": len(a),
        "llama_quantize_tensors": len(b),
        "same_order": [n for n, _, _ in a] == [n for n, _, _ in b],
        "same_type": len(same_type),
        "same_bytes": len(same_bytes),
        "differ": sorted({n for n, _, _ in a} - set(same_bytes)),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-bin", required=True, help="the folder holding llama-quantize")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--types", nargs="+", default=TYPES)
    p.add_argument("--work", default="/tmp/lmplex-quantize-vs-llama", help="where the GGUFs are written")
    p.add_argument("--out", help="write the JSON here")
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    f32 = work / f"{args.model}-f32.gguf"
    if not f32.exists():
        lmplex.quantize(models.resolve(args.model), str(f32), "f32")
    rows = []
    for t in args.types:
        ours, theirs = work / f"lmplex-{t}.gguf", work / f"llama-{t}.gguf"
        lmplex.quantize(str(f32), str(ours), t)
        cmd = [
            str(Path(args.llama_bin) / "llama-quantize"),
            str(f32),
            str(theirs),
            t.upper(),
            str(os.cpu_count()),
        ]
        subprocess.run(cmd, check=True, capture_output=True)
        row = {"type": t, **compare(ours, theirs)}
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    report = {
        **provenance(),
        "llama_cpp": os.environ.get("LLAMA_CPP_PYTHON_VERSION", "0.3.36")
        + " (llama-cpp-python's vendored llama.cpp)",
        "model": args.model,
        "types": rows,
    }
    text = json.dumps(report, indent=1) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0 if all(r["same_order"] and r["same_bytes"] == r["tensors"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

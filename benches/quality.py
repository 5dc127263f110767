#!/usr/bin/env python3
"""The quality table: perplexity of lmplex's quantized GGUFs and int8 KV cache, beside llama.cpp's.

For each model, the source GGUF is written as BF16 by ``lmplex.quantize``, and each type of ``--types``
is made from that BF16 file. Every file is then measured twice on the same text with the same method:
by ``lmplex.perplexity`` and by ``llama-perplexity`` (built by ``benches/llama_cpp_tools.sh``). The
``int8 KV`` row is the BF16 file with lmplex's int8 cache, beside llama.cpp's q8_0 cache (``-fa on
-ctk q8_0 -ctv q8_0``). Not part of CI: it takes about an hour on 2 cores.

``--dequantized MODEL:TYPE`` adds a row for that quantized file dequantized to F32 by ``llama-quantize
--allow-requantize`` (the same weights, dense, so neither tool rounds activations): it isolates what the
two tools' k-quant dot products contribute to the gap between them.

The JSON (``--out``) records the machine, the commit, llama.cpp's version and the text's digest;
docs/performance.md's quality tables are checked against it by ``tests/test_figures.py``. The text
used there is KJV Genesis from Debian's ``bible-kjv`` package::

    apt-get install bible-kjv && bible -f gen1:1-gen50:26 > genesis.txt
    benches/llama_cpp_tools.sh /tmp/llama.cpp
    python benches/quality.py --text genesis.txt --llama-bin /tmp/llama.cpp/bin --out docs/bench/quality-cpu.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lmplex
from lmplex import models
from lmplex.bench.provenance import provenance

TYPES = ["q8_0", "q6_k", "q5_k_m", "q4_k_m"]
DEQUANTIZED = ["smollm2-135m-instruct:q5_k_m", "smollm2-135m-instruct:q4_k_m"]
NAMES = {"smollm2-135m-instruct": "SmolLM2-135M", "qwen2.5-coder-0.5b-instruct": "Qwen2.5-Coder-0.5B"}
FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def lmplex_ppl(path: str, text: str, ctx: int, kv: str, chunks: int | None) -> dict[str, float]:
    config = lmplex.ModelConfig(path, max_model_len=ctx + 1, enable_prefix_caching=False, kv_cache_dtype=kv)
    engine = lmplex.Engine(config)
    r = lmplex.perplexity(engine, text, ctx=ctx, batch=2, chunks=chunks)
    return {"ppl": r.perplexity, "stderr": r.stderr, "seconds": r.seconds, "tokens": r.tokens_evaluated}


def llama_ppl(
    bin_dir: Path, path: str, text_file: str, ctx: int, kv: str | None, chunks: int | None
) -> dict[str, float]:
    cmd = [
        str(bin_dir / "llama-perplexity"),
        "-m",
        path,
        "-f",
        text_file,
        "-c",
        str(ctx),
        "-t",
        str(os.cpu_count()),
    ]
    if chunks is not None:
        cmd += ["--chunks", str(chunks)]
    if kv is not None:
        cmd += ["-fa", "on", "-ctk", kv, "-ctv", kv]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    m = FINAL.search(done.stdout + done.stderr)
    if done.returncode != 0 or m is None:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return {"ppl": float(m.group(1)), "stderr": float(m.group(2)), "seconds": time.perf_counter() - start}


def run_model(alias: str, args: argparse.Namespace, text: str) -> list[dict[str, Any]]:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    bf16 = work / f"{alias}-bf16.gguf"
    if not bf16.exists():
        lmplex.quantize(models.resolve(alias), str(bf16), "bf16")
    files = {"bf16": bf16}
    for t in args.types:
        files[t] = work / f"{alias}-{t}.gguf"
        if not files[t].exists():
            lmplex.quantize(str(bf16), str(files[t]), t)
    runs = [(name, f, "auto", None) for name, f in files.items()] + [("bf16 + int8 KV", bf16, "int8", "q8_0")]
    for t in (d.split(":", 1)[1] for d in args.dequantized if d.split(":", 1)[0] == alias):
        dense = work / f"{alias}-{t}-f32.gguf"
        if not dense.exists():
            cmd = [
                str(Path(args.llama_bin) / "llama-quantize"),
                "--allow-requantize",
                str(files[t]),
                str(dense),
            ]
            subprocess.run([*cmd, "F32", str(os.cpu_count())], check=True, capture_output=True)
        runs.append((f"{t}, dequantized to F32", dense, "auto", None))
    rows: list[dict[str, Any]] = []
    for name, f, kv, llama_kv in runs:
        if name in args.skip:
            continue
        row: dict[str, Any] = {"model": alias, "weights": name, "bytes": f.stat().st_size}
        row["lmplex"] = lmplex_ppl(str(f), text, args.ctx, kv, args.chunks)
        row["llama.cpp"] = llama_ppl(Path(args.llama_bin), str(f), args.text, args.ctx, llama_kv, args.chunks)
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The main table's lines (docs/performance.md): every row but the dequantized ones."""
    out = [
        "| model | weights | file (MB) | lmplex PPL | llama.cpp PPL | lmplex vs llama.cpp |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "dequantized" in r["weights"]:
            continue
        a, b = r["lmplex"], r["llama.cpp"]
        out.append(
            f"| {NAMES.get(r['model'], r['model'])} | {r['weights']} | {r['bytes'] / 1e6:.0f} "
            f"| {a['ppl']:.4f} ± {a['stderr']:.4f} | {b['ppl']:.4f} ± {b['stderr']:.4f} "
            f"| {100 * (a['ppl'] / b['ppl'] - 1):+.2f}% |"
        )
    return out


def isolation_table(rows: list[dict[str, Any]]) -> list[str]:
    """The gap's isolation (docs/performance.md): each dequantized file beside the file it came from."""
    out = ["| SmolLM2-135M file | lmplex PPL | llama.cpp PPL |", "|---|---|---|"]
    dense = [r for r in rows if "dequantized" in r["weights"]]
    for d in dense:
        (q,) = [r for r in rows if r["model"] == d["model"] and r["weights"] == d["weights"].split(",")[0]]
        for r in (q, d):
            out.append(f"| {r['weights']} | {r['lmplex']['ppl']:.4f} | {r['llama.cpp']['ppl']:.4f} |")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", required=True, help="the text file (e.g. KJV Genesis)")
    p.add_argument("--llama-bin", required=True, help="the folder holding llama-perplexity")
    p.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
    p.add_argument("--types", nargs="+", default=TYPES)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--chunks", type=int, default=None, help="score only the first N chunks (both tools)")
    p.add_argument("--skip", nargs="*", default=[], help="rows to leave out (e.g. bf16)")
    p.add_argument(
        "--dequantized",
        nargs="*",
        default=DEQUANTIZED,
        help="MODEL:TYPE files also measured dequantized to F32",
    )
    p.add_argument("--work", default="/tmp/lmplex-quality", help="where the GGUFs are written")
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args()
    raw = Path(args.text).read_bytes()
    text = raw.decode("utf-8")
    rows = [row for alias in args.models for row in run_model(alias, args, text)]
    report = {
        **provenance(),
        "llama_cpp": os.environ.get("LLAMA_CPP_PYTHON_VERSION", "0.3.36")
        + " (llama-cpp-python's vendored llama.cpp)",
        "text": {"file": Path(args.text).name, "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()},
        "ctx": args.ctx,
        "chunks": args.chunks,
        "rows": rows,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print("\n".join(table(rows)) + "\n\n" + "\n".join(isolation_table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

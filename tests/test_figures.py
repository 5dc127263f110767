"""The figures the README quotes are those of the committed benchmark runs (``docs/bench/*.json``),
so a claim cannot drift from its run: the CPU ratios against llama.cpp and the batched speedup
are recomputed here from ``docs/bench/bench-cpu.json`` (written by ``lmplex bench --json``) and
must appear in the README exactly as this test words them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def readme_text() -> str:
    """The README with its line breaks folded into spaces."""
    return re.sub(r"\s+", " ", (ROOT / "README.md").read_text())


def span(values: list[float]) -> str:
    lo, hi = f"{min(values):.1f}", f"{max(values):.1f}"
    return f"{lo}x" if lo == hi else f"{lo}–{hi}x"


def test_the_readmes_cpu_figures_are_the_committed_runs() -> None:
    bench: dict[str, Any] = json.loads((ROOT / "docs" / "bench" / "bench-cpu.json").read_text())
    runs = bench["runs"]
    ratios = [r["ratios"] for r in runs]
    decode = [v for r in ratios for k, v in r.items() if k.startswith("decode_")]
    prefill = [v for r in ratios for k, v in r.items() if k.startswith("prefill_")]
    batched = [b for r in runs for b in r["results"].get("batched", []) if b["system"] == "lmplex"]
    assert decode and prefill and batched, "the CPU benchmark run lacks decode, prefill or batched results"
    conc = {b["concurrency"] for b in batched}
    assert len(conc) == 1
    machine = bench["machine"]
    claim = (
        f"On a {machine['cpus']}-core {machine['cpu']}, lmplex decodes {span(decode)} and prefills "
        f"{span(prefill)} as fast as llama.cpp on the same GGUF, and {conc.pop()} batched requests decode "
        f"{span([b['speedup_vs_batch1'] for b in batched])} as fast as one"
    )
    assert claim in readme_text(), f"README should say: {claim}"

"""``lmplex.perplexity`` and ``lmplex eval perplexity`` against transformers on the same weights.

The fixtures (``scripts/make_ppl_fixture.py``) hold transformers' float32 run of the same GGUFs over the
Zen of Python, by llama.cpp's method, with the token ids lmplex gave. lmplex's figure must agree to
0.1% (its quantized kernels round activations to 16 bits), the token counts exactly, and the result must
not depend on how many chunks run together.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import zen_of_python

import lmplex

FIXTURES = Path(__file__).parent / "fixtures"


def _fixture(alias: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"ppl_{alias}.json").read_text())
    return data


@pytest.mark.parametrize("alias", ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
def test_perplexity_matches_transformers(alias: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue("smollm2_path" if alias.startswith("smollm2") else "qwen_coder_path")
    want = _fixture(alias)
    engine = lmplex.Engine(lmplex.ModelConfig(path, max_model_len=128, enable_prefix_caching=False))
    text, ctx = zen_of_python(), want["ctx"]
    assert engine.tokenize(text) == want["token_ids"], "the fixture's token ids"
    got = lmplex.perplexity(engine, text, ctx=ctx)
    assert (got.chunks, got.tokens_scored, got.ctx) == (want["chunks"], want["tokens_scored"], ctx)
    assert got.tokens_scored == got.chunks * (ctx - 1 - ctx // 2)
    assert got.tokens_evaluated == got.chunks * ctx
    assert got.perplexity == pytest.approx(want["perplexity"], rel=1e-3)
    assert got.stderr == pytest.approx(want["stderr"], rel=1e-2)
    assert got.tokens_per_second > 0
    # Chunks submitted together: the same bits.
    assert lmplex.perplexity(engine, text, ctx=ctx, batch=4).perplexity == got.perplexity
    # The first two chunks alone: their 2 * 15 tokens of the fixture's.
    two = lmplex.perplexity(engine, text, ctx=ctx, chunks=2)
    assert two.tokens_scored == 2 * (ctx - 1 - ctx // 2)
    assert two.perplexity == pytest.approx(
        math.exp(sum(want["nll"][: two.tokens_scored]) / two.tokens_scored), rel=2e-3
    )


def test_int8_kv_cache_perplexity_stays_near_transformers(smollm2_path: str) -> None:
    """The int8 KV cache (rotated, 32-value groups) moves SmolLM2's perplexity by well under 1% against
    transformers' float32 run, and chunks submitted together still give the same bits."""
    want = _fixture("smollm2-135m-instruct")
    config = lmplex.ModelConfig(
        smollm2_path, max_model_len=128, enable_prefix_caching=False, kv_cache_dtype="int8"
    )
    engine = lmplex.Engine(config)
    got = lmplex.perplexity(engine, zen_of_python(), ctx=want["ctx"])
    assert got.perplexity == pytest.approx(want["perplexity"], rel=5e-3)
    assert lmplex.perplexity(engine, zen_of_python(), ctx=want["ctx"], batch=4).perplexity == got.perplexity


def test_perplexity_rejects_bad_input(engine: lmplex.Engine) -> None:
    text = zen_of_python()
    with pytest.raises(lmplex.InvalidRequest, match="needs at least"):
        lmplex.perplexity(engine, "too short", ctx=32)
    with pytest.raises(lmplex.InvalidRequest, match="max_model_len"):
        lmplex.perplexity(engine, text, ctx=engine.info.max_model_len)
    with pytest.raises(lmplex.InvalidRequest, match="at least 4"):
        lmplex.perplexity(engine, text, ctx=2)
    with pytest.raises(lmplex.InvalidRequest, match="batch"):
        lmplex.perplexity(engine, text, ctx=32, batch=0)
    with pytest.raises(lmplex.InvalidRequest, match="chunks"):
        lmplex.perplexity(engine, text, ctx=32, chunks=0)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lmplex", "eval", "perplexity", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_prints_json_and_errors_cleanly(smollm2_path: str, tmp_path: Path) -> None:
    text = tmp_path / "zen.txt"
    text.write_text(zen_of_python(), encoding="utf-8")
    want = _fixture("smollm2-135m-instruct")
    r = _cli(smollm2_path, "--file", str(text), "--ctx", "32", "--batch", "3", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["perplexity"] == pytest.approx(want["perplexity"], rel=1e-3)
    assert (out["chunks"], out["tokens_scored"]) == (want["chunks"], want["tokens_scored"])
    assert "[6/6]" in r.stderr, "a progress line per chunk"
    plain = _cli(smollm2_path, "--file", str(text), "--ctx", "32", "-q")
    assert plain.returncode == 0 and plain.stderr == ""
    assert plain.stdout.startswith(f"perplexity: {out['perplexity']:.4f} +/- ")
    # Too short a text, a missing file, a context the loaded model cannot hold: exit 2, one line.
    for args, words in [
        (["--ctx", "512"], "needs at least 1024"),
        (["--ctx", "32", "--max-model-len", "32"], "must be above --ctx"),
    ]:
        bad = _cli(smollm2_path, "--file", str(text), *args)
        assert bad.returncode == 2 and words in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    missing = _cli(smollm2_path, "--file", str(tmp_path / "none.txt"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr

"""``lmplex.quantize`` / ``lmplex quantize`` against gguf-py, llama.cpp's own Python reader and quantizer.

SmolLM2-135M (Q4_1) is rewritten as F32 (every value kept), then from that as Q8_0, Q4_0 and Q4_K_M:

* gguf-py reads every file (header, metadata, tensor table): the layouts are ggml's;
* Q8_0 and Q4_0 tensors are byte for byte what gguf-py's ports of ggml's reference quantizers make
  from the same f32 values; every other quantized tensor dequantizes (by gguf-py) to within its type's
  error of the f32 values;
* the files load in lmplex and score the Zen of Python within 1% (Q8_0) and 10% (Q4_K_M) of the F32
  file's perplexity.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import zen_of_python

import lmplex

# Relative RMS error (against the tensor's RMS) each type stays under on these weights.
# Measured maxima: Q8_0 0.0065, Q6_K 0.019, Q5_0 0.052, Q4_K 0.020, Q4_0 0.104 (the source is Q4_1, so
# Q4_K, 16 levels with a min per 32 values, nearly reproduces it).
RMSE = {"Q8_0": 0.008, "Q6_K": 0.025, "Q5_0": 0.065, "Q4_K": 0.03, "Q4_0": 0.12}


@pytest.fixture(scope="module")
def f32_gguf(smollm2_path: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("quant") / "smol-f32.gguf"
    res = lmplex.quantize(smollm2_path, str(out), "f32")
    assert res.type_counts() == {"F32": len(res.tensors)}
    return out


def _tensors(path: Path) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def _values(t: gguf.ReaderTensor) -> np.ndarray:
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)


def _ppl(path: Path) -> float:
    engine = lmplex.Engine(lmplex.ModelConfig(str(path), max_model_len=64, enable_prefix_caching=False))
    return lmplex.perplexity(engine, zen_of_python(), ctx=32).perplexity


def test_f32_keeps_every_value(smollm2_path: str, f32_gguf: Path) -> None:
    src, ours = _tensors(Path(smollm2_path)), _tensors(f32_gguf)
    assert sorted(src) == sorted(ours), "names"
    for name, t in src.items():
        assert np.array_equal(_values(t), _values(ours[name])), name
    fields = gguf.GGUFReader(str(f32_gguf)).fields
    assert int(fields["general.file_type"].parts[-1][0]) == 0
    assert "tokenizer.chat_template" in fields and "tokenizer.ggml.tokens" in fields


@pytest.mark.parametrize("file_type", ["q8_0", "q4_0", "q4_k_m"])
def test_quantized_files_match_ggml(file_type: str, f32_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / f"smol-{file_type}.gguf"
    res = lmplex.quantize(str(f32_gguf), str(out), file_type)
    ref, ours = _tensors(f32_gguf), _tensors(out)
    assert [n for n, _, _ in res.tensors] == list(ours)
    seen = set()
    for name, t in ours.items():
        kind = t.tensor_type.name
        seen.add(kind)
        x = _values(ref[name])
        if kind == "F32":
            assert np.array_equal(_values(t), x), name
            continue
        if kind in ("Q8_0", "Q4_0"):
            want = gguf.quants.quantize(x.reshape(ref[name].data.shape), t.tensor_type)
            assert np.array_equal(np.asarray(t.data).reshape(-1), want.reshape(-1)), f"{name}: {kind} bytes"
        y = _values(t)
        rel = float(np.sqrt(np.mean((x - y) ** 2)) / np.sqrt(np.mean(x**2)))
        assert rel < RMSE[kind], f"{name} ({kind}): relative rmse {rel:.4f}"
    expected = {
        "q8_0": {"F32", "Q8_0"},
        "q4_0": {"F32", "Q4_0", "Q8_0"},
        "q4_k_m": {"F32", "Q5_0", "Q4_K", "Q6_K", "Q8_0"},
    }
    assert seen == expected[file_type]
    base, got = _ppl(f32_gguf), _ppl(out)
    # Measured: F32 19.125; Q8_0 19.130, Q4_K_M 19.971, Q4_0 26.374 (4-bit twice over: the source is Q4_1).
    bound = {"q8_0": 0.01, "q4_0": 0.5, "q4_k_m": 0.1}[file_type]
    assert abs(got / base - 1) < bound, f"{file_type}: perplexity {got:.3f} against {base:.3f}"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lmplex", "quantize", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_cli_writes_and_refuses_cleanly(f32_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "q8.gguf"
    r = _cli(str(f32_gguf), str(out), "--type", "Q8_0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"wrote {out}: ") and "Q8_0" in r.stdout and out.is_file()
    bad = _cli(str(f32_gguf), str(tmp_path / "x.gguf"), "--type", "q3_k")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    hf = _cli(str(folder), str(tmp_path / "y.gguf"), "--type", "q8_0")
    assert hf.returncode == 2 and "config.json" in hf.stderr and "Traceback" not in hf.stderr
    missing_dir = tmp_path / "no" / "such" / "dir" / "z.gguf"
    r = _cli(str(f32_gguf), str(missing_dir), "--type", "q8_0")
    assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr
    same = _cli(str(out), str(out), "--type", "q8_0")
    assert same.returncode == 2 and "overwrite the source" in same.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "q8.gguf"], "no temporary file left"


def test_hugging_face_folder_quantizes_like_its_gguf(
    smollm2_path: str, f32_gguf: Path, tmp_path: Path
) -> None:
    """An HF folder (SmolLM2 exported as float32) written as Q8_0 is the GGUF's own Q8_0 file, tensor for
    tensor and in its tokenizer metadata (the Rust tests check Q4_K_M and Qwen); a tokenizer llama.cpp's
    byte-level BPE cannot take is refused before anything is written."""
    folder = tmp_path / "smol-hf"
    list(lmplex._core.export_gguf_to_hf(smollm2_path, str(folder), "float32", 10**10))
    ours, theirs = tmp_path / "from-hf.gguf", tmp_path / "from-gguf.gguf"
    res = lmplex.quantize(str(folder), str(ours), "q8_0")
    lmplex.quantize(str(f32_gguf), str(theirs), "q8_0")
    a, b = _tensors(ours), _tensors(theirs)
    assert a.keys() == b.keys() and len(res.tensors) == len(a)
    for name, t in a.items():
        assert t.tensor_type == b[name].tensor_type, name
        assert np.array_equal(np.asarray(t.data), np.asarray(b[name].data)), name
    fields = gguf.GGUFReader(str(ours)).fields
    assert fields["tokenizer.ggml.pre"].contents() == "smollm"
    assert fields["tokenizer.ggml.model"].contents() == "gpt2"
    engine = lmplex.Engine(lmplex.ModelConfig(str(ours), max_model_len=64))
    assert engine.tokenize("Hello, world!") == lmplex.Engine(lmplex.ModelConfig(smollm2_path)).tokenize(
        "Hello, world!"
    )
    # A SentencePiece-style (byte-fallback) tokenizer is not taken yet.
    tok = folder / "tokenizer.json"
    tok.write_text(tok.read_text().replace('"byte_fallback": false', '"byte_fallback": true'))
    with pytest.raises(lmplex.InvalidRequest, match="byte-level BPE"):
        lmplex.quantize(str(folder), str(tmp_path / "no.gguf"), "q8_0")
    assert not (tmp_path / "no.gguf").exists()

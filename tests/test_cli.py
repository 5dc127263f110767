"""The ``lmplex`` command line, run as ``python -m lmplex`` in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lmplex import models

TIMEOUT_S = 300


def run(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lmplex", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        check=False,
    )


def test_generate_greedy(smollm2_path: str) -> None:
    done = run("generate", "-m", smollm2_path, "--max-tokens", "8", "--temperature", "0", "Say hi")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() != ""
    assert done.stdout.endswith("\n")
    assert "Traceback" not in done.stderr
    again = run(
        "generate", "-m", smollm2_path, "--max-tokens", "8", "--temperature", "0", "--no-stream", "Say hi"
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout == done.stdout


def test_generate_json(smollm2_path: str) -> None:
    done = run("generate", "-m", smollm2_path, "--max-tokens", "6", "--temperature", "0", "--json", "Say hi")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result) >= {"text", "token_ids", "finish_reason", "usage"}
    assert 1 <= len(result["token_ids"]) <= 6
    assert result["usage"]["completion_tokens"] == len(result["token_ids"])
    assert result["finish_reason"] in ("stop", "length")


def test_chat_with_piped_stdin(smollm2_path: str) -> None:
    flags = ["chat", "-m", smollm2_path, "--max-tokens", "8", "--temperature", "0"]
    done = run(*flags, stdin="Hello\n/exit\nignored\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() != ""
    assert ">>>" not in done.stdout  # no prompt when stdin is not a TTY
    # /exit stops reading: the output is that of the single turn, as when input simply ends.
    single = run(*flags, stdin="Hello\n")
    assert single.returncode == 0, single.stderr
    assert done.stdout == single.stdout


def test_chat_reset_and_eof(smollm2_path: str) -> None:
    done = run(
        "chat", "-m", smollm2_path, "--max-tokens", "4", "--temperature", "0", stdin="Hi\n/reset\nHi\n"
    )
    assert done.returncode == 0, done.stderr
    replies = done.stdout.split("\n")
    assert replies[-1] == ""  # each reply ends with a newline
    assert "cleared" in done.stderr


def test_models_list() -> None:
    done = run("models", "list")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:2] == ["NAME", "SIZE"]
    names = (
        "smollm2-135m-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "qwen2.5-coder-1.5b-instruct",
        "gemma-3-270m",
    )
    for name in names:
        assert any(line.startswith(name + " ") for line in lines), done.stdout
    smol = next(line for line in lines if line.startswith("smollm2-135m-instruct "))
    assert "98.4" in smol


def test_models_list_empty_cache(tmp_path: Path) -> None:
    env = {**os.environ, "LMPLEX_CACHE_DIR": str(tmp_path)}
    done = run("models", "list", env=env)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    fetched = {row[0]: row[2] for row in rows}
    assert fetched["qwen2.5-coder-1.5b-instruct"] == "no"


def test_models_info(smollm2_path: str) -> None:
    done = run("models", "info", smollm2_path, "--max-model-len", "256")
    assert done.returncode == 0, done.stderr
    assert smollm2_path in done.stdout
    assert models.MODELS["smollm2-135m-instruct"].sha256 in done.stdout
    assert "weights" in done.stdout
    assert "max_model_len: 256" in done.stdout


def test_models_export_loads_as_hf_folder(smollm2_path: str, tmp_path: Path) -> None:
    out = tmp_path / "smollm2-hf"
    done = run("models", "export", smollm2_path, str(out), "--dtype", "float32", "--max-shard-mb", "200")
    assert done.returncode == 0, done.stderr
    names = {Path(line).name for line in done.stdout.split()}
    assert {
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model-00001-of-00003.safetensors",
    } <= names
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    # The folder answers like the GGUF it came from (greedy, same tokens).
    from_gguf = run(
        "generate", "-m", smollm2_path, "--max-tokens", "12", "--temperature", "0", "--json", "Hi"
    )
    from_hf = run("generate", "-m", str(out), "--max-tokens", "12", "--temperature", "0", "--json", "Hi")
    assert from_hf.returncode == 0, from_hf.stderr
    assert json.loads(from_hf.stdout)["token_ids"] == json.loads(from_gguf.stdout)["token_ids"]
    # Bad input is a clean error.
    bad = run("models", "export", str(out), str(tmp_path / "again"))
    assert bad.returncode == 2 and "only GGUF" in bad.stderr and "Traceback" not in bad.stderr


def test_missing_model_is_a_clean_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.gguf")
    done = run("generate", "-m", missing, "hello")
    assert done.returncode == 2
    assert done.stderr.startswith("error: ")
    assert missing in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_unfetched_alias_is_a_clean_error(tmp_path: Path) -> None:
    env = {**os.environ, "LMPLEX_CACHE_DIR": str(tmp_path)}
    done = run("generate", "-m", "qwen2.5-coder-1.5b-instruct", "hello", env=env)
    assert done.returncode == 2
    assert "lmplex models fetch qwen2.5-coder-1.5b-instruct" in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_sampling_flag_is_a_clean_error(smollm2_path: str) -> None:
    done = run("generate", "-m", smollm2_path, "--top-p", "1.5", "hello")
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "top_p" in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["generate"],
        ["chat"],
        ["models"],
        ["models", "list"],
        ["models", "fetch"],
        ["models", "info"],
    ],
    ids=lambda a: " ".join(a) or "lmplex",
)
def test_help(args: list[str]) -> None:
    done = run(*args, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: lmplex")
    assert "Traceback" not in done.stderr


def test_usage_error_exits_2() -> None:
    done = run("generate")
    assert done.returncode == 2
    assert "PROMPT" in done.stderr


def test_device_flag_picks_the_device_or_says_what_is_missing(smollm2_path: str) -> None:
    done = run(
        "generate",
        "-m",
        smollm2_path,
        "--device",
        "cpu",
        "--max-tokens",
        "4",
        "--temperature",
        "0",
        "--json",
        "Hi",
    )
    assert done.returncode == 0, done.stderr
    assert 1 <= json.loads(done.stdout)["usage"]["completion_tokens"] <= 4
    done = run("generate", "-m", smollm2_path, "--device", "tpu", "Hi")
    assert done.returncode == 2 and "unknown device 'tpu'" in done.stderr, done.stderr
    if shutil.which("nvidia-smi") is None and not Path("/proc/driver/nvidia").exists():
        done = run("models", "info", smollm2_path, "--device", "cuda:1")
        assert done.returncode == 2 and "CUDA is not available" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr

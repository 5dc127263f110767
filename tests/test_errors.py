"""Bad input raises the right typed exception, quickly, with a message that names the problem."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import lmplex
from lmplex import InvalidRequest, LmplexError, ModelConfig, ModelLoadError, SamplingParams, _core


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_p": 1.5}, "min_p"),
        ({"logprobs": -1}, "logprobs"),
    ],
)
def test_bad_sampling_params(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        SamplingParams(**kwargs)
    assert name in str(info.value)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, LmplexError)


def test_good_sampling_params_keep_their_values() -> None:
    params = SamplingParams(temperature=0.5, top_p=1.0, top_k=0, max_tokens=1, min_p=0.0, logprobs=0, seed=7)
    assert (params.temperature, params.top_p, params.max_tokens, params.logprobs, params.seed) == (
        0.5,
        1.0,
        1,
        0,
        7,
    )


def test_exception_hierarchy() -> None:
    assert issubclass(InvalidRequest, ValueError)
    assert issubclass(InvalidRequest, LmplexError)
    assert issubclass(ModelLoadError, LmplexError)
    assert issubclass(lmplex.CapacityError, LmplexError)
    assert not issubclass(ModelLoadError, ValueError)


@pytest.fixture(scope="module")
def short_engine(smollm2_path: str) -> lmplex.Engine:
    return lmplex.Engine(ModelConfig(smollm2_path, max_model_len=64))


def test_prompt_longer_than_max_model_len(short_engine: lmplex.Engine) -> None:
    prompt = "hello " * 200
    n_tokens = len(short_engine.tokenize(prompt))
    assert n_tokens > 64
    with pytest.raises(InvalidRequest) as info:
        short_engine.generate(prompt, SamplingParams(max_tokens=4))
    message = str(info.value)
    assert "64" in message or str(n_tokens) in message, message


def test_message_without_role(engine: lmplex.Engine) -> None:
    with pytest.raises(InvalidRequest, match="role"):
        engine.generate([{"content": "hi"}], SamplingParams(max_tokens=4))


def test_unknown_message_role_is_named(engine: lmplex.Engine) -> None:
    """A role outside OpenAI's set is refused before it reaches the chat template."""
    with pytest.raises(InvalidRequest, match="unknown message role 'usr'"):
        engine.generate([{"role": "usr", "content": "hi"}], SamplingParams(max_tokens=4))


def test_streams_and_the_one_liner_take_one_prompt(engine: lmplex.Engine) -> None:
    with pytest.raises(InvalidRequest, match="stream takes one prompt, got 2"):
        two: list[Any] = ["a", "b"]
        engine.stream(two)
    with pytest.raises(InvalidRequest, match="no prompt given"):
        engine.stream([])


def test_mixed_prompt_list_is_rejected(engine: lmplex.Engine) -> None:
    with pytest.raises(InvalidRequest, match="mixing these is not allowed"):
        mixed: list[Any] = [{"role": "user", "content": "hi"}, "hello"]
        engine.generate(mixed, SamplingParams(max_tokens=4))


def test_bad_token_id_prompts(engine: lmplex.Engine) -> None:
    vocab = engine.info.vocab_size
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        engine.generate([1, vocab], SamplingParams(max_tokens=4))
    with pytest.raises(InvalidRequest):
        engine.generate([1, -3], SamplingParams(max_tokens=4))
    with pytest.raises(InvalidRequest):
        bad: list[Any] = [[1, "a"]]
        lmplex._core.CallArgs(bad, SamplingParams(max_tokens=4))  # the core checks too


def _assert_names(err: BaseException, *names: str) -> None:
    message = str(err)
    assert any(name in message for name in names), f"{message!r} names none of {names}"


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.gguf"
    with pytest.raises(ModelLoadError) as info:
        lmplex.Engine(str(missing))
    _assert_names(info.value, str(missing))


def test_missing_file_in_core(tmp_path: Path) -> None:
    """The core itself, given a path that does not exist (bypassing models.resolve)."""
    missing = tmp_path / "missing.gguf"
    with pytest.raises(ModelLoadError) as info:
        _core.Engine(ModelConfig(str(missing)), str(missing))
    _assert_names(info.value, str(missing), missing.name)


@pytest.mark.parametrize("keep_bytes", [1 << 20, 50 << 20])
def test_truncated_gguf(smollm2_path: str, tmp_path: Path, keep_bytes: int) -> None:
    truncated = tmp_path / f"truncated-{keep_bytes}.gguf"
    with open(smollm2_path, "rb") as src, open(truncated, "wb") as dst:
        shutil.copyfileobj(_Limited(src, keep_bytes), dst)
    assert truncated.stat().st_size == keep_bytes
    with pytest.raises(ModelLoadError) as info:
        lmplex.Engine(str(truncated))
    _assert_names(info.value, str(truncated), truncated.name)


@pytest.mark.parametrize("magic", [b"", b"GGUF"], ids=["random", "gguf-magic-then-random"])
def test_random_bytes_gguf(tmp_path: Path, magic: bytes) -> None:
    bogus = tmp_path / "x.gguf"
    data = magic + random.Random(0).randbytes(64 * 1024)
    assert data.startswith(b"GGUF") == bool(magic)
    bogus.write_bytes(data)
    with pytest.raises(ModelLoadError) as info:
        lmplex.Engine(str(bogus))
    _assert_names(info.value, str(bogus), bogus.name)


def test_garbled_gguf_metadata_gives_a_message_without_a_backtrace(smollm2_path: str, tmp_path: Path) -> None:
    """candle appends a Rust backtrace to its GGUF errors when RUST_BACKTRACE is set; the user sees
    the reason and the file, not the frames (a subprocess: the setting is read once per process)."""
    garbled = tmp_path / "garbled.gguf"
    with open(smollm2_path, "rb") as src:
        head = bytearray(src.read(4 << 20))
    head[400:408] = b"\xff" * 8  # a metadata value type
    garbled.write_bytes(bytes(head))
    code = (
        "import sys, lmplex\n"
        "try:\n    lmplex.Engine(sys.argv[1])\n"
        "except lmplex.ModelLoadError as e:\n    print(e)\n"
    )
    env = {**os.environ, "RUST_BACKTRACE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(garbled)], check=True, capture_output=True, text=True, env=env
    )
    message = out.stdout.strip()
    assert "corrupt or truncated GGUF header" in message and str(garbled) in message, out
    assert "\n" not in message and "candle_core::" not in message, message


def test_unknown_hf_architecture(tmp_path: Path) -> None:
    folder = tmp_path / "hfmodel"
    folder.mkdir()
    config = {"architectures": ["FooForCausalLM"], "model_type": "foo", "hidden_size": 64}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError) as info:
        lmplex.Engine(str(folder))
    _assert_names(info.value, "FooForCausalLM", "foo")


def test_config_kwargs_need_a_model_id(smollm2_path: str) -> None:
    with pytest.raises(TypeError):
        lmplex.Engine(ModelConfig(smollm2_path), max_model_len=64)


class _Limited:
    """A read-only view of the first ``limit`` bytes of a binary file."""

    def __init__(self, raw: Any, limit: int) -> None:
        self.raw = raw
        self.left = limit

    def read(self, size: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        size = self.left if size < 0 else min(size, self.left)
        data: bytes = self.raw.read(size)
        self.left -= len(data)
        return data


def _cuda_driver_present() -> bool:
    """True when the CUDA driver library can be found or opened (then a GPU may be usable here)."""
    import ctypes
    import ctypes.util

    if ctypes.util.find_library("cuda"):
        return True
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def test_cuda_without_a_driver_is_a_clear_error(smollm2_path: str) -> None:
    if _cuda_driver_present():
        pytest.skip("a CUDA driver is present: device='cuda' may work here (tests/gpu covers it)")
    with pytest.raises(InvalidRequest, match="(?i)cuda"):
        lmplex.Engine(smollm2_path, device="cuda")


def test_devices_by_ordinal_and_bad_device_names(smollm2_path: str) -> None:
    assert lmplex.ModelConfig(smollm2_path, device="CUDA:1").device == "cuda:1"
    assert lmplex.ModelConfig(smollm2_path, device="gpu").device == "cuda"
    for bad in ("cuda:", "cuda:x", "tpu"):
        with pytest.raises(InvalidRequest, match="unknown device"):
            lmplex.ModelConfig(smollm2_path, device=bad)
    if _cuda_driver_present():
        pytest.skip("a CUDA driver is present: device='cuda:1' may work here (tests/gpu covers it)")
    with pytest.raises(InvalidRequest, match="CUDA is not available"):
        lmplex.Engine(smollm2_path, device="cuda:1")
    # A host probes a CUDA model's device before it plans it: nothing loads, nothing is reserved.
    with pytest.raises(InvalidRequest, match="model 'gpu'.*CUDA is not available"):
        lmplex.ModelHost([lmplex.ModelConfig(smollm2_path, device="cuda", served_model_name="gpu")])
    with pytest.raises(InvalidRequest, match=r"gpu_memory_utilization must be in \(0, 1\], got 1.5"):
        lmplex.ModelHost([smollm2_path], gpu_memory_utilization=1.5)


def test_a_hosts_memory_names_its_budgets_and_models(smollm2_path: str) -> None:
    host = lmplex.ModelHost(
        [lmplex.ModelConfig(smollm2_path, served_model_name="a", max_model_len=256)], 8 << 30
    )
    mem = host.memory()
    assert isinstance(mem, lmplex.HostMemory)
    assert (mem.budget, mem.cuda, mem.idle_models) == (8 << 30, {}, 0)
    report = mem.models["a"]
    assert isinstance(report, lmplex.MemoryReport) and report.weights > 0
    # The plan, from the headers, is what the model holds (the weights' estimate within 0.1%).
    held = report.weights + report.kv_cache
    assert abs(mem.reserved - held) < 0.001 * held, (mem.reserved, held)
    assert mem.free == mem.budget - mem.reserved


def test_auto_on_a_machine_without_a_driver_loads_no_cuda_library(smollm2_path: str) -> None:
    # Deciding device="auto" looks for the driver first, so a CPU process maps neither NVRTC nor
    # cuBLAS (tens of MB of resident memory), even where pip installed them.
    if _cuda_driver_present():
        pytest.skip("a CUDA driver is present: auto may choose CUDA here")
    code = (
        "import logging, sys, lmplex\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "e = lmplex.Engine(lmplex.ModelConfig(sys.argv[1], max_model_len=256))\n"
        "assert e.info.device == 'cpu', e.info\n"
        "maps = open('/proc/self/maps').read()\n"
        "print([lib for lib in ('libnvrtc', 'libcublas') if lib in maps])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, smollm2_path], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
    assert "device=auto: the CPU, because CUDA is not available: no NVIDIA driver" in done.stderr, done.stderr

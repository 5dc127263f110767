"""The CUDA kernels compile with NVRTC from Python (no GPU needed): pip's NVIDIA wheels are found on
``sys.path``, every kernel compiles for sm_90, a second run is served from the disk cache, and a missing
NVRTC or a bad arch is an ``InvalidRequest``. Skips where NVRTC is not installed, unless
``LMPLEX_REQUIRE_NVRTC=1`` (scripts/test installs it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmplex import InvalidRequest, _core, cuda

KERNELS = [
    "embedding",
    "rmsnorm",
    "rope",
    "swiglu",
    "rowwise",
    "kv_write",
    "lora",
    "paged_attention",
    "qgemv",
    "tgemm",
    "argmax",
    "sampling",
]


@pytest.fixture
def roots() -> list[str]:
    found = cuda.cuda_roots()
    if not found and not os.environ.get("LMPLEX_CUDA_HOME"):
        if os.environ.get("LMPLEX_REQUIRE_NVRTC") == "1":
            pytest.fail("LMPLEX_REQUIRE_NVRTC=1 but pip's nvidia-cuda-nvrtc is not installed")
        pytest.skip(
            "NVRTC not installed: pip install nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96"
        )
    return found


def test_every_kernel_compiles_and_the_cache_serves_the_second_run(roots: list[str], tmp_path: Path) -> None:
    first = _core.compile_kernels(roots, 90, str(tmp_path))
    assert [k for k, _, _, _ in first] == KERNELS
    assert all(size > 1000 and not cached for _, _, size, cached in first)
    assert all(Path(path).stat().st_size == size for _, path, size, _ in first)
    second = _core.compile_kernels(roots, 90, str(tmp_path))
    assert [(k, size) for k, _, size, _ in second] == [(k, size) for k, _, size, _ in first]
    assert all(cached for _, _, _, cached in second)
    assert len(list(tmp_path.glob("*-sm90-*.cubin"))) == len(KERNELS)


def test_the_cli_compiles_through_the_cache(roots: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "LMPLEX_KERNEL_CACHE": str(tmp_path)}
    cmd = [sys.executable, "-m", "lmplex", "kernels", "--arch", "80"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    assert out.count("compiled") == len(KERNELS) and "sm_80" in out
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    assert again.count("cached") == len(KERNELS)


def test_missing_nvrtc_and_bad_arch_are_clear_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ["LMPLEX_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"]:
        monkeypatch.delenv(var, raising=False)
    if Path("/usr/local/cuda/include/cuda_bf16.h").exists():
        pytest.skip("a system CUDA toolkit is installed")
    with pytest.raises(InvalidRequest, match="no NVRTC"):
        _core.compile_kernels([str(tmp_path)], 90, str(tmp_path))
    with pytest.raises(InvalidRequest, match="compute capability"):
        _core.compile_kernels([], 9, str(tmp_path))

"""Fixtures of the GPU tests: PyTorch with a device (the engine tests), CuPy and the kernels lmplex
compiles, launched from their CUBINs.

The tests run only on a machine with a CUDA device, CuPy and NVRTC (the project's GPU machine);
elsewhere every test here skips with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lmplex import cuda


@pytest.fixture(scope="session")
def torch() -> Any:
    """PyTorch, when it sees a CUDA device (the engine tests' skip rule)."""
    module = pytest.importorskip(
        "torch", reason="PyTorch is not installed (GPU tests run on the GPU machine)"
    )
    if not module.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    return module


@pytest.fixture(scope="session")
def transformers(torch: Any) -> Any:
    return pytest.importorskip("transformers", reason="transformers is not installed (needed for oracles)")


@pytest.fixture(scope="session")
def cp() -> Any:
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed (GPU tests run on the GPU machine)")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:  # noqa: BLE001 - CuPy raises its own CUDA errors when no driver is present
        pytest.skip(f"no CUDA device: {err}")
    if count == 0:
        pytest.skip("no CUDA device")
    return cupy


@pytest.fixture(scope="session")
def kernel(cp: Any, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Any]:
    """``kernel("rope_f32")``: the function from the CUBIN compiled for this device's arch."""
    arch = int(cp.cuda.Device().compute_capability)  # "90" on H100/H200
    compiled = _core_compile(arch, tmp_path_factory.mktemp("kernels"))
    modules = {name: cp.RawModule(path=path) for name, path in compiled.items()}

    def get(function: str) -> Any:
        for module in modules.values():
            try:
                return module.get_function(function)
            except Exception:  # noqa: BLE001, S112 - not in this module; try the next
                continue
        raise KeyError(function)

    return get


def _core_compile(arch: int, cache: Path) -> dict[str, str]:
    from lmplex import _core

    return {name: path for name, path, _, _ in _core.compile_kernels(cuda.cuda_roots(), arch, str(cache))}

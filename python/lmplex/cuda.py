"""Finding CUDA from Python, and compiling lmplex's kernels with NVRTC.

CUDA libraries are looked for in pip's NVIDIA wheels first (``site-packages/nvidia/cu13``, as
``pip install nvidia-cuda-nvrtc nvidia-cuda-runtime`` or PyTorch's CUDA 13 wheels install them),
then ``$LMPLEX_CUDA_HOME``, ``$CUDA_HOME``, ``$CUDA_PATH`` and ``/usr/local/cuda``. Compiled CUBINs
are cached in ``$LMPLEX_KERNEL_CACHE``, else ``kernels/`` beside the model cache, keyed by source,
options, arch and NVRTC version, so a second start compiles nothing.

Invariants: nothing here needs a GPU (NVRTC runs on the CPU); nothing is downloaded; a missing
NVRTC raises :class:`InvalidRequest` naming where it looked.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from lmplex import _core, models

__all__ = ["compile_kernels", "cuda_roots", "export_roots", "kernel_cache_dir"]


def cuda_roots() -> list[str]:
    """Folders of pip's CUDA 13 wheels on ``sys.path`` (each holds ``lib/`` and ``include/``)."""
    roots: list[str] = []
    for entry in sys.path:
        candidate = Path(entry or ".") / "nvidia" / "cu13"
        if (candidate / "lib").is_dir() and str(candidate) not in roots:
            roots.append(str(candidate))
    return roots


def export_roots() -> None:
    """Names :func:`cuda_roots` to the Rust core in ``$LMPLEX_CUDA_ROOTS`` (unless already set), so
    ``device="cuda"`` finds pip's CUDA libraries; called once, when :mod:`lmplex` is imported."""
    roots = cuda_roots()
    if roots and "LMPLEX_CUDA_ROOTS" not in os.environ:
        os.environ["LMPLEX_CUDA_ROOTS"] = os.pathsep.join(roots)


def kernel_cache_dir() -> Path:
    """Where compiled kernels are cached: ``$LMPLEX_KERNEL_CACHE``, else ``kernels/`` beside the models."""
    explicit = os.environ.get("LMPLEX_KERNEL_CACHE")
    return Path(explicit).expanduser() if explicit else models.cache_dir().parent / "kernels"


def compile_kernels(arch: int) -> list[tuple[str, str, int, bool]]:
    """Compiles every kernel for ``sm_{arch}`` (80: A100, 89: L4, 90: H100/H200) through the cache;
    returns ``(kernel, cubin_path, cubin_bytes, from_cache)`` per kernel."""
    return _core.compile_kernels(cuda_roots(), arch, str(kernel_cache_dir()))

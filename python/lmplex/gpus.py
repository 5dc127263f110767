"""The NVIDIA cards an ``LMLiteBlock`` can ask for (``GPUS``), and the ones this machine has.

Invariant: ``present_gpus`` only runs ``nvidia-smi`` (no CUDA library is loaded); without it, or when it
fails, the machine has none.
"""

from __future__ import annotations

import enum
import shutil
import subprocess

__all__ = ["GPUS", "present_gpus"]

_GIB = 1 << 30


class GPUS(enum.Enum):
    """NVIDIA cards a block can ask for, with their memory in bytes."""

    NVIDIA_T4 = ("Tesla T4", 16 * _GIB)
    NVIDIA_A10G = ("NVIDIA A10G", 24 * _GIB)
    NVIDIA_L4 = ("NVIDIA L4", 24 * _GIB)
    NVIDIA_RTX_4090 = ("NVIDIA GeForce RTX 4090", 24 * _GIB)
    NVIDIA_A100_40GB = ("NVIDIA A100-SXM4-40GB", 40 * _GIB)
    NVIDIA_L40S = ("NVIDIA L40S", 48 * _GIB)
    NVIDIA_A100_80GB = ("NVIDIA A100-SXM4-80GB", 80 * _GIB)
    NVIDIA_H100 = ("NVIDIA H100 80GB HBM3", 80 * _GIB)
    NVIDIA_H200 = ("NVIDIA H200", 141 * _GIB)

    @property
    def product_name(self) -> str:
        """The name ``nvidia-smi`` reports for this card."""
        return str(self.value[0])

    @property
    def memory_bytes(self) -> int:
        """The card's memory in bytes."""
        return int(self.value[1])


def present_gpus() -> list[str]:
    """Names of the NVIDIA GPUs ``nvidia-smi`` lists (none when it is absent)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]

"""Where a benchmark ran, the head of every benchmark's JSON: the machine, lmplex's version and the git
commit (``provenance()``), so a committed figure names the run it came from."""

from __future__ import annotations

import os
import platform
import subprocess
from typing import Any

import lmplex


def git_commit() -> str:
    """The checkout's short commit, or ``unknown`` outside a git checkout."""
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance() -> dict[str, Any]:
    """``{"machine": {"platform", "cpus", "python"}, "lmplex": version, "commit": short hash}``."""
    return {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "lmplex": lmplex.__version__,
        "commit": git_commit(),
    }

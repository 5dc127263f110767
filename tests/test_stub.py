"""The hand-written stub ``lmplex/_core.pyi`` matches the compiled module (``mypy.stubtest``)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_stub_matches_runtime() -> None:
    pytest.importorskip("mypy.stubtest")
    done = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "lmplex._core"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr

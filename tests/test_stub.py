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


def test_every_model_config_field_has_a_getter_and_a_stub() -> None:
    """The getters and the stub are hand-listed: each serialised field must appear in both."""
    import ast
    import pathlib

    import lmplex

    name = "ModelConfig"
    fields = set(lmplex.ModelConfig("smollm2-135m-instruct").to_dict())
    missing_getters = sorted(f for f in fields if not hasattr(lmplex.ModelConfig, f))
    assert not missing_getters, missing_getters
    stub = pathlib.Path(lmplex.__file__).with_name("_core.pyi")
    tree = ast.parse(stub.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    stubbed = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    stubbed |= {
        n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    assert not sorted(fields - stubbed), sorted(fields - stubbed)

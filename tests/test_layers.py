"""The crates' files import one another in one direction: no crate has an import circle
(``scripts/import_graph``), and the check finds one where there is one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "import_graph"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_no_crate_has_an_import_circle() -> None:
    done = run()
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("no import circles in lmplex, lmplex-core,"), done.stdout


def test_a_circle_is_found_and_named(tmp_path: Path) -> None:
    src = tmp_path / "crates" / "toy" / "src"
    (src / "front").mkdir(parents=True)
    (src / "lib.rs").write_text("mod a;\nmod b;\nmod front;\n")
    (src / "a.rs").write_text("use crate::b::B;\n// crate::front is named in a comment only\n")
    (src / "b.rs").write_text("use crate::front::helper;\n")
    (src / "front" / "mod.rs").write_text("mod inner;\nuse crate::a::A;\npub fn helper() {}\n")
    (src / "front" / "inner.rs").write_text("use super::helper;\nuse crate::a::A;\n")
    done = run("--root", str(tmp_path), "--graph")
    assert done.returncode == 1, done.stdout + done.stderr
    graph = [line for line in done.stdout.splitlines() if "->" in line]
    # The comment names no import; a parent and its child never import each other.
    assert graph == ["toy: a -> b", "toy: b -> front", "toy: front -> a", "toy: front::inner -> a"], graph
    assert done.stdout.splitlines()[-1] == "toy: circle: a, b, front", done.stdout


def test_core_is_the_ground_floor() -> None:
    """lmplex-core depends on no other lmplex crate (docs/architecture.md's rule)."""
    import tomllib

    manifest = SCRIPT.parent.parent / "crates" / "lmplex-core" / "Cargo.toml"
    deps = tomllib.loads(manifest.read_text()).get("dependencies", {})
    assert deps and not [d for d in deps if d.startswith("lmplex")], sorted(deps)

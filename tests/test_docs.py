"""The README and docs/: links resolve, lines stay short, no git ids, and the README's example runs.

Rules checked on README.md and every ``docs/**/*.md``:

* every relative link (``[text](path)``, ``![alt](path)``, ``[ref]: path``) names an existing file or
  folder, relative to the page; ``http(s):``, ``mailto:`` and pure ``#anchor`` links are not checked,
  and a ``#fragment`` is stripped;
* no line is longer than ``MAX_LINE`` characters, and the README has at most ``MAX_README_LINES``;
* no token looks like a git commit id (7 to 40 hex digits with both a digit and a letter), and no
  session-history phrasing: these pages describe the code as it is.

The README's first ``python`` block runs as it is, in a subprocess with the installed package, on the
fetched SmolLM2 model (skipped without it, failed under ``LMPLEX_REQUIRE_MODELS=1``; see conftest).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SMOLLM2, fetched_model

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("**/*.md"))]
MAX_LINE = 160
MAX_README_LINES = 200
TIMEOUT_S = 300

INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
HEX_TOKEN = re.compile(r"\b[0-9a-f]{7,40}\b")
HISTORY = re.compile(r"\bthis session\b|\bsession-\d+|\bat commit\b|\buntil commit\b", re.IGNORECASE)
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def links(text: str) -> list[str]:
    """Link targets outside code blocks and inline code."""
    prose = FENCE.sub("", text)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    return INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)


def test_the_pages_exist() -> None:
    names = {page_id(p) for p in PAGES}
    for page in ("python", "server", "config", "tenants", "architecture", "performance", "cuda", "testing"):
        assert f"docs/{page}.md" in names


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^(https?:|mailto:)", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        resolved = (page.parent / path).resolve()
        if not resolved.exists():
            broken.append(target)
        elif ROOT not in (resolved, *resolved.parents):
            broken.append(f"{target} (outside the repository)")
    assert not broken, f"{page_id(page)}: links that do not resolve: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_lines_are_short(page: Path) -> None:
    lines = page.read_text(encoding="utf-8").splitlines()
    long = [(i, len(line)) for i, line in enumerate(lines, 1) if len(line) > MAX_LINE]
    assert not long, f"{page_id(page)}: lines over {MAX_LINE} characters (line, length): {long}"


def test_readme_is_short() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; at most {MAX_README_LINES}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_commit_ids_or_history(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    ids = [t for t in HEX_TOKEN.findall(text) if re.search(r"[0-9]", t) and re.search(r"[a-f]", t)]
    assert not ids, f"{page_id(page)}: tokens that look like git commit ids: {ids}"
    history = HISTORY.findall(text)
    assert not history, f"{page_id(page)}: session-history phrasing: {history}"


def first_python_block(text: str) -> str:
    for match in FENCE.finditer(text):
        if match.group(1) == "python":
            return match.group(2)
    raise AssertionError("README.md has no ```python block")


def test_readme_python_example_runs(tmp_path: Path) -> None:
    code = first_python_block(README.read_text(encoding="utf-8"))
    assert SMOLLM2 in code, "the README's first example is expected to use the default model"
    fetched_model(SMOLLM2)
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        check=False,
    )
    assert done.returncode == 0, f"the README's first python block failed:\n{done.stderr}"
    assert done.stdout.strip() != ""

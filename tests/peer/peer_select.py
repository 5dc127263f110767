"""Pytest plugin for run.py (``pytest -p peer_select``): keeps the selected upstream tests, records outcomes.

``LMPLEX_PEER_SELECT`` names a JSON file ``{"include": [regex, ...], "exclude": [regex, ...]}``. A test runs
when its node id matches an ``include`` pattern (``re.search``) and no ``exclude`` pattern; every other
collected test is deselected. At the end, ``LMPLEX_PEER_RESULT`` (if set) receives a JSON object with the
counts per outcome and the node ids that failed or errored.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = os.environ.get("LMPLEX_PEER_SELECT")
    if not path:
        return
    with open(path, encoding="utf-8") as f:
        selection = json.load(f)
    include = [re.compile(p) for p in selection.get("include", [".*"])]
    exclude = [re.compile(p) for p in selection.get("exclude", [])]

    def wanted(nodeid: str) -> bool:
        return any(p.search(nodeid) for p in include) and not any(p.search(nodeid) for p in exclude)

    keep = [item for item in items if wanted(item.nodeid)]
    dropped = [item for item in items if not wanted(item.nodeid)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


def pytest_terminal_summary(terminalreporter: Any) -> None:
    path = os.environ.get("LMPLEX_PEER_RESULT")
    if not path:
        return
    stats: dict[str, list[Any]] = terminalreporter.stats
    counts = {key: len(reports) for key, reports in stats.items() if key}
    failed = [
        report.nodeid
        for key in ("failed", "error")
        for report in stats.get(key, [])
        if getattr(report, "nodeid", "")
    ]
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"counts": counts, "failed": failed}, f, indent=1)

"""``scripts/soak`` in a short run: mixed chat, completions, streams (some cancelled by the client),
Responses, Messages, replayed calls and tokenize for two tenants; nothing lost, no 5xx, no panic, every
replay the first reply, the gauges back at idle and a clean exit. The memory drift is judged on the long
run (docs/testing.md), not in 30 seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_short_soak_loses_nothing(tmp_path: Path, smollm2_path: str) -> None:
    del smollm2_path  # the script resolves the same model
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "soak"), "--minutes", "0.5", "--rate", "3"]
    run = subprocess.run(
        [*cmd, "--sample-s", "2", "--json", str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.exists(), run.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["total_calls"] > 30 and set(report["calls"]) >= {"chat", "chat_stream", "replay"}, report
    assert report["statuses"].get("5xx", 0) == 0 and report["statuses"]["2xx"] > 0, report["statuses"]
    assert report["lost"] == 0, report["lost_examples"]
    assert report["replays_wrong"] == 0 and report["panics"] == 0 and report["server_exit"] == 0
    assert report["gauges_after"] == report["gauges_idle"], report

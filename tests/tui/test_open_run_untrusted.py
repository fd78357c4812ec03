"""The open-run dialog's list reads each run.json as the monitor does: one that is a symlink out
of its run directory, or a FIFO, shows as unreadable (or not at all), never its target's text,
never a hang."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tui.screens.open_run import list_runs

SECRET = "secret-from-elsewhere"


def test_a_symlinked_run_json_is_listed_unreadable_not_shown(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"state": "failed", "reason": SECRET}))
    root = tmp_path / "runs"
    (root / "20260101-000000-a").mkdir(parents=True)
    (root / "20260101-000000-a" / "run.json").symlink_to(elsewhere)
    (root / "20260101-000001-b").mkdir()
    os.mkfifo(root / "20260101-000001-b" / "run.json")
    rows = list_runs(root)
    assert [r.path.name for r in rows] == ["20260101-000000-a"]
    assert rows[0].state == "unreadable" and "symlink" in rows[0].reason
    assert SECRET not in rows[0].reason

"""What a person sees when the profiles dialog opens: the built-ins with model, cluster and last
use, the highlighted one's description, and the actions (an SVG snapshot; update it with
``pytest tests/profiles --snapshot-update`` after an intended change)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.plan.specs import demo_spec
from profiles.store import ProfileStore
from tests.profiles.test_profiles_screen import Host


def test_profiles_dialog_snapshot(snap_compare: Any, tmp_path: Path) -> None:
    app = Host(ProfileStore(tmp_path / "config"), spec=demo_spec(), current="4-node-h100-ib")
    assert snap_compare(app, terminal_size=(120, 30))

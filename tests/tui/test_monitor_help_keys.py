"""The monitor's help (`?`) explains every key the monitor binds in words, not with the binding's
one-word footer label (`d  Diagnose`, `k  Calibrate` said nothing about what they do)."""

from __future__ import annotations

from textual.binding import Binding

from tui.screens.monitor import MonitorScreen
from tui.screens.monitor_help import MORE, SKIP, key_rows


def test_every_monitor_key_is_explained() -> None:
    bindings = [b for b in MonitorScreen.BINDINGS if isinstance(b, Binding)]
    assert len(bindings) == len(MonitorScreen.BINDINGS)
    assert {b.action for b in bindings} - SKIP - set(MORE) == set()
    rows = dict(key_rows(bindings, can_go_back=True))
    assert rows["d"].startswith("ask every rank which collective")
    assert rows["k"].startswith("fit the plan's estimates")

"""Type-ahead in a real terminal (tmux, 120×40): keys typed the instant a screen shows, or the
instant a step opens, reach the field that will have the focus. "The instant": capture-pane is
polled until the first screen is there and the keys go at once, with nothing waited for in
between; each check then waits, with a deadline, for the field's text."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.e2e.test_tmux_wizard import EXE, Tmux
from tests.e2e.test_tmux_wizard import pytestmark as needs_tmux

pytestmark = [needs_tmux, pytest.mark.slow]

STARTS = int(__import__("os").environ.get("TA_STARTS", "20"))


def poll_for(tmux: Tmux, pattern: str, timeout: float = 60.0) -> bool:
    """Whether ``pattern`` (a regex) shows on the screen within ``timeout``; polled as fast as
    capture-pane answers, so keys sent next go the instant it shows."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if re.search(pattern, tmux.screen()):
            return True
        time.sleep(0.01)
    return False


def test_keys_typed_the_instant_the_wizard_or_a_step_shows_are_never_lost(
    tmp_path: Path,
) -> None:
    lost: list[str] = []
    for i in range(STARTS):
        tmux = Tmux(tmp_path)
        try:
            tmux.start(f"{EXE} --config-dir {tmp_path / 'profiles'}")
            assert poll_for(tmux, "1 Model"), f"start {i}: no first screen:\n{tmux.screen()}"
            # The Layers field (the demo's 4) has the focus once the step is built.
            tmux.keys("BSpace", "6")
            if not poll_for(tmux, r"Layers +6\b", timeout=15):
                lost.append(f"start {i}, Model: Layers reads\n{tmux.screen()}")
                continue
            # Three steps on, and the keys for the step that opens sent in the same breath.
            tmux.keys("C-n", "C-n", "C-n", "End", "C-u", "8192")
            if not poll_for(tmux, r"Sequence length +8192\b", timeout=15):
                lost.append(f"start {i}, Training: Sequence length reads\n{tmux.screen()}")
        finally:
            tmux.kill()
    assert not lost, f"{len(lost)} of {STARTS} starts lost keys; the first:\n{lost[0]}"

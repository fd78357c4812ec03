"""Issue 15's review in a real terminal at 80×24 (tmux): what a narrow terminal used to cut.

The status line under the steps ends where the terminal does; it used to read
``ddp · ddp · 85 ms/step · 6.05 K tok/s · fits`` and cut the verdict first on a longer plan.
The verdict now comes first and the framework is named only when it is not the strategy's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_tmux_wizard import EXE, Tmux
from tests.e2e.test_tmux_wizard import pytestmark as needs_tmux

pytestmark = [needs_tmux]


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    t = Tmux(tmp_path)
    yield t
    t.kill()


def test_status_line_verdict_survives_80_columns(tmux: Tmux, tmp_path: Path) -> None:
    tmux.start(f"{EXE} --config-dir {tmp_path / 'profiles'}; sleep 30")
    tmux.run("resize-window", "-t", "0", "-x", "80", "-y", "24")
    screen = tmux.wait_for("tok/s")  # the plan is ready (and its line is not cut before it)
    lines = screen.splitlines()
    assert max(len(x) for x in lines) <= 80, "the terminal is not 80 columns wide"
    status = next(x for x in lines if "◀ Back" in x)
    assert "fits · ddp · " in status and "ddp · ddp" not in status, status
    assert "Next ▶" in status  # nothing overlaps the Next button
    assert "Ctrl+L twice runs it" in screen  # the first screen still says how to run the demo

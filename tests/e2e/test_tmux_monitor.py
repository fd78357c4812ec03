"""The monitor in a real terminal (tmux, 120×40), real runs (the local CPU demo: torchrun over
gloo, two ranks): the journeys of issue 15.

1. The wizard launches the demo (Ctrl+L), the monitor shows it; ``esc`` goes back to the wizard
   while the run goes on; Open run… (``ctrl+g``) lists it and reopens its monitor; ``q`` leaves.
2. ``dtrain-tui monitor RUN_DIR`` on a run a launcher is running: Ctrl+X twice stops the run for
   real (through ``RUN/stop.request``); the screen shows it end ``stopped``, ranks ``stopped``,
   no errors; ``q`` quits with status 0, and the launcher has ended with every rank.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_tmux_wizard import EXE, Tmux, exit_status, then_exit_status
from tests.e2e.test_tmux_wizard import pytestmark as needs_tmux

pytestmark = [needs_tmux, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

MONITOR_READY = "Zoom"
"""In the monitor's footer only: the monitor is the screen with the focus and its keys."""


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    t = Tmux(tmp_path)
    yield t
    t.kill()


def wait_gone(tmux: Tmux, text: str, timeout: float = 30.0) -> str:
    """The screen once ``text`` has left it (a closed dialog)."""
    deadline = time.monotonic() + timeout
    while text in (screen := tmux.screen()):
        assert time.monotonic() < deadline, f"{text!r} never went; the screen was:\n{screen}"
        time.sleep(0.1)
    return screen


def wait_state(run: Path, states: set[str], timeout: float = 90.0) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        try:
            state = json.loads((run / "run.json").read_text()).get("state", "")
        except (OSError, ValueError):
            state = ""
        if state in states:
            return state
        time.sleep(0.2)
    raise AssertionError(f"{run} never reached {states} (last: {state!r})")


def test_demo_to_monitor_back_to_wizard_and_reopen_the_run(tmux: Tmux, tmp_path: Path) -> None:
    done = tmp_path / "exit-code"
    tmux.start(then_exit_status(f"{EXE} --config-dir {tmp_path / 'profiles'}", done))
    tmux.wait_for("tok/s")  # the plan is ready
    tmux.keys("C-l")  # the first Ctrl+L opens the Launch step, the second starts the run
    tmux.wait_for("Ctrl+L again")  # the Launch step is shown and ready
    tmux.keys("C-l")
    screen = tmux.wait_for(" monitor ", timeout=60)
    tmux.wait_for("rank 1", timeout=60)
    runs = tmp_path / "data" / "dtrain-tui" / "runs"
    run = next(runs.iterdir())
    # Back to the wizard: the monitor goes, the run does not. The monitor's own keys in the
    # footer prove it is the screen that takes the next key (its header shows earlier).
    tmux.wait_for(MONITOR_READY)
    tmux.keys("Escape")
    screen = tmux.wait_for("Open run")  # the wizard's footer
    assert " monitor " not in screen
    # Open run…: the run is listed; Enter shows its monitor again.
    tmux.keys("C-g")
    screen = tmux.wait_for(run.name)
    tmux.keys("Enter")
    tmux.wait_for(" monitor ")
    screen = tmux.wait_for("● succeeded", timeout=120)
    assert "r0✓" in screen and "r1✓" in screen
    tmux.wait_for(MONITOR_READY)
    # ? lists the monitor's keys, esc closes it.
    tmux.keys("?")
    screen = tmux.wait_for("Monitor keys")
    assert "back to the wizard" in screen and "full screen" in screen
    tmux.keys("Escape")
    wait_gone(tmux, "Monitor keys")
    tmux.wait_for(MONITOR_READY)
    # q leaves the monitor the same way: back to the wizard here.
    tmux.keys("q")
    screen = tmux.wait_for("Open run")
    assert " monitor " not in screen
    assert json.loads((run / "run.json").read_text())["state"] == "succeeded"
    tmux.keys("C-q")
    assert exit_status(done) == "0"


def test_ctrl_x_in_monitor_run_dir_stops_the_run(tmux: Tmux, tmp_path: Path) -> None:
    run = tmp_path / "run"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli",
            "launch",
            "--profile",
            "local-cpu-demo",
            "--steps",
            "100000",
            "--run-dir",
            str(run),
            "--quiet",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_state(run, {"running"})
        done = tmp_path / "exit-code"
        tmux.start(then_exit_status(f"{EXE} monitor {run}", done))
        tmux.wait_for("● running", timeout=60)
        tmux.wait_for("step ", timeout=90)  # the ranks are training
        tmux.keys("C-x")
        tmux.wait_for("press ctrl+x again")
        tmux.keys("C-x")
        screen = tmux.wait_for("● stopped", timeout=90)
        assert wait_state(run, {"stopped"}) == "stopped"
        screen = tmux.wait_for("r1■")  # the strip: both ranks stopped
        assert "r0■" in screen
        header = next(x for x in screen.splitlines() if " monitor " in x)
        assert "● stopped" in header and "error" not in header, screen  # the stop is no error
        assert "failed" not in screen and "lost" not in screen, screen
        assert launcher.wait(timeout=60) == 1  # the launcher ended the run: stopped
        tmux.keys("q")
        assert exit_status(done) == "0"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=30)

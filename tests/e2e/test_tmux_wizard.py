"""``dtrain-tui`` in a real terminal: tmux runs it at 120×40, send-keys walks the wizard to the
decision and writes the bundle, capture-pane reads the screen. Each test has its own tmux socket
(``-L``), so tests running side by side never see each other's sessions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

EXE = Path(sys.executable).parent / "dtrain-tui"

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Tmux:
    def __init__(self, workdir: Path) -> None:
        self.socket = f"dtrain-test-{uuid.uuid4().hex[:12]}"
        self.workdir = workdir

    def run(self, *args: str) -> str:
        out = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30
        )
        return out.stdout

    def start(self, command: str) -> None:
        env = {
            "HOME": str(self.workdir),
            "XDG_CONFIG_HOME": str(self.workdir / "cfg"),
            "XDG_DATA_HOME": str(self.workdir / "data"),
            "TERM": "xterm-256color",
        }
        env_args = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
        subprocess.run(
            [
                "tmux",
                "-L",
                self.socket,
                "-f",
                os.devnull,
                "new-session",
                "-d",
                "-x",
                "120",
                "-y",
                "40",
                "-c",
                str(self.workdir),
                *env_args,
                command,
            ],
            check=True,
            timeout=30,
        )

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "0", *keys)

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "0")

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{text!r} never appeared; the screen was:\n{screen}")

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def then_exit_status(command: str, done: Path) -> str:
    """``command``, then its exit status written to ``done`` whole, then a pause that keeps the
    pane open. The status goes to a side file renamed into place: a plain ``> done`` creates
    the file empty before the status is in it, and a test waiting for the file can read it then."""
    return f"{command}; echo $? > {done}.part; mv {done}.part {done}; sleep 30"


def exit_status(done: Path, timeout: float = 30.0) -> str:
    """The exit status :func:`then_exit_status` wrote, once it is there."""
    deadline = time.monotonic() + timeout
    while not done.exists():
        assert time.monotonic() < deadline, f"no exit status in {done} within {timeout}s"
        time.sleep(0.1)
    return done.read_text().strip()


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    t = Tmux(tmp_path)
    yield t
    t.kill()


def test_wizard_in_tmux_reaches_the_decision_and_writes_the_bundle(
    tmux: Tmux, tmp_path: Path
) -> None:
    done = tmp_path / "exit-code"
    tmux.start(then_exit_status(f"{EXE} --config-dir {tmp_path / 'profiles'}", done))
    tmux.wait_for("1 Model")  # the first screen
    tmux.wait_for("tok/s")  # the status line: the plan is ready
    tmux.keys("C-n", "C-n", "C-n", "C-n")
    tmux.wait_for("› 5 Decision")
    # The answer first: the plan in one line with its margin, its memory card beside it (the
    # flowchart and the Why come below, a scroll away at 80x24).
    screen = tmux.wait_for("margin")
    assert "fits" in screen and "★ ddp" in screen
    tmux.keys("C-n")
    tmux.wait_for("› 6 Configs")
    tmux.wait_for("launch_node0.sh")
    tmux.keys("C-s")
    screen = tmux.wait_for("✓ wrote")
    bundle = tmp_path / "dtrain-bundle"
    assert str(bundle) in screen.replace("\n", "") or "dtrain-bundle" in screen
    plan = json.loads((bundle / "plan.json").read_text())
    assert plan["world_size"] >= 1
    assert (bundle / "launch_node0.sh").exists() and (bundle / "bundle.json").exists()
    tmux.keys("C-q")
    assert exit_status(done) == "0"

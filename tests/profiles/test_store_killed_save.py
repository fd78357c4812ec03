"""A save killed outright (SIGKILL) leaves its temp file; the next save clears it, and never
the temp file of a writer that is still alive."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from engine.plan.specs import demo_spec
from profiles.store import ProfileStore

# A child that saves a profile and is stopped for good between writing and renaming.
_STUCK_SAVE = """
import os, sys
from engine import fsio
from engine.plan.specs import demo_spec
from profiles.store import ProfileStore

def stuck(src, dst):
    print("written", flush=True)
    sys.stdin.read()  # never returns: the test kills us here

fsio.os.replace = stuck
ProfileStore(sys.argv[1]).save_spec("victim", demo_spec())
"""


def _temps(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".tmp"))


def test_temp_of_a_killed_save_is_cleared_by_the_next_save(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "config")
    child = subprocess.Popen(
        [sys.executable, "-c", _STUCK_SAVE, str(store.config_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "written\n"  # the temp file exists now
    assert len(_temps(store.profiles_dir)) == 1
    # While its writer lives, the temp file is not stale.
    store.save_spec("other", demo_spec())
    assert len(_temps(store.profiles_dir)) == 1
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    store.save_spec("other", demo_spec())
    assert _temps(store.profiles_dir) == []
    assert sorted(p.name for p in store.profiles_dir.iterdir()) == ["other.toml"]

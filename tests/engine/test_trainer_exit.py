"""The example trainer leaves without the interpreter's finalization once its work is done: Gloo
worker threads still holding async work can abort a process there (SIGABRT, "terminate called
without an active exception"), which fails a run that trained to the end. Shown by an exit
handler that never runs, while the run's last line and exit code are intact."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.e2e.launch_util import make_bundle

WRAP = """
import atexit, runpy, sys
atexit.register(lambda: print("FINALIZED", flush=True))
train = sys.argv[1]
sys.argv = [train, "--bundle", sys.argv[2], "--steps", "1", "--device", "cpu"]
runpy.run_path(train, run_name="__main__")
"""


def test_the_trainer_exits_0_after_its_last_line_without_finalization(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b", steps=1)
    p = subprocess.run(
        [sys.executable, "-c", WRAP, str(bundle / "train.py"), str(bundle)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert "[dtrain] done steps=1" in p.stdout
    assert "FINALIZED" not in p.stdout

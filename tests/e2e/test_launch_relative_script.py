"""``launch --script fail.py`` (issue 40): a relative script names a file in the user's working
directory, not in the bundle the run starts from; a real local launch (torchrun over gloo)
runs it, and its own error line is what the run reports, not "can't open file …/bundle/…"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.launch_util import REPO, free_port

SPEC = [
    "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--gpu", "cpu",
    "--gpus-per-node", "1", "--seq-len", "32", "--global-batch", "2",
]  # fmt: skip


def test_a_relative_script_is_the_users_file(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "fail.py").write_text("raise SystemExit('fail.py: bad data at step 3')\n")
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "DTRAIN_CONFIG_DIR": str(tmp_path / "cfg")}
    r = subprocess.run(
        [
            sys.executable, "-m", "cli", "launch", *SPEC, "--script", "fail.py",
            "--master-port", str(free_port()), "--run-dir", str(run),
        ],
        cwd=work, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "can't open file" not in out, out
    assert "fail.py: bad data at step 3" in out, out

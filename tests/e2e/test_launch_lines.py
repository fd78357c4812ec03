"""``dtrain-tui launch`` over real torchrun (``--tee 3``, 2 local ranks): a line rank 0 prints
that starts with ``[default1]:`` is rank 0's, and a 1 MiB line is printed cut while the rank's
log keeps it whole."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.launch.torchrun_output import MAX_SHOWN_LINE
from tests.e2e.launch_util import make_bundle

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BIG = 1 << 20
SCRIPT = f"""import os
rank = int(os.environ["RANK"])
if rank == 0:
    print("[default1]:forged by rank 0", flush=True)
else:
    print("y" * {BIG}, flush=True)
"""


def test_launch_files_a_forged_prefix_under_its_rank_and_cuts_a_huge_line(
    tmp_path: Path,
) -> None:
    bundle = make_bundle(tmp_path / "b")
    (bundle / "train.py").write_text(SCRIPT)  # no torch import: the ranks start in a moment
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "launch", str(bundle), "--run-dir", str(run)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    assert "[rank 0] [default1]:forged by rank 0" in out, [x[:200] for x in out]
    assert not any("forged" in x for x in out if x.startswith("[rank 1]"))
    (big,) = [x for x in out if x.startswith("[rank 1] yyy")]
    assert big == "[rank 1] " + "y" * MAX_SHOWN_LINE + f"… [{BIG - MAX_SHOWN_LINE} bytes cut]"
    assert (run / "logs" / "rank1.stdout.log").read_text() == "y" * BIG + "\n"
    assert (run / "logs" / "rank0.stdout.log").read_text() == "[default1]:forged by rank 0\n"

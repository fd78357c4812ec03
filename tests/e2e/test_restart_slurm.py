"""A batch script that requeues itself, on the real two-node Slurm (tests/e2e/slurm_cluster.py):
written with ``--max-restarts 1`` and submitted with plain ``sbatch`` (no dtrain-tui in between),
its first srun fails (a rank exits 3 once), the script runs ``scontrol requeue`` and the
requeued job (SLURM_RESTART_COUNT=1) completes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.launch_util import free_port, write_bundle
from tests.e2e.slurm_cluster import SlurmCluster, slurm_cluster
from tests.e2e.test_launch_slurm import _job_gone

pytestmark = pytest.mark.slow
__all__ = ["slurm_cluster"]  # the fixture, used by name

ONCE = """\
import os, sys
from pathlib import Path
rank = os.environ["RANK"]
mark = Path.cwd() / f"failed-once-{rank}"
print(f"[dtrain] step=1/1 loss=1.0 restart={os.environ.get('SLURM_RESTART_COUNT', '0')}",
      flush=True)
if rank == "3" and not mark.exists():
    mark.write_text("x")
    sys.exit(3)
"""


def test_sbatch_requeues_itself_after_a_failed_srun(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    script = tmp_path / "once.py"
    script.write_text(ONCE)
    bundle = write_bundle(
        tmp_path / "b", "--script", str(script), "--max-restarts", "1", nodes=2, steps=1
    )
    env = {
        **slurm_cluster.env,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "MASTER_PORT": str(free_port()),
    }
    r = subprocess.run(
        ["sbatch", "--parsable", "slurm.sbatch"],
        cwd=bundle,
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    batch = bundle / f"slurm-{job}.out"
    state = _job_gone(slurm_cluster, job, 400)
    text = batch.read_text() if batch.exists() else ""
    assert state == "COMPLETED", f"{state}\n{text}"
    assert "requeueing job" in text and "(restart 1 of 1)" in text, text
    assert "srun exit code 0" in text and "(restart 1)" in text, text

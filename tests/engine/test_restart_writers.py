"""With ``--max-restarts N`` the Slurm batch script requeues itself on a failed srun (``#SBATCH
--requeue``, ``scontrol requeue`` while SLURM_RESTART_COUNT < N, resuming with
DTRAIN_RESUME=auto) and the SkyPilot task is a managed job with recovery settings
(``resources.job_recovery.max_restarts_on_errors``), read back by SkyPilot's own loader. Without
it neither changes (the golden bundles pin that)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from engine.write import write_bundle
from tests.engine.writers_fixtures import make_plan


def test_sbatch_requeues_itself_up_to_n_times(tmp_path: Path) -> None:
    write_bundle(make_plan(launch={"max_restarts": 2}), tmp_path)
    text = (tmp_path / "slurm.sbatch").read_text()
    assert "#SBATCH --requeue" in text and "#SBATCH --open-mode=append" in text
    assert '"${SLURM_RESTART_COUNT:-0}" -lt 2 ]]' in text
    assert 'scontrol requeue "$SLURM_JOB_ID"' in text
    assert 'export DTRAIN_RESUME="${DTRAIN_RESUME:-auto}"' in text
    # The requeue comes before the end mark the launcher reads as the job's end.
    assert text.index("scontrol requeue") < text.index('echo "[dtrain-tui] srun exit code')
    subprocess.run(["bash", "-n", str(tmp_path / "slurm.sbatch")], check=True)


def test_no_requeue_without_max_restarts(tmp_path: Path) -> None:
    write_bundle(make_plan(), tmp_path)
    assert "requeue" not in (tmp_path / "slurm.sbatch").read_text()
    assert "job_recovery" not in (tmp_path / "sky.yaml").read_text()


def test_sky_task_is_a_managed_job_that_recovers(tmp_path: Path) -> None:
    import sky

    write_bundle(make_plan(launch={"max_restarts": 3}), tmp_path)
    text = (tmp_path / "sky.yaml").read_text()
    assert "#   sky jobs launch sky.yaml" in text
    task = sky.Task.from_yaml(str(tmp_path / "sky.yaml"))
    (res,) = list(task.resources)
    assert res.job_recovery is not None and res.job_recovery["max_restarts_on_errors"] == 3
    assert "--max-restarts 0" in (task.run or "")

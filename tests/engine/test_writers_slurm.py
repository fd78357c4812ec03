"""``slurm.sbatch`` as text: its ``#SBATCH`` lines for CPU and GPU plans and for every Slurm
field, bash's own syntax check, the spec's one-line refusals of bad Slurm values, and the parsing
of what Slurm prints (``scontrol show job``, srun's task errors). The script is run through the
real ``sbatch`` in ``tests/e2e/test_launch_slurm.py``."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from cli import main
from engine.launch.slurm_cli import JobInfo, field_of, task_exits
from engine.plan.specs import LaunchSpec
from engine.write import render_bundle
from engine.write.slurm import sbatch_options, slurm_sbatch
from tests.engine.writers_fixtures import golden_plans, make_plan


def _directives(text: str) -> list[str]:
    return [
        line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH")
    ]


def test_cpu_plan_asks_one_task_per_node_and_cpus_for_its_ranks() -> None:
    text = slurm_sbatch(make_plan(nodes=2, gpus_per_node=2))
    d = _directives(text)
    assert "--nodes=2" in d and "--ntasks-per-node=1" in d and "--cpus-per-task=2" in d
    assert not any(x.startswith(("--gpus", "--partition", "--time")) for x in d)
    assert "--output=slurm-%j.out" in d
    assert "srun --kill-on-bad-exit=1" in text
    assert "--output=logs/slurm-%j_%t.out" in text and "--error=logs/slurm-%j_%t.err" in text
    assert 'n="./launch_node${SLURM_NODEID}.sh"' in text
    # Under the node reaper when the launcher put it there, else the script alone, said.
    assert 'exec python3 -I .dtrain-reaper.py --node bash "$n"' in text
    assert 'is not stopped at its end" >&2; exec bash "$n"' in text
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in text
    assert "NodeAddr=" in text
    # Directives must come before the first command, or sbatch ignores them.
    lines = text.splitlines()
    first_cmd = next(i for i, x in enumerate(lines) if x and not x.startswith("#"))
    assert all(i < first_cmd for i, x in enumerate(lines) if x.startswith("#SBATCH"))


def test_gpu_plan_and_every_slurm_field() -> None:
    plan = golden_plans()["llama7b_8xa100_zero2"]
    launch = {
        "slurm_partition": "gpu",
        "slurm_account": "proj-42",
        "slurm_qos": "high",
        "slurm_constraint": "a100&ib",
        "slurm_reservation": "maint_1",
        "slurm_time_limit": "1-12:00:00",
    }
    plan = plan.model_copy(
        update={"spec": plan.spec.model_copy(update={"launch": LaunchSpec(**launch)})}
    )
    d = _directives(slurm_sbatch(plan))
    assert f"--gpus-per-node={plan.gpus_per_node}" in d
    assert not any(x.startswith("--cpus-per-task") for x in d)
    for opt in (
        "--partition=gpu",
        "--account=proj-42",
        "--qos=high",
        "--constraint=a100&ib",
        "--reservation=maint_1",
        "--time=1-12:00:00",
    ):
        assert opt in d
    assert sbatch_options(plan.spec.launch)[0] == "--partition=gpu"


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_script_is_valid_bash(tmp_path: Path) -> None:
    path = tmp_path / "slurm.sbatch"
    path.write_text(slurm_sbatch(make_plan(nodes=2, launch={"remote_setup": "true"})))
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_bundle_has_it() -> None:
    for plan in golden_plans().values():
        assert "slurm.sbatch" in render_bundle(plan)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("slurm_time_limit", "1h", "not a Slurm time limit"),
        ("slurm_time_limit", "10:61", "not a Slurm time limit"),
        ("slurm_partition", "gpu;rm -rf", "a Slurm name"),
        ("slurm_constraint", "a100 ib", "a Slurm constraint"),
    ],
)
def test_bad_slurm_values_are_refused(field: str, value: str, says: str) -> None:
    with pytest.raises(ValidationError) as err:
        LaunchSpec(**{field: value})
    assert says in str(err.value)


@pytest.mark.parametrize(
    "value", ["90", "10:30", "2:00:00", "1-12", "1-12:30", "1-0:0:0", "UNLIMITED"]
)
def test_good_time_limits(value: str) -> None:
    assert LaunchSpec(slurm_time_limit=value).slurm_time_limit == value


def test_cli_bad_time_limit_is_one_line_naming_the_field() -> None:
    err = io.StringIO()
    # Refused before anything is planned, written or submitted.
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["launch", "--params", "1e8", "--backend", "slurm", "--time-limit", "2h"])
    lines = err.getvalue().splitlines()
    assert code == 2 and len(lines) == 1, err.getvalue()
    assert "launch.slurm_time_limit" in lines[0] and "'2h' is not a Slurm time limit" in lines[0]


def test_job_info_and_srun_lines_are_parsed() -> None:
    job = JobInfo.parse(
        "JobId=7 JobName=x JobState=PENDING Reason=PartitionTimeLimit Restarts=2 "
        "ExitCode=143:0 NodeList=n[1-2] TimeLimit=00:10:00"
    )
    assert (job.state, job.reason, job.restarts, job.exit_code) == (
        "PENDING",
        "PartitionTimeLimit",
        2,
        143,
    )
    assert not job.final and JobInfo.parse("JobId=7 JobState=TIMEOUT").final
    assert task_exits("srun: error: n2: task 1: Killed") == {1: -9}
    assert task_exits("srun: error: n1: task 0: Terminated") == {0: -15}
    assert task_exits("srun: error: n1: tasks 0-2: Exited with exit code 3") == {0: 3, 1: 3, 2: 3}
    assert task_exits("[default0]: hello") == {}
    assert field_of("invalid partition specified: x") == "launch.slurm_partition"
    assert field_of("Invalid --time specification") == "launch.slurm_time_limit"

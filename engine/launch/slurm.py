"""Slurm backend: submit the bundle's ``slurm.sbatch`` (:mod:`engine.write.slurm`) with
``sbatch`` on this machine (a login node) or, with ``--login-host``, on a login node over SSH
(:mod:`engine.launch.slurm_runner`: the same logic, the commands and file reads go there), follow
the job with ``scontrol show job``, stream each task's output file into the run directory and the
events, and stop it with ``scancel``.

Called through :func:`engine.launch.make_backend` (``launch --backend slurm``, the wizard).
The job runs from the run directory's copy of the bundle (``sbatch --chdir``); the submitting
environment goes with it (sbatch's ``--export=ALL``): ``DTRAIN_RUN_ID`` tags every process of
the run, this Python's ``bin`` comes first on ``PATH`` (a login node shares its file system with
the compute nodes), and the ``SLURM_*`` variables of an allocation dtrain-tui may run in are
dropped. ``srun`` writes task *t*'s stdout and stderr to ``logs/slurm-<job>_<t>.out`` / ``.err``:
task *t* is node *t*, and torchrun's ``[default<local_rank>]:`` prefix gives the global rank. The
batch script's own output (``slurm-<job>.out``) is node 0's own lines; srun's ``srun: error: n2:
task 1: Killed`` lines there give each node's exit.

Job states become run.json: ``PENDING`` keeps the run ``starting`` with Slurm's reason (a reason
Slurm never gets past by waiting, :data:`~engine.launch.slurm_cli.NEVER_REASONS`, fails the run
and cancels the job); ``RUNNING`` is ``running`` on the allocated nodes (their names replace the
placeholders in run.json); ``COMPLETED`` / ``FAILED`` end through each node's exit (torchrun's
failure table names the rank); ``TIMEOUT``, ``NODE_FAIL``, ``OUT_OF_MEMORY``, ``PREEMPTED`` …
fail the run naming the state; ``CANCELLED`` by someone else is a user's stop. A requeue is a
line and ``slurm.json``'s ``restarts``. Stop = ``scancel`` (``--signal=KILL`` first after
``kill()``), then waiting until Slurm reports the job ended: nothing of it is left on any node.
A hang (or a diagnose request, or a rank's collective-timeout line) first asks the ranks for
their Flight Recorder dumps (:mod:`engine.launch.frdump`) with one ``srun --overlap`` step in
the job, one task per node (:func:`dump_srun`), through the same runner as every other command.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.fsio import atomic_write_text
from engine.launch import reaper
from engine.launch.base import LaunchBackend
from engine.launch.driver import DumpReach, RunControl
from engine.launch.guard import ReaperGuard
from engine.launch.options import LaunchOptions
from engine.launch.pump import ControlLine, Split
from engine.launch.run_state import LaunchError, RunContext
from engine.launch.slurm_cli import (
    NEVER_REASONS,
    JobInfo,
    field_of,
    hostnames,
    partitions,
    show_job,
    slurm_message,
    task_exits,
)
from engine.launch.slurm_runner import LocalRunner, SlurmRunner, SshRunner
from engine.plan.specs import Host
from engine.rundir.events import STDERR, STDOUT, RunStateChanged
from engine.rundir.record import RunState
from engine.write.slurm import NODE_REAPER, SBATCH_NAME, batch_log_name, task_log_name

POLL_S = 1.0
"""How often the job's state is asked of slurmctld (``scontrol show job``) and the output files
are read when nothing new was there."""
CANCEL_WAIT_S = 60.0
"""After ``scancel``, how long to wait for Slurm to report the job ended (its KillWait, 30 s by
default, lies between SIGTERM and SIGKILL)."""
SLURM_JSON = "slurm.json"
"""The job's id, state, reason, restart count and nodes, next to run.json."""
_FAIL_STATES = {
    "TIMEOUT": "reached its time limit{limit} and was ended by Slurm",
    "NODE_FAIL": "lost a node (NODE_FAIL)",
    "OUT_OF_MEMORY": "ran out of memory (OUT_OF_MEMORY)",
    "PREEMPTED": "was preempted by Slurm",
    "BOOT_FAIL": "could not boot its nodes (BOOT_FAIL)",
    "DEADLINE": "missed its deadline (DEADLINE)",
}


def dump_srun(job_id: str, nodes: int, run_id: str) -> list[str]:
    """``srun`` that runs the dump request on each of the job's ``nodes``, one task per node,
    beside the job's own step (``--overlap``: it takes none of the job's resources away)."""
    from engine.launch.frdump import dump_script

    return [
        "srun",
        "--overlap",
        f"--jobid={job_id}",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        "--quiet",
        "bash",
        "-c",
        dump_script(run_id, None, node_var="SLURM_NODEID"),
    ]


def refusal(stderr: str, env: dict[str, str], runner: SlurmRunner) -> LaunchError:
    """sbatch's refusal as one line naming the field (an unknown partition lists the known)."""
    msg = slurm_message(stderr)
    fld = field_of(msg)
    if fld == "launch.slurm_partition":
        known = partitions(env, runner.run)
        if known:
            msg += f" (sinfo lists: {', '.join(known)})"
    return LaunchError(f"Slurm refused the job: {msg}", field=fld)


def submit_command(workdir: str, sbatch_args: Sequence[str], login: Host | None) -> str:
    """The submission as a user would type it on this machine (each node's command.txt)."""
    cmd = f"cd {workdir} && sbatch {' '.join([*sbatch_args, SBATCH_NAME])}"
    if login is None:
        return cmd
    port = f" -p {login.port}" if login.port else ""
    dest = f"{login.user}@{login.host}" if login.user else login.host
    return f"ssh{port} {dest} {shlex.quote(cmd)}"


def slurm_json(job_id: str | None, job: JobInfo | None, restarts: int, hosts: list[str]) -> str:
    """The text of :data:`SLURM_JSON` for the job as last seen (None: just submitted)."""
    data = {
        "job_id": job_id,
        "state": job.state if job else "SUBMITTED",
        "reason": job.reason if job else "",
        "restarts": restarts,
        "nodelist": job.nodelist if job else "",
        "hosts": hosts,
    }
    return json.dumps(data, indent=2) + "\n"


@dataclass
class BatchExits:
    """srun's per-task exits and the script's end line, read from the batch output as it
    comes (:meth:`feed`, the batch log's follower)."""

    task_codes: dict[int, int] = field(default_factory=dict)
    """Exit code of each task srun named (task *t* is node *t*)."""
    srun_rc: int | None = None
    """srun's own exit code, once the batch script printed it."""
    _tail: bytes = b""

    def feed(self, data: bytes) -> None:
        data, self._tail = self._tail + data, b""
        cut = data.rfind(b"\n") + 1
        data, self._tail = data[:cut], data[cut:]
        for raw in data.decode("utf-8", "replace").splitlines():
            self.task_codes.update(task_exits(raw))
            if raw.startswith("[dtrain-tui] srun exit code "):
                with contextlib.suppress(ValueError):
                    self.srun_rc = int(raw.rsplit(" ", 1)[1])


class SlurmDriver:
    """Submits the run as one Slurm batch job (one task per node), follows it, cancels it."""

    dump_reach: DumpReach = DumpReach.ALL_NODES
    split: Split | None = None
    control: ControlLine | None = None

    def __init__(self, ctx: RunContext, *, sbatch_args: Sequence[str] = ()) -> None:
        self.ctx = ctx
        self.sbatch_args = list(sbatch_args)
        """Options put before the script on sbatch's command line (they win over #SBATCH)."""
        self.job_id: str | None = None
        self.job: JobInfo | None = None
        """The job as last seen."""
        self.restarts = 0
        self._job_ended = threading.Event()
        """Set once the job is over and its final state was acted on: the output files are
        then read to their end and every node counts as finished."""
        self._job_over = False
        """Slurm reported a final state: nothing of the job runs, no scancel is needed."""
        self._hosts_set = False
        self._exits = BatchExits()
        self._cancelled = False
        self._watcher: threading.Thread | None = None
        self._control: RunControl | None = None
        """The supervisor, once the job is followed: what the job's end fails or stops."""
        self._env: dict[str, str] = {}
        self._reaper = ReaperGuard()
        login = self.ctx.options.login_host
        self._runner: SlurmRunner = (
            LocalRunner() if login is None else SshRunner(self.ctx.options, login)
        )
        self._workdir = ""
        """The bundle's directory where the job runs (on the login node with --login-host)."""

    def hosts(self) -> list[str]:
        """Placeholders until Slurm allocates the nodes (then their names, in run.json too)."""
        return [f"slurm-node{i}" for i in range(self.ctx.manifest.nodes)]

    # ------------------------------------------------------------------ start

    def _sbatch(self, *extra: str) -> Any:
        where = self._workdir  # the job's working directory: never relative
        argv = ["sbatch", *extra, f"--chdir={where}", *self.sbatch_args, SBATCH_NAME]
        return self._runner.run(argv, env=self._env, cwd=where)

    def start_nodes(self) -> None:
        if not (self.ctx.run.bundle / SBATCH_NAME).is_file():
            raise LaunchError(
                f"{SBATCH_NAME} is missing from the bundle; write it again with dtrain-tui write",
                field="bundle",
            )
        self._env = self._runner.job_env(self.ctx.node_env())
        if isinstance(self._runner, LocalRunner):
            # Killed outright after sbatch, this launcher leaves the job to the reaper's
            # scancel (over SSH, the runner's guard channel does it on the login node).
            self._reaper.start(self.ctx.run_id, self.ctx.run.path)
        self._runner.connect()
        for note in self._runner.notes:
            self.ctx.note(note)
        # The child subreaper each task's script runs under (the sbatch script's srun line).
        shutil.copyfile(reaper.__file__, self.ctx.run.bundle / NODE_REAPER)
        self._workdir = self._runner.put_bundle(self.ctx.run.bundle, self.ctx.run_id)
        # Ask Slurm first: an unknown partition or a bad time limit is one line naming the field.
        test = self._sbatch("--test-only")
        if test.returncode != 0:
            raise refusal(test.stderr, self._env, self._runner)
        r = self._sbatch("--parsable")
        if r.returncode != 0:
            raise refusal(r.stderr, self._env, self._runner)
        self.job_id = r.stdout.strip().split(";")[0]
        if not self.job_id.isdigit():
            raise LaunchError(f"sbatch said {r.stdout.strip()!r}, not a job id")
        self._runner.guard(self.job_id, self._env)
        cmd = submit_command(self._workdir, self.sbatch_args, self.ctx.options.login_host)
        for i in range(self.ctx.manifest.nodes):
            self.ctx.run.write_command(i, f"{cmd}  # job {self.job_id}, task {i} is node {i}")
        self._write_slurm_json()
        follow = self._runner.follow
        batch = follow(f"{self._workdir}/{batch_log_name(self.job_id)}", self._job_ended)
        batch.on_data = self._exits.feed
        self.ctx.add_stream(0, STDOUT, batch.read)
        for i in range(self.ctx.manifest.nodes):
            for stream in (STDOUT, STDERR):
                name = task_log_name(self.job_id, i, stream)
                f = follow(f"{self._workdir}/{name}", self._job_ended)
                self.ctx.add_stream(i, stream, f.read)

    def follow(self, control: RunControl) -> None:
        """Follow the submitted job on a thread of its own; its end fails or stops the run
        through ``control`` (the supervisor). Called once the run started."""
        self._control = control
        self._watcher = threading.Thread(target=self._watch, name="dtrain-slurm", daemon=True)
        self._watcher.start()

    # ------------------------------------------------------------------ following the job

    def _watch(self) -> None:
        assert self.job_id is not None
        errors = 0
        while not self.ctx.final.is_set():
            try:
                job = show_job(self.job_id, self._env, self._runner.run)
                errors = 0
            except LaunchError as e:
                errors += 1
                if errors == 3:
                    self.ctx.say(0, f"cannot read slurm job {self.job_id}: {e} (retrying)")
                self.ctx.final.wait(POLL_S)
                continue
            if job is None:  # forgotten by slurmctld (MinJobAge): ended long ago
                self._job_over = True
                self._job_ended.set()
                return
            self._seen(job)
            if job.final:
                self._ended(job)
                return
            self.ctx.final.wait(POLL_S)

    def _seen(self, job: JobInfo) -> None:
        old, self.job = self.job, job
        if job.state == "PENDING":
            self.ctx.hang.restart()  # waiting in the queue is not a hang
        if job.restarts > self.restarts:
            self.restarts = job.restarts
            self.ctx.say(0, f"slurm job {job.job_id} was requeued (restart {job.restarts})")
        if not self._hosts_set and job.nodelist not in ("", "(null)", "None"):
            self._hosts_set = self._allocated(job)
        if old is not None and (old.state, old.reason, old.nodelist) == (
            job.state,
            job.reason,
            job.nodelist,
        ):
            return
        self._write_slurm_json()
        if job.state == "PENDING":
            self._pending(job)
        elif job.state == "RUNNING" and (old is None or old.state != "RUNNING"):
            self._running(job)

    def _pending(self, job: JobInfo) -> None:
        why = NEVER_REASONS.get(job.reason)
        text = f"slurm job {job.job_id} pending" + (
            f" ({job.reason})" if job.reason != "None" else ""
        )
        if why is not None:
            # On a thread of its own: failing cancels the job and waits for this watcher to
            # see it end.
            threading.Thread(
                target=self._fail_run,
                args=(None, None, f"slurm job {job.job_id} can never start: {job.reason}: {why}"),
                daemon=True,
            ).start()
            return
        self.ctx.record(state=RunState.STARTING, reason=text)
        self.ctx.emit(RunStateChanged(RunState.STARTING, text, time.time()))
        self.ctx.say(0, text)

    def _allocated(self, job: JobInfo) -> bool:
        """Put the allocated nodes' names in place of the placeholders; True when done."""
        try:
            names = hostnames(job.nodelist, self._env, self._runner.run)
        except LaunchError:
            return False
        if len(names) != len(self.ctx.nodes):
            return False
        self._set_hosts(names)
        return True

    def _running(self, job: JobInfo) -> None:
        restart = f" (restart {job.restarts})" if job.restarts else ""
        text = f"slurm job {job.job_id} running on {job.nodelist}{restart}"
        self.ctx.record(state=RunState.RUNNING, reason="")
        self.ctx.emit(RunStateChanged(RunState.RUNNING, text, time.time()))
        self.ctx.say(0, text)

    def _set_hosts(self, names: list[str]) -> None:
        """The allocated node names in place of the placeholders (events and run.json)."""
        for st, name in zip(self.ctx.nodes, names, strict=True):
            st.host = name
        self.ctx.run.set_hosts(names)

    def _ended(self, job: JobInfo) -> None:
        """The job reached a final state: blame what Slurm did before the nodes' exits count."""
        self._job_over = True
        if job.state == "CANCELLED" and not self._cancelled and not self.ctx.stop_requested:
            self._stop_run(f"slurm job {job.job_id} was cancelled outside dtrain-tui (scancel)")
        elif job.state in _FAIL_STATES:
            limit = f" ({job.time_limit})" if job.time_limit else ""
            what = _FAIL_STATES[job.state].format(limit=limit)
            self._fail_run(None, None, f"slurm job {job.job_id} {what}")
        elif job.state == "FAILED" and job.reason not in ("NonZeroExitCode", "None"):
            # Slurm could not start the batch script or srun's tasks (no output of ours).
            self._fail_run(
                None, None, f"slurm job {job.job_id} failed: {job.reason} (see slurmd's log)"
            )
        self._job_ended.set()

    def _write_slurm_json(self) -> None:
        text = slurm_json(self.job_id, self.job, self.restarts, [st.host for st in self.ctx.nodes])
        try:
            atomic_write_text(self.ctx.run.path / SLURM_JSON, text)
        except OSError as e:
            self.ctx.dir_failed(e)

    # ------------------------------------------------------------------ supervision hooks

    def node_exit(self, node: int) -> tuple[bool, int | None]:
        if not self._job_ended.is_set():
            return False, None
        job = self.job
        if job is not None and job.state == "COMPLETED":
            return True, 0
        if node in self._exits.task_codes:
            return True, self._exits.task_codes[node]
        if self._cancelled or self.ctx.stop_requested:
            return True, -15
        if self._exits.task_codes:  # another task failed; srun named no failure of this one
            return True, 0 if self._exits.srun_rc is None else -15
        code = (
            self._exits.srun_rc
            if self._exits.srun_rc is not None
            else (job.exit_code if job else None)
        )
        return True, code or 1

    def _cancel(self, *, now: bool) -> None:
        if self.job_id is None or self._job_over:
            return
        self._cancelled = True
        run = self._runner.run
        if now:
            run(["scancel", "--full", "--signal=KILL", self.job_id], env=self._env)
        r = run(["scancel", self.job_id], env=self._env)
        if r.returncode != 0 and "already completing or completed" not in r.stderr:
            raise LaunchError(f"scancel {self.job_id}: {slurm_message(r.stderr)}")

    def kill_node(self, node: int, reason: str) -> None:
        if node != 0:
            return  # one job: cancelling it (node 0's turn) stops every node
        killed = self.ctx.force.is_set()
        self._cancel(now=killed)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while not self._job_over and time.monotonic() < deadline:
            if self.ctx.force.wait(0.2) and not killed:  # kill(): SIGKILL now, once
                killed = True
                self._cancel(now=True)

    def kill_node_now(self, node: int) -> None:
        if node == 0:
            self._cancel(now=True)

    def ask_dumps(self, node: int | None) -> int:
        """SIGUSR1 to the ranks on every node of the running job, for their Flight Recorder
        dumps (:mod:`engine.launch.frdump`): one ``srun --overlap`` step inside the job (here or
        on the login node) runs :func:`~engine.launch.frdump.dump_script` once per node; each
        task prints how many it signalled. The answers come through the task output files."""
        job = self.job
        if self.job_id is None or self._job_over or job is None or job.state != "RUNNING":
            return 0
        r = self._runner.run(
            dump_srun(self.job_id, self.ctx.manifest.nodes, self.ctx.run_id), env=self._env
        )
        if r.returncode != 0 and not r.stdout.strip():
            raise LaunchError(f"srun into job {self.job_id}: {slurm_message(r.stderr)}")
        return sum(int(w) for w in r.stdout.split() if w.isdigit())

    def teardown_after_failed_start(self) -> None:
        with contextlib.suppress(Exception):
            self._cancel(now=True)
        self._job_ended.set()
        self._reaper.done()
        self._runner.close()

    def close(self) -> None:
        if not self._job_over:
            # The run ended on our side first (a hang, a full disk): the job must not outlive it.
            with contextlib.suppress(Exception):
                self._cancel(now=True)
        self._write_slurm_json()
        self._reaper.done()
        self._runner.close()

    def _fail_run(self, rank: int | None, node: int | None, reason: str) -> None:
        if self._control is not None:
            self._control.fail(rank, node, reason)

    def _stop_run(self, reason: str) -> None:
        if self._control is not None:
            self._control.request_stop(reason)


class SlurmBackend(LaunchBackend):
    """The whole run is one Slurm batch job, one task per node."""

    name = "slurm"

    def __init__(
        self,
        bundle_dir: Path,
        run_dir: Path | None = None,
        options: LaunchOptions | None = None,
        *,
        sbatch_args: Sequence[str] = (),
    ) -> None:
        ctx = RunContext(bundle_dir, run_dir, options, backend=self.name)
        self.driver: SlurmDriver = SlurmDriver(ctx, sbatch_args=sbatch_args)
        super().__init__(ctx, self.driver)

    @property
    def sbatch_args(self) -> list[str]:
        return self.driver.sbatch_args

    @property
    def job_id(self) -> str | None:
        return self.driver.job_id

    @property
    def job(self) -> JobInfo | None:
        """The job as last seen."""
        return self.driver.job

    @property
    def restarts(self) -> int:
        return self.driver.restarts

    def start(self) -> None:
        super().start()
        self.driver.follow(self.supervisor)

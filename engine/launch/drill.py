"""The fault drill (``dtrain-tui drill``, the wizard's Launch step): does this bundle survive?

:func:`run_drill` runs the bundle once uninterrupted as the reference (its losses recorded as
they are printed), then again under the restart policy (:mod:`engine.launch.restart`), SIGKILLing
a random rank's process at a random step, ``kills`` times (seeded). ``kill=node`` takes a whole
node down instead (:func:`kill_node`: every process of that node's part of the run at once, as a
lost machine would), ``kill=mixed`` rank and node kills by turns. Each recovery holds when the
restart resumed from the newest complete checkpoint on disk, redid no more than one checkpoint
interval of steps (plus the step in flight), and every loss printed equals the reference's at that
step. It measures the time to detect (kill to the attempt's end), to restart (kill to every rank
running again) and to be back at the lost step. A script that never resumes (no ``[dtrain]
resumed from step=`` line, its steps again from 1) fails, saying so.

Local runs only (it kills processes on this machine). Nothing waits by sleeping: the loop polls
the run's events with a timeout and every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from engine.launch.options import LaunchOptions
from engine.launch.reaper import pids_with_env
from engine.launch.restart import AttemptWatch, RestartingRun, RestartPolicy
from engine.rundir.record import RunState

__all__ = ["DrillReport", "KillMode", "Recovery", "kill_node", "run_drill"]

CKPT_MARKER = "COMPLETE"
CKPT_PREFIX = "step_"
DEADLINE_S = 900.0
"""The longest one run of the drill may take before it is stopped and the drill fails."""


class KillMode(StrEnum):
    """What one kill of the drill takes down."""

    RANK = "rank"
    """One rank's training process."""
    NODE = "node"
    """A whole node: its launch script, torchrun's agent and every rank on it."""
    MIXED = "mixed"
    """Rank and node kills by turns, the first of them chosen at random."""


@dataclass
class Recovery:
    """One kill and what came of it."""

    attempt: int
    rank: int | None
    """The rank a rank kill takes down; None for a node kill."""
    planned_step: int
    node: int | None = None
    """The node a node kill takes down; None for a rank kill."""
    ranks: tuple[int, ...] = ()
    """A node kill's ranks: the node's by the bundle's layout, then those found killed."""
    killed_step: int | None = None
    killed_at: float | None = None
    newest_ckpt: int | None = None
    """The newest complete checkpoint on disk once the killed attempt ended."""
    resumed_from: int | None = None
    steps_redone: int | None = None
    detect_s: float | None = None
    restart_s: float | None = None
    back_s: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.killed_at is not None

    @property
    def target(self) -> str:
        """What the kill takes down: ``rank 1``, ``node 1 (ranks 2-3)``."""
        if self.node is None:
            return f"rank {self.rank}"
        return f"node {self.node}" + (f" ({_ranks_text(self.ranks)})" if self.ranks else "")

    def line(self) -> str:
        def s(v: float | None) -> str:
            return f"{v:.1f}s" if v is not None else "-"

        head = (
            f"kill {self.attempt}: {self.target} at step {self.killed_step}: "
            f"resumed from {self.resumed_from} (newest complete {self.newest_ckpt}), "
            f"{self.steps_redone} step(s) redone; detect {s(self.detect_s)}, "
            f"restart {s(self.restart_s)}, back at step {self.killed_step} {s(self.back_s)}"
        )
        return head + (": " + "; ".join(self.problems) if self.problems else ": held")


@dataclass
class DrillReport:
    every: int = 0
    steps: int = 0
    reference: dict[int, str] = field(default_factory=dict)
    recoveries: list[Recovery] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Problems of the drill as a whole (the reference failed, the final losses differ)."""

    @property
    def ok(self) -> bool:
        return not self.problems and bool(self.recoveries) and all(r.ok for r in self.recoveries)

    def lines(self) -> list[str]:
        out = [r.line() for r in self.recoveries]
        out += self.problems
        verdict = "passed" if self.ok else "FAILED"
        held = sum(r.ok for r in self.recoveries)
        out.append(
            f"drill {verdict}: {held} of {len(self.recoveries)} recover(ies) held "
            f"(checkpoint every {self.every} step(s), {self.steps} steps)"
        )
        return out


def rank_pid(run_id: str, rank: int) -> int | None:
    """The pid of global ``rank``'s training process in run ``run_id`` (not torchrun's agent,
    which has no LOCAL_RANK)."""
    for pid in pids_with_env("DTRAIN_RUN_ID", run_id):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and any(e.startswith(b"LOCAL_RANK=") for e in env):
            return pid
    return None


def _ranks_text(ranks: tuple[int, ...]) -> str:
    """``rank 2``, ``ranks 2-3`` (a run of consecutive ranks), ``ranks 0, 3``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def _proc(pid: int) -> tuple[int, int, list[bytes]] | None:
    """``(ppid, pgid, environ)`` of a living process; None for a zombie or one gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[2]), env


def _env_int(env: list[bytes], key: bytes) -> int | None:
    for item in env:
        if item.startswith(key + b"="):
            try:
                return int(item[len(key) + 1 :])
            except ValueError:
                return None
    return None


def node_processes(run_id: str, node: int) -> tuple[list[int], list[int], list[int]]:
    """Node ``node``'s part of run ``run_id`` on this machine: the pids torchrun started there
    (``GROUP_RANK=node`` in their environment: the ranks and what they started), the global
    ranks among them, and the process groups of their parents that belong to the run: the node
    script's (the local backend starts each in a session of its own, :mod:`engine.launch.local`;
    its subreaper, bash and torchrun's agent carry no GROUP_RANK), and a rank's own when it is
    the parent. Ranks sit in sessions of their own, so neither the group nor GROUP_RANK alone
    finds all of it."""
    procs = {pid: p for pid in pids_with_env("DTRAIN_RUN_ID", run_id) if (p := _proc(pid))}
    pids: list[int] = []
    ranks: list[int] = []
    groups: set[int] = set()
    for pid, (ppid, _, env) in procs.items():
        if _env_int(env, b"GROUP_RANK") != node:
            continue
        pids.append(pid)
        rank = _env_int(env, b"RANK")
        if rank is not None and _env_int(env, b"LOCAL_RANK") is not None:
            ranks.append(rank)
        if ppid in procs:  # the run's own process: never a group outside the run
            groups.add(procs[ppid][1])
    groups.discard(os.getpgrp())
    return sorted(pids), sorted(set(ranks)), sorted(g for g in groups if g > 1)


def kill_node(run_id: str, node: int) -> tuple[list[int], list[int], list[int]] | None:
    """SIGKILL every process of node ``node``'s part of run ``run_id`` (:func:`node_processes`),
    its process groups first: the launcher sees the node's script killed and its ranks gone at
    once, as on a machine lost. What :func:`node_processes` found; None (nothing signalled) when
    none of the node's ranks is running."""
    pids, ranks, groups = found = node_processes(run_id, node)
    if not ranks:
        return None
    for g in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(g, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return found


def newest_complete(ckpt_dir: Path) -> int | None:
    """The step of the newest checkpoint whose completion marker is written."""
    best: int | None = None
    try:
        entries = list(ckpt_dir.iterdir())
    except OSError:
        return None
    for d in entries:
        if d.name.startswith(CKPT_PREFIX) and (d / CKPT_MARKER).exists():
            try:
                step = int(d.name.removeprefix(CKPT_PREFIX))
            except ValueError:
                continue
            best = step if best is None else max(best, step)
    return best


def _saved(ckpt_dir: Path) -> bool:
    """Whether a kill now tests a resume: a checkpoint is complete, or the script never began
    one (it does not checkpoint: the drill then shows it does not resume). One being written
    is waited for, so a kill on a loaded machine does not land before the first save ends."""
    if newest_complete(ckpt_dir) is not None:
        return True
    try:
        return not any(d.name.startswith(CKPT_PREFIX) for d in ckpt_dir.iterdir())
    except OSError:
        return True


def _plan_every(bundle_dir: Path) -> int:
    try:
        data = json.loads((bundle_dir / "plan.json").read_text())
        every = data.get("checkpoint", {}).get("every")
        return int(every) if isinstance(every, int) and every > 0 else 0
    except (OSError, ValueError, AttributeError):
        return 0


def _drive(
    run: RestartingRun,
    on_tick: Callable[[], None],
    cancel: threading.Event,
    deadline_s: float,
) -> None:
    end = time.monotonic() + deadline_s
    while not run.done:
        if cancel.is_set() or time.monotonic() > end:
            run.kill("stopped: the drill was cancelled or ran past its deadline")
            run.wait(60)
            return
        run.poll(0.1)
        on_tick()


def run_drill(
    bundle_dir: Path,
    work_dir: Path,
    *,
    kills: int = 1,
    seed: int = 0,
    every: int | None = None,
    kill: KillMode | str = KillMode.RANK,
    options: LaunchOptions | None = None,
    say: Callable[[str], None] = print,
    cancel: threading.Event | None = None,
    deadline_s: float = DEADLINE_S,
) -> DrillReport:
    """The drill on ``bundle_dir``; its runs go under ``work_dir`` (``reference/``, ``drill/``).
    ``kill``: what each kill takes down (:class:`KillMode`)."""
    mode = KillMode(kill)
    cancel = cancel or threading.Event()
    options = options or LaunchOptions()
    report = DrillReport()
    rng = random.Random(seed)
    bundle_dir = Path(bundle_dir)
    work_dir = Path(work_dir)
    from engine.write.manifest import read_manifest

    manifest = read_manifest(bundle_dir)

    # 1. The reference: uninterrupted, fresh (nothing resumed).
    say("drill: reference run (uninterrupted)")
    ref_opts = replace(options, env={**options.env, "DTRAIN_RESUME": "never"})
    ref = RestartingRun.for_bundle(
        "local", bundle_dir, work_dir / "reference", ref_opts, RestartPolicy(), name=manifest.name
    )
    ref.start()
    _drive(ref, lambda: None, cancel, deadline_s)
    if not _record_reference(report, ref):
        return report
    plan_steps = _schedule_kills(report, bundle_dir, kills, every, rng, say)
    if plan_steps is None:
        return report
    report.recoveries = _targets(plan_steps, mode, rng, manifest.nodes, manifest.gpus_per_node)

    # 2. The drill: the same job, killed K times, restarted by the policy.
    what = "" if mode == KillMode.RANK else f", {mode} kills"
    say(
        f"drill: {kills} kill(s) at step(s) {', '.join(map(str, plan_steps))} "
        f"(seed {seed}, checkpoint every {report.every}{what})"
    )
    env = {**options.env, "DTRAIN_RESUME": "auto", "DTRAIN_CKPT_EVERY": str(report.every)}

    def before_attempt(n: int, backend: object, watch: AttemptWatch) -> None:
        if n >= 2 and n - 2 < len(report.recoveries):  # the killed attempt is over
            report.recoveries[n - 2].newest_ckpt = newest_complete(ckpt_dir)

    run = RestartingRun.for_bundle(
        "local",
        bundle_dir,
        work_dir / "drill",
        replace(options, env=env),
        RestartPolicy(max_restarts=kills, backoff_s=0.5, max_backoff_s=2.0),
        name=manifest.name,
        on_attempt=before_attempt,
    )
    ckpt_dir = Path(run.options.env["DTRAIN_CKPT_DIR"])
    run.start()

    def tick() -> None:
        _observe(run, report, kills, ckpt_dir, say)

    _drive(run, tick, cancel, deadline_s)
    tick()
    _judge(report, run.watches, run.state, run.record.reason)
    return report


def _record_reference(report: DrillReport, ref: RestartingRun) -> bool:
    """Keep the reference run's losses and step count in ``report``; False (with the problem
    noted) when it failed or printed too few steps to drill on."""
    watch = ref.watches[-1]
    report.reference = dict(watch.losses)
    report.steps = max(watch.losses, default=0)
    if ref.state != RunState.SUCCEEDED:
        report.problems.append(f"the reference run {ref.state}: {ref.record.reason}")
        return False
    if report.steps < 2:
        report.problems.append(
            "the reference run printed fewer than 2 `[dtrain] step=N/T loss=X` lines; "
            "the drill needs the script's steps and losses"
        )
        return False
    return True


def _schedule_kills(
    report: DrillReport,
    bundle_dir: Path,
    kills: int,
    every: int | None,
    rng: random.Random,
    say: Callable[[str], None],
) -> list[int] | None:
    """Choose the checkpoint interval (into ``report.every``) and each kill's step; the kill
    steps, or None (with the problem noted) when the run is too short for them."""
    fit = max(1, report.steps // (2 * (kills + 1)))  # a few checkpoints before each kill
    planned = _plan_every(bundle_dir)
    if not every and planned > fit:
        say(
            f"drill: the plan checkpoints every {planned} steps, more than this run's "
            f"{report.steps}; the drill checkpoints every {fit} to test the restarts"
        )
    report.every = every or (planned if 0 < planned <= fit else fit)
    lo = report.every + 1
    if report.steps - lo < kills:
        report.problems.append(
            f"{report.steps} steps leave no room for {kills} kill(s) after the first checkpoint "
            f"(every {report.every}); pass fewer --kills or a smaller --every"
        )
        return None
    return sorted(rng.sample(range(lo, report.steps), kills))


def _targets(
    plan_steps: list[int], mode: KillMode, rng: random.Random, nodes: int, gpus: int
) -> list[Recovery]:
    """Each kill's target, drawn from ``rng`` after the steps: a rank of the world, or a node
    and its ranks (node ``n`` holds ranks ``n * gpus`` to ``n * gpus + gpus - 1``). Rank kills
    draw as they always did, so a seed repeats an older drill."""
    kinds = [mode] * len(plan_steps)
    if mode == KillMode.MIXED:
        first = rng.randrange(2)
        kinds = [(KillMode.RANK, KillMode.NODE)[(first + i) % 2] for i in range(len(plan_steps))]
    out: list[Recovery] = []
    for i, (step, kind) in enumerate(zip(plan_steps, kinds, strict=True)):
        if kind == KillMode.RANK:
            out.append(Recovery(attempt=i + 1, rank=rng.randrange(nodes * gpus), planned_step=step))
            continue
        node = rng.randrange(nodes)
        ranks = tuple(range(node * gpus, node * gpus + gpus))
        out.append(Recovery(i + 1, rank=None, planned_step=step, node=node, ranks=ranks))
    return out


def _observe(
    run: RestartingRun,
    report: DrillReport,
    kills: int,
    ckpt_dir: Path,
    say: Callable[[str], None],
) -> None:
    """One look at the drill run: kill the planned rank once its step is reached (and a
    checkpoint saved), and time the previous kill's detection, restart and return."""
    n = len(run.watches)
    w = run.watches[-1]
    backend = run.current
    if backend is None:
        return
    if n <= kills:
        r = report.recoveries[n - 1]
        if r.killed_at is None and (w.last_step or 0) >= r.planned_step and _saved(ckpt_dir):
            at, step = time.time(), w.last_step
            what = _kill(backend.run_id, r)
            if what is not None:
                r.killed_step, r.killed_at = step, at
                say(f"drill: SIGKILL {what} at step {step}")
    if n >= 2 and n - 2 < len(report.recoveries):
        r = report.recoveries[n - 2]
        ended = run.watches[n - 2].ended
        if r.killed_at is not None and r.detect_s is None and ended is not None:
            r.detect_s = ended - r.killed_at
        if r.killed_at is not None and r.restart_s is None and w.running_at is not None:
            r.restart_s = w.running_at - r.killed_at
        k = r.killed_step
        if r.back_s is None and r.killed_at is not None and k is not None and k in w.step_seen:
            r.back_s = w.step_seen[k] - r.killed_at


def _kill(run_id: str, r: Recovery) -> str | None:
    """SIGKILL the recovery's target now; what was killed, or None when it is not running."""
    if r.node is None:
        pid = rank_pid(run_id, r.rank) if r.rank is not None else None
        if pid is None:
            return None
        os.kill(pid, signal.SIGKILL)
        return f"rank {r.rank} (pid {pid})"
    found = kill_node(run_id, r.node)
    if found is None:
        return None
    pids, ranks, groups = found
    r.ranks = tuple(ranks)
    groups_text = "".join(f"; process group {g}" for g in groups)
    pids_text = ", ".join(map(str, pids))
    return f"node {r.node} ({_ranks_text(r.ranks)}; pid(s) {pids_text}{groups_text})"


def _judge(report: DrillReport, watches: list[AttemptWatch], state: RunState, reason: str) -> None:
    ref = report.reference
    for r in report.recoveries:
        if r.killed_at is None:
            r.problems.append(
                f"never killed: attempt {r.attempt} did not reach step {r.planned_step}"
            )
            continue
        if r.attempt >= len(watches):
            r.problems.append("no restart followed the kill")
            continue
        prev, nxt = watches[r.attempt - 1], watches[r.attempt]
        r.resumed_from = nxt.resumed_from
        first = min(nxt.step_seen, default=None)
        if nxt.resumed_from is None:
            again = " and its losses restart from step 1" if first == 1 else ""
            r.problems.append(
                f"attempt {r.attempt + 1} did not resume: no `[dtrain] resumed from step=N` "
                f"line{again}; the script never resumes from a checkpoint (it must load the "
                "newest one in DTRAIN_CKPT_DIR when DTRAIN_RESUME=auto; see docs/resilience.md)"
            )
            continue
        if r.newest_ckpt is not None and nxt.resumed_from != r.newest_ckpt:
            r.problems.append(
                f"resumed from step {nxt.resumed_from}, not the newest complete checkpoint "
                f"(step {r.newest_ckpt})"
            )
        r.steps_redone = max(0, (prev.last_step or 0) - nxt.resumed_from)
        if r.steps_redone > report.every + 1:
            r.problems.append(
                f"{r.steps_redone} steps redone, more than one interval ({report.every} steps "
                "plus the step in flight)"
            )
    for i, w in enumerate(watches):
        for step, loss in sorted(w.losses.items()):
            if step in ref and ref[step] != loss:
                report.problems.append(
                    f"attempt {i + 1}, step {step}: loss {loss}, the reference's {ref[step]}: "
                    "the resumed run does not train the same"
                )
                break
    last = watches[-1] if watches else None
    if state != RunState.SUCCEEDED:
        report.problems.append(f"the drilled run {state}: {reason}")
    elif last is None or report.steps not in last.losses:
        report.problems.append(f"the drilled run never printed its last step ({report.steps})")

"""The restart policy: a run that survives its ranks' failures (``launch --max-restarts N``).

A collaborator of the launch backends, not one of them: it uses only their public API
(:func:`engine.launch.make_backend`, ``start`` / ``poll`` / ``wait`` / ``state`` / ``stop`` /
``kill`` and the :class:`engine.rundir.record.RunRecord` they keep). When a rank fails or hangs the
backend already stops every rank and records the cause; :class:`RestartingRun` then starts a new
backend on the same bundle, whose ranks resume from the newest complete checkpoint
(``DTRAIN_RESUME=auto``: the bundle's checkpoint directory is shared by every attempt), up to
:attr:`RestartPolicy.max_restarts` times, waiting a back-off between attempts (on an Event, so a
stop ends the wait at once).

Layout: attempt N runs in ``RUN/attempts/N/`` (its own run.json, logs and bundle copy, as any
run); ``RUN/run.json`` is the summary: the newest attempt's record with the run's overall state
and the ``attempts`` list (start, end, cause, resumed-from step, nodes, work lost). The monitor
follows the newest attempt.

A failure that repeats on the same node leaves that node out when a spare host is given
(:attr:`RestartPolicy.spare_hosts`, SSH), said in one line. torchrun's own ``--max-restarts``
stays 0 in the bundle: it restarts one node's workers only, from step 0 of a rendezvous the
other nodes left; the policy restarts the whole run instead.

With :attr:`LaunchOptions.allow_shrink` (``--allow-shrink``), a node whose failure repeats when
no spare is left is left out too: the bundle's spec (plan.json) is re-planned for one node fewer
keeping the global batch (:func:`shrunk_plan`: more gradient accumulation), written into the
next attempt's directory (``RUN/attempts/N/bundle``) and launched; its ranks resume from the
same checkpoint directory, resharded on load (DCP: DDP and FSDP). DeepSpeed and Megatron bundles
are refused, as is a plan that does not fit or cannot keep the batch: the run then ends with one
line saying why.

:class:`RestartingRun` answers what the ``launch`` command's loop asks of a backend (``done``,
``poll``, ``request_stop``, ``kill``, ``stopping``, ``state``, ``exit_code``, ``run``), so it
drives either.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from engine.errors import DtrainError, one_line
from engine.launch.base import LaunchBackend
from engine.launch.options import LaunchOptions
from engine.plan.names import Framework
from engine.plan.result import Plan
from engine.plan.specs import Host
from engine.rundir.events import Event, LineBatch, LineEvent, RunStateChanged
from engine.rundir.files import iso, new_run_dir
from engine.rundir.record import RUN_JSON, AttemptRecord, RunRecord, RunState

__all__ = ["AttemptWatch", "RestartPolicy", "RestartingRun", "shrunk_plan"]

STEP_RE = re.compile(r"\[dtrain\] step=(\d+)/\d+ loss=(\S+)")
RESUMED_RE = re.compile(r"\[dtrain\] resumed from step=(\d+) ")
CKPT_RE = re.compile(r"\[dtrain\] checkpoint step=(\d+) dir=")
ATTEMPTS = "attempts"


@dataclass(frozen=True)
class RestartPolicy:
    """When and how to relaunch a failed run."""

    max_restarts: int = 0
    """Relaunch at most this many times (0: never, the run ends with its first failure)."""
    backoff_s: float = 1.0
    """Wait before the first restart; doubled each time, up to :attr:`max_backoff_s`."""
    max_backoff_s: float = 30.0
    spare_hosts: tuple[Host, ...] = ()
    """SSH: hosts that take the place of a node whose failure repeats."""

    def delay(self, restart: int) -> float:
        """Back-off before restart number ``restart`` (1 for the first)."""
        return float(min(self.max_backoff_s, self.backoff_s * 2 ** max(0, restart - 1)))


@dataclass
class AttemptWatch:
    """What one attempt's ranks said that the policy needs: steps, losses, checkpoints."""

    started: float = field(default_factory=time.time)
    running_at: float | None = None
    ended: float | None = None
    """When the attempt's backend was seen ended."""
    resumed_from: int | None = None
    last_step: int | None = None
    step_seen: dict[int, float] = field(default_factory=dict)
    """Step -> when a rank first printed it."""
    losses: dict[int, str] = field(default_factory=dict)
    """Step -> rank 0's loss as printed."""
    checkpoints: dict[int, float] = field(default_factory=dict)
    """Complete checkpoint step -> when it was said."""

    def feed(self, rank: int | None, lines: tuple[str, ...], now: float) -> None:
        for line in lines:
            if "[dtrain]" not in line:
                continue
            if m := STEP_RE.search(line):
                n = int(m.group(1))
                self.step_seen.setdefault(n, now)
                self.last_step = max(n, self.last_step or 0)
                if rank in (0, None):
                    self.losses[n] = m.group(2)
            elif m := RESUMED_RE.search(line):
                self.resumed_from = int(m.group(1))
            elif m := CKPT_RE.search(line):
                self.checkpoints.setdefault(int(m.group(1)), now)


BackendFactory = Callable[[Path, LaunchOptions], LaunchBackend]


class _RunView:
    """What a caller reads of ``backend.run``: the summary's path and record."""

    def __init__(self, owner: RestartingRun) -> None:
        self._owner = owner

    @property
    def path(self) -> Path:
        return self._owner.path

    @property
    def record(self) -> RunRecord:
        return self._owner.record


class RestartingRun:
    """Attempts of one run on one bundle: start, watch, relaunch on failure (see the module)."""

    def __init__(
        self,
        make: BackendFactory,
        options: LaunchOptions,
        policy: RestartPolicy,
        run_dir: Path | None = None,
        *,
        name: str = "run",
        on_attempt: Callable[[int, LaunchBackend, AttemptWatch], None] | None = None,
    ) -> None:
        self._make = make
        self.options = options
        self.policy = policy
        self.path = Path(run_dir) if run_dir is not None else new_run_dir(name)
        self.run = _RunView(self)
        self.record = RunRecord(name=name, state=RunState.STARTING)
        self.attempts: list[AttemptRecord] = []
        self.watches: list[AttemptWatch] = []
        self.current: LaunchBackend | None = None
        self._on_attempt = on_attempt
        self._events: queue.Queue[list[Event]] = queue.Queue()
        self._stop = threading.Event()
        self._stop_reason = ""
        self._force = False
        self._final = threading.Event()
        self._state = RunState.STARTING
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._spares = list(policy.spare_hosts)
        self.bundle_dir: Path | None = None  # the attempts' bundle (for_bundle; a shrink's)

    @classmethod
    def for_bundle(
        cls,
        kind: str,
        bundle_dir: Path,
        run_dir: Path | None,
        options: LaunchOptions,
        policy: RestartPolicy,
        *,
        name: str = "run",
        on_attempt: Callable[[int, LaunchBackend, AttemptWatch], None] | None = None,
    ) -> RestartingRun:
        """Attempts of ``make_backend(kind, bundle_dir, ...)``, every one resuming from the
        newest complete checkpoint in one directory all of them share: ``DTRAIN_CKPT_DIR`` when
        the options set it, else ``RUN/checkpoints`` (local) or
        ``REMOTE_WORKDIR/<run>/checkpoints`` on each node (SSH; a multi-node run with sharded
        checkpoints wants a path every node shares, set it with ``--env DTRAIN_CKPT_DIR=...``)."""
        from engine.launch import make_backend

        run = cls(  # the newest shrink's bundle (--allow-shrink), else the one given
            lambda d, o: make_backend(kind, run.bundle_dir or bundle_dir, d, o),
            options,
            policy,
            run_dir,
            name=name,
            on_attempt=on_attempt,
        )
        env = dict(options.env)
        env.setdefault("DTRAIN_RESUME", "auto")
        if "DTRAIN_CKPT_DIR" not in env:
            if kind == "ssh":
                env["DTRAIN_CKPT_DIR"] = f"{options.remote_workdir}/{run.path.name}/checkpoints"
            else:
                env["DTRAIN_CKPT_DIR"] = str((run.path / "checkpoints").absolute())
        run.options = replace(options, env=env)
        run.bundle_dir = Path(bundle_dir)
        return run

    # ------------------------------------------------------------ what launch's loop reads

    @property
    def state(self) -> RunState:
        return self._state

    @property
    def stopping(self) -> str:
        return self._stop_reason

    @property
    def done(self) -> bool:
        return self._final.is_set() and self._events.empty()

    def exit_code(self) -> int:
        return 0 if self._state == RunState.SUCCEEDED else 1

    def poll(self, timeout: float) -> list[Event]:
        out: list[Event] = []
        try:
            out.extend(self._events.get(timeout=timeout))
            while True:
                out.extend(self._events.get_nowait())
        except queue.Empty:
            pass
        return out

    def wait(self, timeout: float | None = None) -> RunState:
        self._final.wait(timeout)
        return self._state

    def supervise(self) -> None:
        """Nothing to do: the attempts' thread watches (for launch's loop, as a backend)."""

    def request_stop(self, reason: str = "stopped by the user") -> None:
        with self._lock:
            if not self._stop_reason:
                self._stop_reason = reason
            self._stop.set()
            backend = self.current
        if backend is not None:
            backend.request_stop(reason)

    def stop(self) -> None:
        self.request_stop()
        self._final.wait(60)

    def kill(self, reason: str = "stopped by the user") -> None:
        self._force = True
        self.request_stop(reason)
        if self.current is not None:
            self.current.kill(reason)

    # ------------------------------------------------------------ the attempts

    def start(self) -> None:
        """Start the first attempt (its start failing is raised as for a backend), then watch
        and relaunch on a thread of its own."""
        self.path.mkdir(parents=True, exist_ok=True)
        backend = self._begin(1, self.options, excluded="")
        self._thread = threading.Thread(
            target=self._attempts_loop, args=(backend,), name="dtrain-restart", daemon=True
        )
        self._thread.start()

    def _begin(
        self, n: int, options: LaunchOptions, *, excluded: str, shrunk_from: int | None = None
    ) -> LaunchBackend:
        rel = f"{ATTEMPTS}/{n}"
        backend = self._make(self.path / rel, options)
        watch = AttemptWatch()
        attempt = AttemptRecord(
            attempt=n,
            run_dir=rel,
            state=RunState.STARTING,
            started_at=iso(watch.started),
            hosts=backend.hosts,
            excluded=excluded,
            nodes=len(backend.hosts),
            shrunk_from=shrunk_from,
        )
        with self._lock:
            self.current = backend
            self.attempts.append(attempt)
            self.watches.append(watch)
        if self._on_attempt is not None:
            self._on_attempt(n, backend, watch)
        try:
            backend.start()
        except BaseException:
            self._end_attempt(backend)
            self._finish(RunState.FAILED, backend.run.record.reason or "start failed")
            raise
        watch.running_at = time.time()
        self._summary(RunState.RUNNING)
        return backend

    def _attempts_loop(self, backend: LaunchBackend) -> None:
        n = 1
        options = self.options
        try:
            while True:
                self._pump(backend)
                self._end_attempt(backend)
                state = backend.state
                rec = backend.run.record
                if state != RunState.FAILED or self._stop.is_set():
                    self._finish(state, rec.reason)
                    return
                if n > self.policy.max_restarts:
                    why = rec.reason
                    if self.policy.max_restarts:
                        why = f"{why} (gave up after {self.policy.max_restarts} restart(s))"
                    self._finish(RunState.FAILED, why)
                    return
                delay = self.policy.delay(n)
                try:
                    options, excluded, shrunk_from = self._next_nodes(options, n + 1)
                except DtrainError as e:  # --allow-shrink cannot go on: why, in one line
                    self._finish(RunState.FAILED, f"{rec.reason}; {e.message}")
                    return
                self._say(
                    f"attempt {n} failed: {rec.reason}; restarting in {delay:.1f}s "
                    f"(restart {n} of {self.policy.max_restarts})"
                    + (f"; {excluded}" if excluded else "")
                )
                if self._stop.wait(delay):
                    self._finish(RunState.STOPPED, self._stop_reason or "stopped by the user")
                    return
                n += 1
                try:
                    backend = self._begin(n, options, excluded=excluded, shrunk_from=shrunk_from)
                except Exception as e:  # noqa: BLE001 - _begin ended the run, said here once
                    self._say(f"restart {n - 1} could not start: {e}")
                    return
                if self._stop.is_set():  # a stop asked while it was starting
                    backend.request_stop(self._stop_reason or "stopped by the user")
        except BaseException as e:  # never leave the caller waiting on a run that is gone
            if not self._final.is_set():
                self._finish(RunState.FAILED, f"restart policy failed: {type(e).__name__}: {e}")
            raise

    def _pump(self, backend: LaunchBackend) -> None:
        """Forward the attempt's events until it ended, reading the ranks' steps."""
        watch = self.watches[-1]
        while not backend.done:
            events = backend.poll(0.2)
            if not events:
                continue
            now = time.time()
            for ev in events:
                if isinstance(ev, LineBatch):
                    watch.feed(ev.rank, ev.lines, now)
                elif isinstance(ev, LineEvent):
                    watch.feed(ev.rank, (ev.line,), now)
            self._events.put(events)

    def _end_attempt(self, backend: LaunchBackend) -> None:
        rec = backend.run.record
        watch = self.watches[-1]
        watch.ended = watch.ended or time.time()
        i = len(self.attempts) - 1
        redone, lost = _work_lost(self.watches[i - 1] if i > 0 else None, watch)
        self.attempts[i] = self.attempts[i].model_copy(
            update={
                "state": backend.state,
                "ended_at": rec.ended_at or iso(time.time()),
                "cause": rec.reason if backend.state == RunState.FAILED else "",
                "failed_node": rec.failed_node,
                "failed_rank": rec.failed_rank,
                "hosts": rec.hosts or self.attempts[i].hosts,
                "resumed_from_step": watch.resumed_from,
                "last_step": watch.last_step,
                "steps_redone": redone,
                "lost_s": round(lost, 3),
            }
        )
        self._summary(RunState.RUNNING)

    def _exclusion(self, options: LaunchOptions) -> tuple[LaunchOptions, str]:
        """Leave out a node whose failure repeats, for the next spare host; the line saying so
        ("" when nothing changes)."""
        return _spare_swap(self.attempts, self._spares, options)

    def _next_nodes(self, options: LaunchOptions, n: int) -> tuple[LaunchOptions, str, int | None]:
        """The nodes attempt ``n`` runs on: a spare for a node whose failure repeats, or with
        none left and ``--allow-shrink``, the others (:func:`_shrunk`); the line saying so ("" when
        nothing changes) and the node count before a shrink. DtrainError: it cannot shrink."""
        options, why = self._exclusion(options)
        node = repeated_node(self.attempts)
        if why or not options.allow_shrink or node is None or self._spares:
            return options, why, None
        if self.bundle_dir is None or (options.hosts and node >= len(options.hosts)):
            raise DtrainError("--allow-shrink: the run's bundle or the node's host is not known")
        was = len(self.attempts[-1].hosts)
        options, why, self.bundle_dir = _shrunk(self.path, self.bundle_dir, node, options, n)
        return options, why, was

    # ------------------------------------------------------------ the summary

    def _say(self, text: str) -> None:
        self._events.put([LineEvent(node=0, rank=None, stream="stderr", line=f"[restart] {text}")])

    def _finish(self, state: RunState, reason: str) -> None:
        with self._lock:
            if self._final.is_set():
                return
            self._summary(state, reason)
            self._state = state
            self._events.put([RunStateChanged(state, reason, time.time())])
            self._final.set()

    def _summary(self, state: RunState, reason: str | None = None) -> None:
        """Write RUN/run.json: the newest attempt's record, the run's state, every attempt."""
        base = self.current.run.record if self.current is not None else self.record
        update: dict[str, object] = {"state": state, "attempts": list(self.attempts)}
        if not state.final:
            update.update({"ended_at": None, "reason": "", "failed_rank": None})
            update["failed_node"] = None
        elif reason is not None:
            update["reason"] = reason
        if self.attempts:
            update["started_at"] = self.attempts[0].started_at
        self.record = base.model_copy(update=update)
        self._state = state if not self._final.is_set() else self._state
        _write_atomic(self.path / RUN_JSON, self.record.to_json())


def _write_atomic(path: Path, text: str) -> None:
    """Temp file then rename: a reader never sees half a run.json."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".run.json.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def newest_attempt_dir(run_dir: Path) -> Path:
    """The directory the monitor follows: the newest attempt's, or ``run_dir`` itself."""
    try:
        data = json.loads((Path(run_dir) / RUN_JSON).read_text())
    except (OSError, ValueError):
        return Path(run_dir)
    attempts = data.get("attempts") if isinstance(data, dict) else None
    if isinstance(attempts, list) and attempts and isinstance(attempts[-1], dict):
        rel = attempts[-1].get("run_dir")
        if isinstance(rel, str) and rel.startswith(f"{ATTEMPTS}/") and ".." not in rel:
            d = Path(run_dir) / rel
            if d.is_dir():
                return d
    return Path(run_dir)


def _work_lost(prev: AttemptWatch | None, watch: AttemptWatch) -> tuple[int, float]:
    """Steps the previous attempt trained past this one's resume point, and their seconds."""
    if prev is None or prev.last_step is None:
        return 0, 0.0
    resumed = watch.resumed_from or 0
    t_resume = prev.step_seen.get(resumed) if resumed else prev.running_at
    end = prev.step_seen.get(prev.last_step)
    lost = max(0.0, end - t_resume) if t_resume is not None and end is not None else 0.0
    return max(0, prev.last_step - resumed), lost


def _spare_swap(
    attempts: list[AttemptRecord], spares: list[Host], options: LaunchOptions
) -> tuple[LaunchOptions, str]:
    """The next spare (taken from ``spares``) in place of the node whose failure repeats."""
    node = repeated_node(attempts)
    if not spares or node is None or node >= len(options.hosts):
        return options, ""
    bad, spare = options.hosts[node], spares.pop(0)
    hosts = list(options.hosts)
    hosts[node] = spare
    why = (
        f"node {node} ({bad}) left out: it failed twice in a row ({attempts[-1].cause}); "
        f"spare {spare} takes its place"
    )
    return replace(options, hosts=hosts), why


def repeated_node(attempts: list[AttemptRecord]) -> int | None:
    """The node the last two attempts both failed on, on the same host; None if none."""
    if len(attempts) < 2:
        return None
    a, b = attempts[-2], attempts[-1]
    node = b.failed_node
    if node is None or node != a.failed_node:
        return None
    if a.hosts[node : node + 1] != b.hosts[node : node + 1]:
        return None
    return node


def _shrunk(
    run_dir: Path, bundle_dir: Path, node: int, options: LaunchOptions, n: int
) -> tuple[LaunchOptions, str, Path]:
    """Attempt ``n`` without node ``node``: the bundle re-planned for one node fewer
    (:func:`shrunk_plan`) written into ``RUN/attempts/N/bundle``; the options without the node's
    host, the line saying so, and the new bundle."""
    from engine.write import write_bundle
    from engine.write.bundle import WriteOptions

    hosts = [h for i, h in enumerate(options.hosts) if i != node]
    p, change = shrunk_plan(bundle_dir, node, [str(h) for h in hosts])
    out = run_dir / ATTEMPTS / str(n) / "bundle"
    write_bundle(p, out, options=WriteOptions(fsdp_version=_fsdp_version(bundle_dir)))
    why = (
        f"node {node} left out: its failure repeated; no spare; continuing on "
        f"{p.nodes} node{'s' if p.nodes != 1 else ''}, {change}"
    )
    return replace(options, hosts=hosts), why, out


def _fsdp_version(bundle_dir: Path) -> int:
    """The FSDP API the bundle was written for (its fsdp.json), so a shrink keeps it."""
    from engine.write.fsdp import FSDP_VERSION

    try:
        version = json.loads((bundle_dir / "fsdp.json").read_text(encoding="utf-8"))
        return int(version["fsdp_version"])
    except (OSError, ValueError, KeyError, TypeError):
        return FSDP_VERSION


NO_RESHARD = {
    Framework.DEEPSPEED: "DeepSpeed checkpoints do not reshard without a universal conversion: "
    "convert the newest one with DeepSpeed's ds_to_universal.py and relaunch on fewer nodes "
    "with --universal-checkpoint; not shrinking",
    Framework.MEGATRON: "Megatron bundles are not re-planned for fewer nodes here: re-plan "
    "with `dtrain-tui write --nodes N` and relaunch; not shrinking",
}
"""Frameworks whose checkpoints a shrunk run could not load: the line the run ends with."""


def shrunk_plan(bundle_dir: Path, node: int, hosts: list[str]) -> tuple[Plan, str]:
    """The bundle's spec (plan.json) re-planned without node ``node`` (``hosts``: the nodes
    left, for a bundle that names its hosts), keeping the global batch and, where it can, the
    micro batch (so: more gradient accumulation); and what changed ("global batch 8 kept:
    grad-accum 1 -> 2"). DtrainError, in one line, when the framework's checkpoints do not
    reshard, the plan does not fit, or no layout keeps the batch."""
    from engine.plan.planner import plan as make_plan
    from engine.plan.specs import Spec
    from engine.write.checks import check_spec_batch
    from engine.write.manifest import read_manifest

    m = read_manifest(bundle_dir)
    if m.framework in NO_RESHARD:
        raise DtrainError(NO_RESHARD[Framework(m.framework)], field="--allow-shrink")
    nodes = m.nodes - 1
    if nodes < 1:
        raise DtrainError("no node left to continue on; not shrinking", field="--allow-shrink")
    try:
        data = json.loads((Path(bundle_dir) / "plan.json").read_text(encoding="utf-8"))
        raw = dict(data["spec"])
        old = data["recommended"]
        old_mb, old_ga = int(old["micro_batch"]), int(old["grad_accum"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DtrainError(
            f"{bundle_dir}/plan.json holds no spec to re-plan ({type(e).__name__}: {e}); "
            "not shrinking",
            field="--allow-shrink",
        ) from None
    raw.pop("calibration", None)
    raw["hardware"] = {**raw.get("hardware", {}), "nodes": nodes}
    launch = raw.get("launch") or {}
    if launch.get("hosts"):
        raw["launch"] = {**launch, "hosts": hosts}
    why = ""
    training = raw.get("training") or {}
    # The same micro batch first (the same activation memory), then whatever the planner picks.
    for attempt in ({**training, "micro_batch": old_mb}, training):
        try:
            p = make_plan(Spec.model_validate({**raw, "training": attempt}))
            if not p.recommended.fits:
                raise DtrainError(p.recommended.rejected_because or "it does not fit in memory")
            check_spec_batch(p)
        except DtrainError as e:
            why = why or e.message
            continue
        except ValueError as e:  # a spec that no longer validates (pydantic's errors)
            why = why or one_line(e)
            continue
        lay = p.recommended
        change = f"grad-accum {old_ga} -> {lay.grad_accum}"
        if lay.micro_batch != old_mb:
            change = f"micro-batch {old_mb} -> {lay.micro_batch}, {change}"
        return p, f"global batch {lay.global_batch} kept: {change}"
    raise DtrainError(
        f"cannot continue on {nodes} node(s) keeping the global batch: {why}; not shrinking",
        field="--allow-shrink",
    )

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

from engine.launch.base import LaunchBackend
from engine.launch.options import LaunchOptions
from engine.plan.specs import Host
from engine.rundir.events import Event, LineBatch, LineEvent, RunStateChanged
from engine.rundir.files import iso, new_run_dir
from engine.rundir.record import RUN_JSON, AttemptRecord, RunRecord, RunState

__all__ = ["AttemptWatch", "RestartPolicy", "RestartingRun"]

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

        run = cls(
            lambda d, o: make_backend(kind, bundle_dir, d, o),
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

    def _begin(self, n: int, options: LaunchOptions, *, excluded: str) -> LaunchBackend:
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
                options, excluded = self._exclusion(options)
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
                    backend = self._begin(n, options, excluded=excluded)
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
        prev = self.watches[i - 1] if i > 0 else None
        redone, lost = 0, 0.0
        if prev is not None and prev.last_step is not None:
            resumed = watch.resumed_from or 0
            redone = max(0, prev.last_step - resumed)
            t_resume = prev.step_seen.get(resumed) if resumed else prev.running_at
            end = prev.step_seen.get(prev.last_step)
            if t_resume is not None and end is not None:
                lost = max(0.0, end - t_resume)
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
        if len(self.attempts) < 2 or not self._spares or not options.hosts:
            return options, ""
        a, b = self.attempts[-2], self.attempts[-1]
        node = b.failed_node
        if node is None or node != a.failed_node or node >= len(options.hosts):
            return options, ""
        bad = options.hosts[node]
        if a.hosts[node : node + 1] != b.hosts[node : node + 1]:
            return options, ""
        spare = self._spares.pop(0)
        hosts = list(options.hosts)
        hosts[node] = spare
        why = (
            f"node {node} ({bad}) left out: it failed twice in a row ({b.cause}); "
            f"spare {spare} takes its place"
        )
        return replace(options, hosts=hosts), why

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

"""The run directory: what one launch leaves behind, written as it happens.

Layout (the contract the monitor reads)::

    RUN/run.json                    state, times, per-rank exit codes and hosts (atomic rewrites)
    RUN/bundle/                     a copy of the bundle that was started
    RUN/plan.json                   the plan the bundle was written from
    RUN/commands/node<i>.txt        the exact command sent to node i
    RUN/logs/rank<R>.stdout.log     one file per global rank and stream
    RUN/logs/rank<R>.stderr.log
    RUN/logs/node<i>.log            lines of node i no rank can be named for (launcher chatter)
    RUN/logs/order.idx              the order the logs were written in: one ``<file> <offset>
                                    <nbytes>`` line per append (owner-only; best-effort)
    RUN/stop.request                written by a monitor to ask the launcher to stop the run

Every line is appended and flushed here before a backend hands it to any consumer, so a crash of
dtrain-tui loses nothing already received. run.json is one :class:`engine.rundir.record.RunRecord`,
written here only (a launch backend changes it through :meth:`RunDir.begin`, :meth:`RunDir.update`
and :meth:`RunDir.set_rank_exit`) and read through :func:`engine.rundir.record.read_record`. It
names its launcher (pid and start time): a reader believes ``running`` only while that process
lives.

The logs hold no time per line, so ``order.idx`` says how they interleave: every
:meth:`RunDir.append` (one flushed chunk of whole lines, under the lock) adds, after the chunk is
written, the log's name, the offset the chunk starts at in it and its length, so a reopened run
replays ranks and streams as they were written (:mod:`engine.monitor.tail`). The index is
best-effort: a failure writing it loses no log line and ends no run; it is written no more after
its first error, and a reader replays what it does not cover file by file.

A full disk is not a crash: :meth:`RunDir.append` raises the OSError for the backend to end the
run with, and :meth:`RunDir.update` falls back to rewriting run.json in place, compact, so the
final state still lands where no new block can be had.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from engine.fsio import atomic_write_text
from engine.rundir.record import RUN_JSON, RunRecord, RunState, read_record
from engine.rundir.record_parts import DiagnosisRecord, TransportRecord

ORDER_INDEX = "order.idx"
"""``RUN/logs/order.idx``: the order chunks were appended to the logs in (module docstring)."""


def default_runs_root() -> Path:
    """``<user data dir>/dtrain-tui/runs`` (platformdirs), e.g. ~/.local/share/dtrain-tui/runs."""
    from platformdirs import user_data_dir

    return Path(user_data_dir("dtrain-tui")) / "runs"


def new_run_dir(name: str, root: Path | None = None, *, now: float | None = None) -> Path:
    """A fresh directory ``<local time>-<name>`` (``-2``, ``-3``... when taken) under ``root``
    (None: :func:`default_runs_root`); only letters, digits, ``_.-`` of ``name`` are kept."""
    stamp = datetime.fromtimestamp(now if now is not None else time.time()).strftime(
        "%Y%m%d-%H%M%S"
    )
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "run"
    root = default_runs_root() if root is None else Path(root)
    path = root / f"{stamp}-{safe}"
    n = 1
    while path.exists():
        n += 1
        path = root / f"{stamp}-{safe}-{n}"
    return path


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds")


def rank_log(run: Path, rank: int, stream: str) -> Path:
    return run / "logs" / f"rank{rank}.{stream}.log"


def node_log(run: Path, node: int) -> Path:
    return run / "logs" / f"node{node}.log"


class RunDir:
    """One run's directory. Thread-safe: reader threads append lines, the supervisor updates
    ``run.json``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._files: dict[Path, IO[bytes]] = {}
        self._sizes: dict[Path, int] = {}
        """Each open log's size: where its next chunk starts (what ``order.idx`` records)."""
        self._index: int | None = None
        """``logs/order.idx``'s fd, opened on the first append; -1 once writing it failed."""
        self._lock = threading.Lock()
        self._record = RunRecord()

    # --- creation

    def create(self, bundle_dir: Path) -> None:
        """Make the directory and copy the bundle and its plan into it: all of it, or (a full
        disk) a one-line DtrainError and nothing of it left (what was made for it is removed).
        A run directory inside the bundle is refused before anything is copied: the copy would
        copy itself until the path nests too deeply."""
        from engine.errors import DtrainError

        bundle_dir = Path(bundle_dir)
        in_place = bundle_dir.resolve() == self.bundle.resolve()
        if not in_place:
            check_outside_bundle(self.path, bundle_dir)
        if self.path.exists() and any(
            p.name != "bundle" or not in_place for p in self.path.iterdir()
        ):
            raise DtrainError(
                f"{self.path} already exists and is not empty; pass a new --run-dir",
                field="--run-dir",
            )
        top = self.path.absolute()  # the highest directory this makes: removed on a failure
        while not top.parent.exists() and top.parent != top.parent.parent:
            top = top.parent
        made = top if not top.exists() else None
        try:
            (self.path / "logs").mkdir(parents=True, exist_ok=True)
            (self.path / "commands").mkdir(exist_ok=True)
            if not in_place:  # a bundle written straight into the run directory stays there
                shutil.copytree(bundle_dir, self.bundle, symlinks=True, copy_function=_copy)
            plan = Path(bundle_dir) / "plan.json"
            if plan.exists():
                _copy(plan, self.path / "plan.json")
        except BaseException as e:
            if made is not None:
                shutil.rmtree(made, ignore_errors=True)
            else:
                for name in ("logs", "commands", "plan.json", *(() if in_place else ("bundle",))):
                    _remove(self.path / name)
            error = e.error if isinstance(e, _CopyFailed) else e
            if isinstance(error, OSError | shutil.Error):
                raise DtrainError(_copy_failed(self.path, error), field="launch") from None
            raise

    @property
    def bundle(self) -> Path:
        return self.path / "bundle"

    def write_command(self, node: int, text: str) -> None:
        # Owner-only: the command exports the run's environment (launch.env, tokens).
        path = self.path / "commands" / f"node{node}.txt"
        atomic_write_text(path, text.rstrip("\n") + "\n", mode=0o600)

    # --- logs

    def append(self, node: int, rank: int | None, stream: str, data: bytes) -> None:
        """Append ``data`` (whole lines, newline-terminated) and flush before returning; then
        record the chunk in ``logs/order.idx`` (best-effort: see the module docstring)."""
        target = node_log(self.path, node) if rank is None else rank_log(self.path, rank, stream)
        with self._lock:
            f = self._files.get(target)
            if f is None:
                f = open(target, "ab")  # noqa: SIM115 - kept open for the run, closed in close()
                self._files[target] = f
                self._sizes[target] = os.fstat(f.fileno()).st_size
            try:
                f.write(data)
                f.flush()
            except OSError:
                # Disk full (or gone): drop this file's buffer, so closing it later does not
                # raise the same error again, and let the caller end the run.
                del self._files[target]
                self._sizes.pop(target, None)
                _close_quietly(f)
                raise
            offset = self._sizes[target]
            self._sizes[target] = offset + len(data)
            if self._index != -1 and data:
                self._record_order(f"{target.name} {offset} {len(data)}\n".encode())

    def _record_order(self, record: bytes) -> None:
        """One record appended to ``logs/order.idx`` (the lock is held); on any error the index
        is closed and written no more: the log line is what counts."""
        try:
            if self._index is None:
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                self._index = os.open(self.path / "logs" / ORDER_INDEX, flags, 0o600)
            if os.write(self._index, record) != len(record):
                raise OSError(errno.ENOSPC, "short write")
        except OSError:
            if self._index is not None and self._index >= 0:
                with contextlib.suppress(OSError):
                    os.close(self._index)
            self._index = -1

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                _close_quietly(f)
            self._files.clear()
            self._sizes.clear()
            if self._index is not None and self._index >= 0:
                with contextlib.suppress(OSError):
                    os.close(self._index)
                self._index = None

    # --- run.json

    def begin(self, record: RunRecord) -> None:
        """Write the run's first run.json (``record`` is copied)."""
        with self._lock:
            self._record = record.model_copy(deep=True)
            self._write()

    def update(
        self,
        *,
        state: RunState | None = None,
        reason: str | None = None,
        failed: tuple[int | None, int | None] | None = None,
        ended_at: float | None = None,
    ) -> None:
        """Change what is given (``failed``: the failed rank and node) and rewrite run.json
        atomically."""
        with self._lock:
            rec = self._record
            if state is not None:
                rec.state = state
            if reason is not None:
                rec.reason = reason
            if failed is not None:
                rec.failed_rank, rec.failed_node = failed
            if ended_at is not None:
                rec.ended_at = iso(ended_at)
            self._write()

    def set_hosts(self, names: list[str]) -> None:
        """The nodes' real host names once known (a scheduler allocates them after the run
        began): run.json's hosts and every rank's host."""
        with self._lock:
            rec = self._record
            rec.hosts = list(names)
            for r in rec.ranks:
                r.host = names[r.node_rank]
            self._write()

    def set_diagnosis(self, diagnosis: DiagnosisRecord | dict[str, Any]) -> None:
        """run.json's ``diagnosis`` (who is stuck where), replacing an earlier one; JSON values
        are read as a file's would be."""
        if isinstance(diagnosis, dict):
            diagnosis = DiagnosisRecord.from_untrusted(diagnosis)
        with self._lock:
            self._record.diagnosis = diagnosis
            self._write()

    def set_transport(self, transport: TransportRecord | dict[str, Any]) -> None:
        """run.json's ``transport`` (the NCCL transport check), replacing an earlier one; JSON
        values are read as a file's would be."""
        if isinstance(transport, dict):
            transport = TransportRecord.from_untrusted(transport)
        with self._lock:
            self._record.transport = transport
            self._write()

    def set_rank_exit(self, rank: int, exit_code: int | None, reason: str = "") -> None:
        with self._lock:
            for r in self._record.ranks:
                if r.rank == rank:
                    r.exit_code = exit_code
                    if reason:
                        r.reason = reason
            self._write()

    @property
    def record(self) -> RunRecord:
        """A copy of run.json as last written."""
        with self._lock:
            return self._record.model_copy(deep=True)

    def _write(self) -> None:
        """run.json from the record, atomically (the lock is held)."""
        try:
            atomic_write_text(self.path / RUN_JSON, self._record.to_json())
        except OSError:
            if not self._rewrite_in_place():
                raise

    def _rewrite_in_place(self) -> bool:
        """run.json over its own blocks, compact and padded to its old size: where the disk is
        full a new file cannot be had, but the old one's space can be reused. Not atomic (a
        reader may see a half-written file once, and keeps what it knew); True when it fit."""
        data = self._record.to_json(compact=True).encode("utf-8")
        try:
            with open(self.path / RUN_JSON, "r+b") as f:
                old = os.fstat(f.fileno()).st_size
                f.write(data + b"\n" + b" " * max(0, old - len(data) - 1))
                f.flush()
        except OSError:
            return False
        return True


def check_outside_bundle(run: Path, bundle_dir: Path) -> None:
    """Refuse (one line) a run directory that is ``bundle_dir`` or lies under it (symlinks
    resolved): the bundle is copied into the run directory, and would copy its own copy."""
    r, b = Path(run).resolve(), Path(bundle_dir).resolve()
    if r == b or b in r.parents:
        from engine.errors import DtrainError

        raise DtrainError(
            f"{run} is inside the bundle {bundle_dir}, which is copied into the run "
            "directory; pass a --run-dir outside the bundle",
            field="--run-dir",
        )


class _CopyFailed(Exception):
    """The first file the bundle copy could not write: stops :func:`shutil.copytree` at once
    (it collects an OSError per file and goes on) and keeps the error's errno."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _copy(src: str | Path, dst: str | Path) -> object:
    try:
        return shutil.copy2(src, dst)
    except OSError as e:
        raise _CopyFailed(e) from e


def _copy_failed(run: Path, e: OSError | shutil.Error) -> str:
    """The one line for a bundle copy that failed (not shutil.Error's list of tuples)."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"no space left on device copying the bundle into {run}; free some space or pass "
            "another --run-dir"
        )
    if isinstance(e, shutil.Error):
        details = e.args[0] if e.args and isinstance(e.args[0], list) else []
        why = str(details[0][2]) if details and len(details[0]) > 2 else str(e)
    else:
        why = f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else "")
    return f"cannot copy the bundle into {run}: {why}; pass a writable --run-dir"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _close_quietly(f: IO[bytes]) -> None:
    with contextlib.suppress(OSError):
        f.close()


def read_run(path: Path) -> dict[str, Any]:
    """``RUN/run.json`` as read (:func:`engine.rundir.record.read_record`), as plain JSON values:
    for tests and scripts that look at the file's keys."""
    return read_record(path).to_dict()

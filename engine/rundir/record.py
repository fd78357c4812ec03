"""run.json as one typed record: the states a run goes through, and :class:`RunRecord`, which
the one writer (:class:`engine.rundir.files.RunDir`, driven by a launch backend) serializes and
the one reader (:func:`read_record`: the monitor's run tail, ``monitor RUN_DIR``, tests) parses.

The writer's output is byte for byte what run.json has always held (same keys, same order, same
``json.dumps`` layout), so runs written before this module read the same. The reader takes any
file: run.json may come from another machine or another version, so a field of the wrong type
falls back to its default and numbers that size memory or screen rows (ranks, nodes, world size)
are checked against the bundle manifest's bounds (one-line :class:`DtrainError` naming the file).

``backend`` and ``framework`` read as their enums when they name one (any other string is kept
as it was); ``launcher``, ``diagnosis`` and ``transport`` are the typed parts of
:mod:`engine.rundir.record_parts`, each read as much as it can be (never an error).

The reaper (:mod:`engine.launch.reaper`) runs as a bare script and patches run.json with the
stdlib: ``state``, ``reason``, ``ended_at``, ``launcher_died`` and each rank's ``reason``, the
names below.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from engine.errors import DtrainError
from engine.fsio import JSON_LIMIT, read_regular_text
from engine.plan.names import Backend, Framework
from engine.rundir.launcher import launcher_gone
from engine.rundir.record_parts import DiagnosisRecord, LauncherRecord, TransportRecord
from engine.write.manifest import MAX_NODES, MAX_RANKS

RUN_JSON = "run.json"

# A known name reads as its enum, any other string stays that string (tried in this order).
_BackendName = Annotated[Backend | str, Field(union_mode="left_to_right")]
_FrameworkName = Annotated[Framework | str, Field(union_mode="left_to_right")]


class RunState(StrEnum):
    """Where a run is. ``starting`` until every node's launcher is up, ``running`` until it ends;
    the last three are final and never change once written."""

    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def final(self) -> bool:
        return self in FINAL_STATES


FINAL_STATES: frozenset[RunState] = frozenset(
    {RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED}
)


class RankRecord(BaseModel):
    """One global rank: where it ran and how it ended."""

    rank: int
    node_rank: int = 0
    local_rank: int = 0
    host: str = ""
    exit_code: int | None = None
    """None while it runs, or when its exit is unknown (a lost node, a stop)."""
    reason: str = ""
    """Why it ended, when not by itself ("stopped" for a user's stop); written only when set."""


class AttemptRecord(BaseModel):
    """One attempt of a run the restart policy (:mod:`engine.launch.restart`) relaunched: its
    own run directory ``RUN/attempts/<attempt>/``, how it ended, and what the restart cost."""

    attempt: int = 1
    """1 for the first start, 2 for the first restart, ..."""
    run_dir: str = ""
    """Relative to the run directory (``attempts/2``)."""
    state: RunState = RunState.RUNNING
    started_at: str | None = None
    ended_at: str | None = None
    cause: str = ""
    """Why it ended when it failed (the backend's reason: the rank, its exit, a hang)."""
    failed_node: int | None = None
    failed_rank: int | None = None
    hosts: list[str] = Field(default_factory=list)
    """The nodes it ran on, in node-rank order."""
    resumed_from_step: int | None = None
    """The checkpoint step it resumed from (the rank's ``[dtrain] resumed from step=`` line);
    None: it started afresh (or its script never says)."""
    last_step: int | None = None
    """The last training step a rank printed."""
    steps_redone: int = 0
    """Steps the previous attempt had trained past this one's resume point."""
    lost_s: float = 0.0
    """Seconds of training the previous attempt did that this one does again."""
    excluded: str = ""
    """A node left out before this attempt, and why ("" when none)."""
    nodes: int = 0
    """How many nodes it ran on (0: not known); written only when known."""
    shrunk_from: int | None = None
    """With ``launch --allow-shrink``: the node count before this attempt was re-planned for
    fewer nodes (:attr:`excluded` says why); written only when it was."""


class RunRecord(BaseModel):
    """The whole of run.json. Field order is the file's key order."""

    name: str = ""
    run_id: str = ""
    """Tags every process of the run (``DTRAIN_RUN_ID``)."""
    backend: _BackendName = ""
    """The launch backend; a name this version does not know (a newer one's), or none, stays
    the string the file holds (so it reads, shows and writes back as it was)."""
    state: RunState = RunState.RUNNING
    """A run.json without a state reads ``running``, as it always has."""
    started_at: str | None = None
    ended_at: str | None = None
    nodes: int = 0
    gpus_per_node: int = 0
    world_size: int = 0
    dist_backend: str = ""
    framework: _FrameworkName = ""
    """As :attr:`backend`: a :class:`Framework` when known, else the string as it was."""
    hosts: list[str] = Field(default_factory=list)
    ranks: list[RankRecord] = Field(default_factory=list)
    failed_rank: int | None = None
    failed_node: int | None = None
    reason: str = ""
    """Why the run ended (or is ending); "" while it goes well."""
    launcher: LauncherRecord | None = None
    """The launcher process (:func:`engine.rundir.launcher.launcher_record`'s values)."""
    launcher_died: bool = False
    """Set by the reaper or a reader when the launcher vanished; written only when true."""
    diagnosis: DiagnosisRecord | None = None
    """Who is stuck where, when a hang was diagnosed (:func:`engine.diagnose.flight.diagnose`;
    ``summary`` is its one line); written only when set."""
    transport: TransportRecord | None = None
    """What NCCL chose against the plan (:meth:`engine.diagnose.transport.TransportReport.to_record`:
    ``verdict``, ``expected``, ``chosen``, ``nodes``, ``findings``); written only when known."""
    attempts: list[AttemptRecord] = Field(default_factory=list)
    """Every attempt of a run the restart policy relaunched (``--max-restarts``), in order;
    written only when there are any."""

    @field_validator("launcher", "diagnosis", "transport", mode="before")
    @classmethod
    def _part_from_dict(cls, v: object, info: ValidationInfo) -> object:
        """A part given as JSON values (a launch backend's ``launcher_record()``, a dict read
        back) is parsed as an untrusted file's would be: it never fails the record."""
        if not isinstance(v, dict):
            return v
        return _PARTS[str(info.field_name)].from_untrusted(v)

    # --- the writer's side

    def to_dict(self) -> dict[str, Any]:
        """run.json as JSON values, in the file's key order (optional keys only when set)."""
        data = self.model_dump(mode="json")
        for rank in data["ranks"]:
            if not rank["reason"]:
                del rank["reason"]
        if not self.launcher_died:
            del data["launcher_died"]
        if self.diagnosis is None:
            del data["diagnosis"]
        if self.transport is None:
            del data["transport"]
        else:
            data["transport"] = self.transport.to_dict()
        if not self.attempts:
            del data["attempts"]
        for attempt in data.get("attempts", []):  # written only when known
            if not attempt["nodes"]:
                del attempt["nodes"]
            if attempt["shrunk_from"] is None:
                del attempt["shrunk_from"]
        return data

    def to_json(self, *, compact: bool = False) -> str:
        if compact:
            return json.dumps(self.to_dict(), separators=(",", ":"))
        return json.dumps(self.to_dict(), indent=2) + "\n"

    # --- the reader's side

    @classmethod
    def from_untrusted(cls, data: dict[str, Any], path: Path | str = RUN_JSON) -> RunRecord:
        """A record from any JSON object: wrong types fall back to defaults, out-of-range rank,
        node and world numbers are a one-line :class:`DtrainError` naming ``path``."""
        ranks = _ranks(data.get("ranks"), path)
        ws = data.get("world_size")
        nodes = data.get("nodes")
        hosts = data.get("hosts")
        failed = data.get("failed_rank")
        if isinstance(failed, list):  # a list of failed ranks: the first one is the run's
            failed = next((r for r in failed if isinstance(r, int)), None)
        rec = cls(
            name=_str(data.get("name")),
            run_id=_str(data.get("run_id")),
            backend=_str(data.get("backend")),
            state=state if (state := _state(data.get("state"))) else RunState.FAILED,
            started_at=_opt_str(data.get("started_at")),
            ended_at=_opt_str(data.get("ended_at")),
            nodes=len(nodes) if isinstance(nodes, list) else _int(nodes),
            gpus_per_node=_int(data.get("gpus_per_node")),
            world_size=_int(ws) if isinstance(ws, int) else len({r.rank for r in ranks}),
            dist_backend=_str(data.get("dist_backend")),
            framework=_str(data.get("framework")),
            hosts=[h for h in hosts if isinstance(h, str)] if isinstance(hosts, list) else [],
            ranks=ranks,
            failed_rank=_opt_int(failed),
            failed_node=_opt_int(data.get("failed_node")),
            reason=str(data.get("reason") or data.get("failed_reason") or "")
            if state
            else _unknown_state(data.get("state"), path),
            # An entry that is an object is parsed by _part_from_dict; any other reads None.
            launcher=v if isinstance(v := data.get("launcher"), dict) else None,
            launcher_died=data.get("launcher_died") is True,
            diagnosis=d if isinstance(d := data.get("diagnosis"), dict) else None,
            transport=t if isinstance(t := data.get("transport"), dict) else None,
            attempts=_attempts(data.get("attempts")),
        )
        _bounded(rec.world_size, MAX_RANKS + 1, "world_size", path)
        _bounded(rec.nodes, MAX_NODES + 1, "nodes", path)
        return rec

    def as_read(self) -> RunRecord:
        """This record as a reader should believe it: a run not over whose launcher is gone
        reads ``failed`` with reason "launcher died (...)" and ``launcher_died``."""
        if self.state.final:
            return self
        why = launcher_gone(self.launcher)
        if not why:
            return self
        return self.model_copy(
            update={"state": RunState.FAILED, "reason": why, "launcher_died": True}
        )


def read_record(run_dir: Path | str) -> RunRecord:
    """``RUN/run.json`` as read (:meth:`RunRecord.as_read`); a missing directory or file, or one
    that is not a JSON object, is a one-line :class:`DtrainError` for ``RUN_DIR``."""
    path = Path(run_dir) / RUN_JSON
    if not Path(run_dir).is_dir():
        raise DtrainError(f"{run_dir} is not a directory; pass a run directory", field="RUN_DIR")
    try:
        text = read_regular_text(path, JSON_LIMIT, within=run_dir, label=str(path))
        data = json.loads(text)
    except FileNotFoundError:
        raise DtrainError(
            f"{path} not found; pass a run directory written by `dtrain-tui launch`",
            field="RUN_DIR",
        ) from None
    except (OSError, ValueError) as e:
        raise DtrainError(f"{path} is unreadable ({e})", field="RUN_DIR") from None
    except RecursionError:
        raise DtrainError(f"{path} is unreadable (nested too deeply)", field="RUN_DIR") from None
    except DtrainError as e:  # not a regular file, or too big
        raise DtrainError(e.message, field="RUN_DIR") from None
    if not isinstance(data, dict):
        raise DtrainError(f"{path} is not a JSON object", field="RUN_DIR")
    return RunRecord.from_untrusted(data, path).as_read()


def _ranks(ranks: object, path: Path | str) -> list[RankRecord]:
    """The entries of ``ranks`` that name a rank (others are skipped), bounded."""
    if not isinstance(ranks, list):
        return []
    if len(ranks) > MAX_RANKS:
        _bounded(len(ranks), MAX_RANKS + 1, "ranks: length", path)
    out: list[RankRecord] = []
    for entry in ranks:
        if not isinstance(entry, dict) or not isinstance(entry.get("rank"), int):
            continue
        node = entry.get("node_rank", entry.get("node", 0))
        out.append(
            RankRecord(
                rank=_bounded(int(entry["rank"]), MAX_RANKS, "ranks: rank", path),
                node_rank=_bounded(int(node), MAX_NODES, "ranks: node_rank", path)
                if isinstance(node, int)
                else 0,
                local_rank=_int(entry.get("local_rank")),
                host=str(entry.get("host") or ""),
                exit_code=int(code) if isinstance(code := entry.get("exit_code"), int) else None,
                reason=str(entry.get("reason") or ""),
            )
        )
    return out


def _attempts(attempts: object) -> list[AttemptRecord]:
    """The entries of ``attempts`` that are objects, each field of the wrong type defaulted."""
    if not isinstance(attempts, list):
        return []
    out: list[AttemptRecord] = []
    for e in attempts[:1000]:
        if not isinstance(e, dict):
            continue
        lost = e.get("lost_s")
        hosts = e.get("hosts")
        out.append(
            AttemptRecord(
                attempt=_int(e.get("attempt")) or len(out) + 1,
                run_dir=_str(e.get("run_dir")),
                state=_state(e.get("state")) or RunState.FAILED,
                started_at=_opt_str(e.get("started_at")),
                ended_at=_opt_str(e.get("ended_at")),
                cause=_str(e.get("cause")),
                failed_node=_opt_int(e.get("failed_node")),
                failed_rank=_opt_int(e.get("failed_rank")),
                hosts=[h for h in hosts if isinstance(h, str)] if isinstance(hosts, list) else [],
                resumed_from_step=_opt_int(e.get("resumed_from_step")),
                last_step=_opt_int(e.get("last_step")),
                steps_redone=_int(e.get("steps_redone")),
                lost_s=float(lost) if isinstance(lost, int | float) and lost >= 0 else 0.0,
                excluded=_str(e.get("excluded")),
                nodes=_int(e.get("nodes")),
                shrunk_from=_opt_int(e.get("shrunk_from")),
            )
        )
    return out


_PARTS: dict[str, type[LauncherRecord | DiagnosisRecord | TransportRecord]] = {
    "launcher": LauncherRecord,
    "diagnosis": DiagnosisRecord,
    "transport": TransportRecord,
}


def _bounded(value: int, limit: int, what: str, path: Path | str) -> int:
    """``value`` when 0 <= value < limit, else a one-line error naming the file and field."""
    if not 0 <= value < limit:
        raise DtrainError(
            f"{path}: {what} {value} is out of range (0 to {limit - 1}); "
            "this file was not written by dtrain-tui",
            field="RUN_DIR",
        )
    return value


def _state(v: object) -> RunState | None:
    """A missing state reads ``running`` (as it always has); one no version wrote is None: such
    a run reads ``failed``, its reason saying why (:func:`_unknown_state`), for a reader that
    believed ``running`` would wait for an end no writer will ever write."""
    try:
        return RunState(v) if isinstance(v, str) and v else None if v else RunState.RUNNING
    except ValueError:
        return None


def _unknown_state(v: object, path: Path | str) -> str:
    shown = repr(v)[:40]
    return (
        f"{path}: state {shown} is not one of {', '.join(RunState)}; "
        "this file was not written by this dtrain-tui, and the run is taken as ended"
    )


def _str(v: object) -> str:
    return v if isinstance(v, str) else ""


def _opt_str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _int(v: object) -> int:
    return int(v) if isinstance(v, int) else 0


def _opt_int(v: object) -> int | None:
    return int(v) if isinstance(v, int) else None

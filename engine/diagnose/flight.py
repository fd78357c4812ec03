"""Name the stuck rank from PyTorch Flight Recorder dumps.

Called by the launch backends' supervision when a run hangs or a monitor asks
(:mod:`engine.launch.frdump`), and by tests on recorded dumps. Pure: text and values in, a
:class:`Diagnosis` out; no torch, no I/O (reading dump files is :func:`read_trace_file`, the one
function that opens a file).

Each rank's dump comes either as the line the bundle's rank agent (``engine/trainer/agent.py``,
which runs every rank's script) prints when the launcher asks (``[dtrain] fr {json}``,
:func:`parse_fr_line`) or as a whole Flight Recorder buffer
(``_dump_fr_trace_json``: JSON, its ``pg_status`` numbers as strings; ``_dump_fr_trace`` and
NCCL's dump-on-timeout files: a pickle, numbers as ints; :func:`dump_from_trace`). Per process
group, every member's last *enqueued* collective sequence number is compared (gloo never marks
an entry started, and its completion is seen late, so enqueued is the one number every backend
keeps exactly): the ranks behind the others never entered the next collective, whose op, sizes
and dtypes come from a rank that did; the others are waiting in their last one. PyTorch's own
``torchfrtrace`` cannot read gloo dumps (a KeyError on the default group), hence this module.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from engine.errors import DtrainError
from engine.fsio import DUMP_LIMIT, read_regular_bytes
from engine.rundir.record_parts import Collective, DiagnosisRecord, GroupFinding, RankRef

FR_PREFIX = "[dtrain] fr "
"""What the rank agent's dump line starts with (the rest is one JSON object); the agent, which
cannot import dtrain-tui, has the same constant (a test checks they agree)."""
TELEMETRY_PREFIX = "[dtrain] telemetry "
"""What the rank agent's telemetry line starts with (:mod:`engine.monitor.telemetry` reads it);
here, below both launch and monitor, because the launcher's hang clock must not take a
telemetry line for a sign of life (:func:`only_agent_lines`)."""


def only_agent_lines(lines: Iterable[str]) -> bool:
    """True when every line is the rank agent's telemetry: the agent's clock speaking, not the
    script; no progress, no sign of life (stops at the first other line: O(1) for a normal
    batch)."""
    return all(TELEMETRY_PREFIX in line for line in lines)


NO_DUMP = "no dump: likely dead or stuck outside a collective"
"""Said of a rank that printed no dump when asked."""

_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "Float8_e4m3fn": "float8_e4m3fn",
    "Float8_e5m2": "float8_e5m2",
}


class GroupStatus(BaseModel, frozen=True):
    """A rank's counters for one process group (-1: none yet)."""

    enqueued: int = -1
    started: int = -1
    completed: int = -1


class RankDump(BaseModel, frozen=True):
    """What one rank said when asked (or what its dump file holds)."""

    rank: int
    node: int | None = None
    host: str = ""
    pid: int | None = None
    time: float | None = None
    recorder: bool = True
    """False when the rank answered but torch had no Flight Recorder buffer for it."""
    groups: dict[str, GroupStatus] = Field(default_factory=dict)
    entries: list[Collective] = Field(default_factory=list)
    stack: list[str] = Field(default_factory=list)
    """The training thread's innermost Python frames, ``file:line function``."""
    threads: dict[str, list[str]] = Field(default_factory=dict)
    """Every thread's innermost frames (library ones too), by ``name (ident)``."""

    def last(self, pg: str) -> int:
        """The last collective this rank entered in ``pg`` (-1: none)."""
        st = self.groups.get(pg)
        seqs = [e.seq for e in self.entries if e.pg == pg]
        return max([st.enqueued if st is not None else -1, *seqs])

    def entry(self, pg: str, seq: int) -> Collective | None:
        return next((e for e in reversed(self.entries) if e.pg == pg and e.seq == seq), None)


Diagnosis = DiagnosisRecord
"""The answer: who is stuck where. ``summary`` is the one line shown everywhere. It is run.json's
``diagnosis`` as it is written, so the model lives with the record
(:mod:`engine.rundir.record_parts`, with :class:`Collective`, :class:`RankRef` and
:class:`GroupFinding`)."""


# --------------------------------------------------------------------------- parsing


def _int(v: object, default: int = -1) -> int:
    """A number from JSON (strings) or a pickle (ints); ``default`` for anything else."""
    if isinstance(v, bool):
        return default
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            return default
    return default


def _sizes(v: object) -> list[list[int]]:
    if not isinstance(v, list):
        return []
    return [[_int(d, 0) for d in s] for s in v if isinstance(s, list)]


def _dtypes(v: object) -> list[str]:
    if not isinstance(v, list):
        return []
    return [_DTYPES.get(str(d), str(d).lower()) for d in v]


def _op(name: object) -> str:
    text = str(name or "?")
    return text.split(":", 1)[1] if ":" in text else text


def _collective(e: object) -> Collective | None:
    if not isinstance(e, dict) or e.get("is_p2p") is True:
        return None  # point-to-point ops have their own sequence: not compared here
    pg = e.get("process_group")
    name, desc = ("", "")
    if isinstance(pg, list | tuple) and pg:
        name = str(pg[0])
        desc = str(pg[1]) if len(pg) > 1 else ""
    elif "pg_id" in e:
        name = str(_int(e.get("pg_id"), 0))
    seq = _int(e.get("collective_seq_id"))
    if seq < 0:
        return None
    return Collective(
        pg=name,
        pg_desc=desc,
        seq=seq,
        op=_op(e.get("profiling_name")),
        input_sizes=_sizes(e.get("input_sizes")),
        input_dtypes=_dtypes(e.get("input_dtypes")),
        state=str(e.get("state") or ""),
        created_ns=_int(e.get("time_created_ns"), 0),
    )


def dump_from_trace(
    data: Mapping[str, Any],
    rank: int,
    *,
    node: int | None = None,
    host: str = "",
    stack: Iterable[str] = (),
) -> RankDump:
    """A :class:`RankDump` from a Flight Recorder buffer as JSON values or an unpickled dict
    (``pg_status`` numbers as strings or ints; entries of other shapes are skipped)."""
    status = data.get("pg_status")
    groups: dict[str, GroupStatus] = {}
    if isinstance(status, dict):
        for pg, st in status.items():
            if isinstance(st, dict):
                groups[str(pg)] = GroupStatus(
                    enqueued=_int(st.get("last_enqueued_collective")),
                    started=_int(st.get("last_started_collective")),
                    completed=_int(st.get("last_completed_collective")),
                )
    raw = data.get("entries")
    entries = [c for c in map(_collective, raw if isinstance(raw, list) else []) if c]
    return RankDump(
        rank=rank,
        node=node,
        host=host,
        recorder=bool(groups or entries or data.get("version")),
        groups=groups,
        entries=entries,
        stack=[str(s) for s in stack],
    )


def parse_fr_line(line: str) -> RankDump | None:
    """The dump in one ``[dtrain] fr {json}`` line (a rank's output, launcher prefixes already
    removed, leading text before the marker ignored), or None for any other line."""
    at = line.find(FR_PREFIX)
    if at < 0:
        return None
    try:
        body = json.loads(line[at + len(FR_PREFIX) :])
    except ValueError:
        return None
    if not isinstance(body, dict) or _int(body.get("rank")) < 0:
        return None
    node = _int(body.get("node"))
    stack = body.get("stack")
    d = dump_from_trace(
        body,
        _int(body.get("rank")),
        node=node if node >= 0 else None,
        host=str(body.get("host") or ""),
        stack=stack if isinstance(stack, list) else (),
    )
    t = body.get("time")
    pid = _int(body.get("pid"))
    raw = body.get("threads")
    threads = (
        {str(k): [str(f) for f in v] for k, v in raw.items() if isinstance(v, list)}
        if isinstance(raw, dict)
        else {}
    )
    return d.model_copy(
        update={
            "threads": threads,
            "recorder": body.get("recorder") is not False,
            "time": float(t) if isinstance(t, int | float) else None,
            "pid": pid if pid >= 0 else None,
        }
    )


class _PlainUnpickler(pickle.Unpickler):
    """Only containers, strings and numbers: a dump file never needs a class, and a file from
    elsewhere must not run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a Flight Recorder dump holds no {module}.{name}")


def read_trace_file(path: Path) -> dict[str, Any] | None:
    """A Flight Recorder buffer written to a file (JSON, or NCCL's pickle), or None when it is
    neither."""
    try:
        raw = read_regular_bytes(path, DUMP_LIMIT)
    except (OSError, DtrainError):
        return None  # not a dump: a symlink, device or FIFO is none either
    try:
        data = json.loads(raw)
    except ValueError:
        import io

        try:
            data = _PlainUnpickler(io.BytesIO(raw)).load()
        except Exception:  # noqa: BLE001 - anything else is not a dump
            return None
    return data if isinstance(data, dict) else None


# --------------------------------------------------------------------------- comparison


def _ref(rank: int, dumps: Mapping[int, RankDump], hosts: list[str], gpus_per_node: int) -> RankRef:
    d = dumps.get(rank)
    node = d.node if d is not None and d.node is not None else rank // max(1, gpus_per_node)
    host = hosts[node] if 0 <= node < len(hosts) and hosts[node] else (d.host if d else "")
    return RankRef(rank=rank, node=node, host=host)


def _ranks_text(refs: list[RankRef]) -> str:
    nums = ", ".join(str(r.rank) for r in refs)
    return f"rank {nums}" if len(refs) == 1 else f"ranks {nums}"


def _group_label(pg: str, desc: str) -> str:
    if pg == "0" and desc in ("", "default_pg"):
        return "default"
    return f"{pg} ({desc})" if desc and desc != "undefined" else pg


def _stack_top(stack: list[str]) -> str:
    """``skip_collective, train.py:512`` for ``train.py:512 skip_collective``."""
    if not stack:
        return ""
    where, _, func = stack[0].partition(" ")
    return f"{func}, {where}" if func else where


def diagnose(
    dumps: Mapping[int, RankDump],
    world_size: int,
    *,
    hosts: list[str] | None = None,
    gpus_per_node: int = 1,
    why: str = "",
    at: float = 0.0,
) -> Diagnosis:
    """Compare every rank's dump: who never entered which collective, who waits in what."""
    hosts = list(hosts or [])
    world = max(world_size, max(dumps, default=-1) + 1)
    answered = {r: d for r, d in dumps.items() if 0 <= r < world}
    missing = [_ref(r, answered, hosts, gpus_per_node) for r in range(world) if r not in answered]
    pgs = sorted(
        {pg for d in answered.values() for pg in d.groups}
        | {e.pg for d in answered.values() for e in d.entries},
        key=lambda p: (_int(p, 1 << 30), p),
    )
    findings: list[GroupFinding] = []
    for pg in pgs:
        # Members: the ranks that know the group. (pg_config cannot say: gloo's keys every
        # group "" and lists no ranks on some members.)
        members = [r for r, d in sorted(answered.items()) if pg in d.groups or d.last(pg) >= 0]
        if len(members) < 2:
            continue
        last = {r: answered[r].last(pg) for r in members}
        top = max(last.values())
        behind = [r for r in members if last[r] < top]
        if not behind:
            continue
        leaders = [r for r in members if last[r] == top]
        first_missed = min(last[r] for r in behind) + 1
        missed = next(
            (e for r in members if (e := answered[r].entry(pg, first_missed)) is not None), None
        )
        waiting_in = next(
            (e for r in leaders if (e := answered[r].entry(pg, top)) is not None), None
        )
        desc = next(
            (e.pg_desc for d in answered.values() for e in d.entries if e.pg == pg and e.pg_desc),
            "",
        )
        findings.append(
            GroupFinding(
                pg=pg,
                pg_desc=desc,
                behind=[_ref(r, answered, hosts, gpus_per_node) for r in behind],
                behind_last={r: last[r] for r in behind},
                missed=missed,
                missed_seq=first_missed,
                waiting=[
                    _ref(r, answered, hosts, gpus_per_node) for r in members if r not in behind
                ],
                waiting_in=waiting_in,
            )
        )
    stuck = sorted({b.rank for f in findings for b in f.behind})
    stacks = {r: d.stack for r, d in sorted(answered.items()) if d.stack}
    return Diagnosis(
        summary=_summary(findings, missing, answered, stacks),
        why=why,
        at=at,
        stuck_ranks=stuck,
        no_dump=missing,
        groups=findings,
        stacks=stacks,
        dumps=len(answered),
        world_size=world,
    )


def _finding_text(f: GroupFinding, stacks: Mapping[int, list[str]]) -> str:
    label = _group_label(f.pg, f.pg_desc)
    who = ", ".join(f"rank {b.rank} ({b.where()})" for b in f.behind)
    if f.missed is not None:
        what = f"{f.missed.name()} (pg {label}, {f.missed.shapes()})"
    else:
        what = f"collective #{f.missed_seq} (pg {label})"
    text = f"{who} never entered {what}"
    if f.waiting:
        if f.waiting_in is not None and f.missed is not None and f.waiting_in.seq != f.missed.seq:
            text += (
                f"; {_ranks_text(f.waiting)} waiting in {f.waiting_in.name()} "
                f"({f.waiting_in.shapes()})"
            )
        else:
            text += f"; {_ranks_text(f.waiting)} waiting in it"
    tops = [
        f"rank {b.rank} at {top}"
        for b in f.behind
        if (top := _stack_top(list(stacks.get(b.rank, []))))
    ]
    if tops:
        text += f" ({'; '.join(tops)})"
    return text


def _summary(
    findings: list[GroupFinding],
    missing: list[RankRef],
    answered: Mapping[int, RankDump],
    stacks: Mapping[int, list[str]],
) -> str:
    parts = [_finding_text(f, stacks) for f in findings]
    if missing:
        who = ", ".join(f"{r.rank} ({r.where()})" for r in missing)
        parts.append(f"{'rank' if len(missing) == 1 else 'ranks'} {who}: {NO_DUMP}")
    if parts:
        return "; ".join(parts)
    if not answered:
        return "no rank answered with a Flight Recorder dump"
    tops = {r: _stack_top(list(s)) for r, s in stacks.items() if s}
    at = "; " + ", ".join(f"rank {r} at {t}" for r, t in tops.items()) if tops else ""
    if not any(d.recorder for d in answered.values()):
        return f"no Flight Recorder in these ranks (torch too old){at}"
    if not any(d.groups or d.entries for d in answered.values()):
        return f"no rank has entered a collective yet (still starting?){at}"
    # Every rank entered the same collectives: the hang is elsewhere (or inside one collective
    # on every rank, e.g. the network).
    lasts = []
    for pg in sorted({e.pg for d in answered.values() for e in d.entries}):
        top = max(d.last(pg) for d in answered.values())
        e = next((x for d in answered.values() if (x := d.entry(pg, top)) is not None), None)
        if e is not None:
            lasts.append(f"{e.name()} on pg {_group_label(pg, e.pg_desc)}")
    text = f"no rank is behind: all {len(answered)} entered the same collectives"
    if lasts:
        text += f" (last: {', '.join(lasts)})"
    return text + at


def collect_lines(lines: Iterable[str]) -> dict[int, RankDump]:
    """The newest dump of each rank among ``lines``."""
    out: dict[int, RankDump] = {}
    for line in lines:
        d = parse_fr_line(line)
        if d is not None:
            out[d.rank] = d
    return out

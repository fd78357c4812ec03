"""The typed parts of run.json's record (:class:`engine.rundir.record.RunRecord`): who launched
the run (:class:`LauncherRecord`), who is stuck where (:class:`DiagnosisRecord`) and what NCCL
chose against the plan (:class:`TransportRecord`).

They live here, below :mod:`engine.diagnose`, because run.json is the contract between a launch
backend and every reader: the diagnosis code (:mod:`engine.diagnose.flight`,
:mod:`engine.diagnose.transport`) builds these values, the run directory writes them, and a
reader parses them without importing the diagnosis code.

Each part serializes (``model_dump(mode="json")``, field order = key order) to exactly what
run.json held when these entries were plain dicts, so files old and new read and write the same.
Each has a ``from_untrusted`` that never raises: run.json may come from another machine or
version, and an entry a reader cannot make sense of must not cost it the rest of the file.
"""

from __future__ import annotations

from typing import Any, Self, TypeVar

from pydantic import BaseModel, Field, ValidationError

_M = TypeVar("_M", bound=BaseModel)


def _tolerant(cls: type[_M], data: dict[str, Any], required: dict[str, Any]) -> _M:
    """``cls`` from ``data``: a top-level key whose value does not validate is dropped (its
    field takes its default, or ``required``'s stand-in where the field has none), so what can
    be read is kept. A nested entry that is wrong costs its whole top-level key."""
    data = {**required, **data}
    while True:
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            locs = {err["loc"][0] for err in e.errors() if err["loc"]}
            # Each round drops a key or puts a stand-in in its place: the loop ends.
            bad = {k for k in data if k in locs and (k not in required or data[k] != required[k])}
            if not bad:
                return cls.model_validate(required)
            data = {
                k: required[k] if k in bad else v
                for k, v in data.items()
                if k not in bad or k in required
            }


# --------------------------------------------------------------------------- the launcher


class LauncherRecord(BaseModel, frozen=True):
    """The launcher process (:func:`engine.rundir.launcher.launcher_record`): enough for a
    reader on the same machine to tell whether it still runs. A field a file lacks (or holds
    as another type) is None: that reader cannot tell, and believes run.json."""

    pid: int | None = None
    start_ticks: int | None = None
    """When it started, clock ticks since boot (``/proc/<pid>/stat`` field 22)."""
    boot_id: str | None = None
    host: str | None = None

    @classmethod
    def from_untrusted(cls, data: dict[str, Any]) -> Self:
        """Each field of the right JSON type taken as is (no coercion: a pid written as a string
        is no pid this machine can check), every other one None."""

        def num(v: object) -> int | None:
            return int(v) if isinstance(v, int) else None

        def text(v: object) -> str | None:
            return v if isinstance(v, str) else None

        return cls(
            pid=num(data.get("pid")),
            start_ticks=num(data.get("start_ticks")),
            boot_id=text(data.get("boot_id")),
            host=text(data.get("host")),
        )


# --------------------------------------------------------------------------- the diagnosis


class Collective(BaseModel, frozen=True):
    """One Flight Recorder entry: a collective a rank entered."""

    pg: str
    """The process group's name (``"0"`` is the default group)."""
    pg_desc: str = ""
    """Its description (``default_pg``, or what ``new_group(group_desc=...)`` named it)."""
    seq: int
    """The collective's sequence number in its group (the same on every rank for one call)."""
    op: str
    """``all_reduce``, ``broadcast``, ``barrier``... (profiling name without ``gloo:``/``nccl:``)."""
    input_sizes: list[list[int]] = Field(default_factory=list)
    input_dtypes: list[str] = Field(default_factory=list)
    state: str = ""
    created_ns: int = 0

    def shapes(self) -> str:
        """``[1024] float32`` (each input, comma-separated)."""
        parts = []
        for i, size in enumerate(self.input_sizes):
            dtype = self.input_dtypes[i] if i < len(self.input_dtypes) else ""
            parts.append(f"[{', '.join(str(d) for d in size)}] {dtype}".strip())
        return ", ".join(parts) or "no tensors"

    def name(self) -> str:
        """``all_reduce #8``."""
        return f"{self.op} #{self.seq}"


class RankRef(BaseModel, frozen=True):
    rank: int
    node: int
    host: str = ""

    def where(self) -> str:
        return f"node {self.node}, host {self.host}" if self.host else f"node {self.node}"


class GroupFinding(BaseModel, frozen=True):
    """One process group where some ranks are behind the others."""

    pg: str
    pg_desc: str = ""
    behind: list[RankRef]
    """Ranks that never entered :attr:`missed`."""
    behind_last: dict[int, int] = Field(default_factory=dict)
    """Each behind rank's last collective sequence number in the group."""
    missed: Collective | None = None
    """The first collective the behind ranks never entered (None: outside every dump's buffer)."""
    missed_seq: int
    waiting: list[RankRef]
    """Ranks that entered it (and maybe more) and wait."""
    waiting_in: Collective | None = None
    """What the waiting ranks last entered."""


class DiagnosisRecord(BaseModel, frozen=True):
    """Who is stuck where (:func:`engine.diagnose.flight.diagnose`, which calls it
    ``Diagnosis``). ``summary`` is the one line shown everywhere."""

    summary: str
    why: str = ""
    """What triggered it (a hang, a monitor's request)."""
    at: float = 0.0
    """When it was made (wall seconds)."""
    stuck_ranks: list[int] = Field(default_factory=list)
    no_dump: list[RankRef] = Field(default_factory=list)
    groups: list[GroupFinding] = Field(default_factory=list)
    stacks: dict[int, list[str]] = Field(default_factory=dict)
    dumps: int = 0
    """How many ranks answered."""
    world_size: int = 0

    @classmethod
    def from_untrusted(cls, data: dict[str, Any]) -> Self:
        """What of ``data`` validates (a field that does not reads its default; no summary reads
        "")."""
        return _tolerant(cls, data, {"summary": ""})


# --------------------------------------------------------------------------- the transport


class TransportExpected(BaseModel, frozen=True):
    """What the plan told NCCL to use (:meth:`engine.diagnose.transport.TransportExpectation.to_json`)."""

    tier: str | None = None
    """The plan's inter-node fabric (``ib``, ``efa``, ``tcp``...; None: unknown)."""
    nccl_net: str | None = None
    """What NCCL should print as ``Using network …`` (None: unknown)."""
    nodes: int = 0
    dist_backend: str = ""
    backend: str = ""


class TransportNode(BaseModel, frozen=True):
    """What NCCL said on one node (:meth:`engine.diagnose.transport.NodeTransport.to_json`)."""

    network: str | list[str] = Field(default_factory=list)
    """The network NCCL chose; a list when it named none or more than one."""
    ib_no_device: bool = False
    ib_devices: list[str] = Field(default_factory=list)
    socket_ifaces: list[str] = Field(default_factory=list)
    bootstrap_ifaces: list[str] = Field(default_factory=list)
    gdrdma: bool | None = None
    plugins: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    plugin_failures: list[str] = Field(default_factory=list)
    """Written only when there are any."""
    iface_errors: list[str] = Field(default_factory=list)
    """Written only when there are any."""


class TransportFinding(BaseModel, frozen=True):
    """One thing wrong with the transport (:class:`engine.diagnose.transport.Finding`)."""

    kind: str = ""
    severity: str = ""
    """``error``, ``warning`` or ``note``."""
    title: str = ""
    causes: list[str] = Field(default_factory=list)
    fix: str = ""
    nodes: list[str] = Field(default_factory=list)


class TransportRecord(BaseModel, frozen=True):
    """The NCCL transport check's judgement
    (:meth:`engine.diagnose.transport.TransportReport.to_record`)."""

    verdict: str = "unknown"
    """``ok``, ``mismatch`` or ``unknown`` (NCCL said nothing yet)."""
    expected: TransportExpected | None = None
    chosen: list[str] = Field(default_factory=list)
    """The networks NCCL chose on any node, in order of first sight."""
    nodes: dict[str, TransportNode] = Field(default_factory=dict)
    """By node label (``node 1 (gpu-b)``)."""
    findings: list[TransportFinding] = Field(default_factory=list)
    """Worst first."""

    @classmethod
    def from_untrusted(cls, data: dict[str, Any]) -> Self:
        """What of ``data`` validates (a field that does not reads its default)."""
        return _tolerant(cls, data, {})

    def to_dict(self) -> dict[str, Any]:
        """run.json's ``transport`` entry (a node's empty ``plugin_failures`` and
        ``iface_errors`` left out, as the check writes them)."""
        data = self.model_dump(mode="json")
        for node in data["nodes"].values():
            for key in ("plugin_failures", "iface_errors"):
                if not node[key]:
                    del node[key]
        return data

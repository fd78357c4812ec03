"""Make sense of the lines distributed training prints: strip ANSI colour codes, split the prefixes
launchers add (torchrun, pdsh, SkyPilot, OpenMPI, Ray, TorchX; nested, outermost first), classify
NCCL and torch.distributed lines, spot errors and parse the example trainer's step lines.

Called by the monitor's reader thread (:func:`scan_batch` and :class:`NcclSummary`, per batch),
by the rank state (:mod:`engine.monitor.state`) and by whatever marks error lines (the monitor's
panes, ``monitor --follow --errors-only``: :func:`classify_error`). Pure and total: any string in, a
value out; a cut, spliced or hard-wrapped line never raises, it is attributed as far as its
prefixes allow and the rest is left as plain text.

Two speeds: :func:`parse_line` gives everything about one line of a foreign log (what
:func:`summarize_nccl` reads); :func:`scan_batch` gates on substring tests over the joined batch
first, so a firehose of INFO lines costs well under a microsecond per line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from engine.diagnose.nccl_facts import CHANNEL_VIA_RE as _CHANNEL_VIA_RE
from engine.diagnose.nccl_facts import INDEX_SEGMENT_RE as _INDEX_SEGMENT_RE
from engine.diagnose.nccl_facts import NETWORK_RE as _NETWORK_RE


class LineKind(StrEnum):
    """What a line is, for routing (NCCL pane) and highlighting."""

    PLAIN = "plain"
    NCCL_INFO = "nccl_info"
    NCCL_WARN = "nccl_warn"
    TORCH_DIST = "torch_dist"
    """torch's ProcessGroupNCCL / c10d / elastic messages."""
    STEP = "step"
    DONE = "done"
    ERROR = "error"


class ErrorKind(StrEnum):
    """The errors people search a distributed log for."""

    TRACEBACK = "traceback"
    CUDA_OOM = "cuda_oom"
    NCCL_WARN = "nccl_warn"
    NCCL_ERROR = "nccl_error"
    WATCHDOG_TIMEOUT = "watchdog_timeout"
    COMM_ABORTED = "comm_aborted"
    RENDEZVOUS = "rendezvous"
    CHILD_FAILED = "child_failed"
    EXCEPTION = "exception"
    DIAGNOSIS = "diagnosis"
    """dtrain-tui's own ``[dtrain-tui] diagnosis: …`` line: the stuck rank named."""


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One ``[dtrain] step=<n>/<total> loss=… tokens_per_s=… step_time_s=… mem_gb=…`` line."""

    step: int
    total: int
    loss: float
    tokens_per_s: float
    step_time_s: float
    mem_gb: float


@dataclass(frozen=True, slots=True)
class ParsedLine:
    """A raw line taken apart. ``rank`` is a global rank only when a prefix says so (OpenMPI,
    ``[rankN]:``, or torchrun's local rank with a known node); ``node`` is a node rank."""

    text: str
    rank: int | None = None
    local_rank: int | None = None
    node: int | None = None
    host: str = ""
    stream: str | None = None
    pid: int | None = None
    prefixes: tuple[str, ...] = ()
    """Names of the prefixes removed, outermost first (``openmpi``, ``torchrun``, ``pdsh``…)."""
    repeated: int = 1
    """Ray's ``[repeated Nx across cluster]`` count (the suffix is removed from ``text``)."""
    kind: LineKind = LineKind.PLAIN
    error: ErrorKind | None = None
    step: StepInfo | None = None
    nccl_host: str = ""
    """Host named by NCCL's own ``host:pid:tid [dev] NCCL INFO`` header, if any."""


# ANSI CSI / OSC sequences and lone escapes (a cut line can end inside one).
_ANSI_RE = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]?|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")

_OPENMPI_RE = re.compile(r"\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>:")
_TORCHRUN_RANK_RE = re.compile(r"\[rank(\d+)\]:")
_TORCHRUN_ROLE_RE = re.compile(r"\[([A-Za-z_][A-Za-z_-]*?)(\d+)\]:")
_TORCHRUN_HOST_RE = re.compile(r"\[([A-Za-z0-9][\w.-]*):(\d+)\]:")
_SKY_RE = re.compile(r"\((head|worker(\d+)), rank=(\d+), pid=(\d+)(?:, ip=([0-9a-fA-F.:]+))?\) ?")
_RAY_RE = re.compile(r"\(([A-Za-z_][\w.]*) pid=(\d+)(?:, ip=([0-9a-fA-F.:]+))?\) ?")
_TORCHX_RE = re.compile(r"([A-Za-z_][\w-]*)/(\d+) \[(\d+)\]:")
# pdsh: `host: ` where host is an IP or a lower-case host name with a digit or a dash; a word
# like `Warning: ` or `torch.distributed…Error: ` is not a host.
_PDSH_RE = re.compile(r"((?:\d{1,3}\.){3}\d{1,3}|[a-z0-9][a-z0-9-]*(?:\.[a-z0-9-]+)*): ")
_RAY_REPEAT_RE = re.compile(r"\s*\[repeated (\d+)x across cluster\]\s*$")
_NCCL_HEADER_RE = re.compile(r"([\w.-]+):(\d+):(\d+) \[(\d+)\] NCCL (?:INFO|WARN|TRACE)")

_STEP_RE = re.compile(
    r"\[dtrain\] step=(\d+)/(\d+) loss=(\S+) tokens_per_s=(\S+) step_time_s=(\S+) mem_gb=(\S+)"
)
_DONE_RE = re.compile(r"\[dtrain\] done steps=(\d+) time_s=(\S+)")

_TORCH_DIST_MARKERS = ("ProcessGroupNCCL", "c10d", "torch.distributed", "TCPStore", "[W socket")

# Ordered: the first matching pattern names the error (OOM before a generic exception line).
_ERROR_PATTERNS: tuple[tuple[ErrorKind, re.Pattern[str]], ...] = (
    (
        ErrorKind.CUDA_OOM,
        re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"),
    ),
    (ErrorKind.WATCHDOG_TIMEOUT, re.compile(r"Watchdog caught collective operation timeout")),
    (ErrorKind.COMM_ABORTED, re.compile(r"NCCL communicator was aborted")),
    (ErrorKind.NCCL_WARN, re.compile(r"NCCL WARN")),
    (
        ErrorKind.NCCL_ERROR,
        re.compile(
            r"unhandled (?:system|cuda) error|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|ncclRemoteError|NCCL error"
        ),
    ),
    (
        ErrorKind.RENDEZVOUS,
        re.compile(
            r"Rendezvous\w*Error|RendezvousClosedError|client socket has timed out|"
            r"[Ff]ailed to (?:connect|initialize) (?:to )?(?:the )?(?:rendezvous|store|TCPStore)|"
            r"DistNetworkError|DistStoreError"
        ),
    ),
    (ErrorKind.CHILD_FAILED, re.compile(r"ChildFailedError")),
    (ErrorKind.TRACEBACK, re.compile(r"^\s*Traceback \(most recent call last\)")),
    (ErrorKind.EXCEPTION, re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception): ")),
    # The launcher's stuck-rank diagnosis (engine.launch.frdump): an error of the run's.
    (ErrorKind.DIAGNOSIS, re.compile(r"^\[dtrain-tui\] diagnosis: ")),
)
# Substrings at least one of which every error line holds: the cheap gate over a whole batch.
_ERROR_GATE = (
    "[dtrain-tui] diagnosis: ",
    "Error",
    "error",
    "Traceback",
    "WARN",
    "out of memory",
    "Watchdog",
    "aborted",
    "timed out",
    "Exception",
)


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (a no-op, and fast, when there are none)."""
    if "\x1b" not in text:
        return text
    return _ANSI_RE.sub("", text)


def parse_step(text: str) -> StepInfo | None:
    """The trainer's step line anywhere in ``text``, or None (also for a cut or garbled one)."""
    m = _STEP_RE.search(text)
    if m is None:
        return None
    try:
        return StepInfo(
            step=int(m[1]),
            total=int(m[2]),
            loss=float(m[3]),
            tokens_per_s=float(m[4]),
            step_time_s=float(m[5]),
            mem_gb=float(m[6]),
        )
    except ValueError:
        return None


def classify_error(text: str) -> ErrorKind | None:
    """Which error ``text`` reports, or None."""
    if not any(g in text for g in _ERROR_GATE):
        return None
    for kind, pattern in _ERROR_PATTERNS:
        if pattern.search(text):
            return kind
    return None


def is_nccl(text: str) -> bool:
    """True for NCCL's own lines and torch's ProcessGroupNCCL / c10d messages: the NCCL pane's."""
    if "NCCL" in text:
        return True
    return any(m in text for m in _TORCH_DIST_MARKERS)


def classify(text: str) -> tuple[LineKind, ErrorKind | None]:
    """The kind of a prefix-free line, and the error it reports."""
    error = classify_error(text)
    if "[dtrain]" in text:
        if _STEP_RE.search(text):
            return LineKind.STEP, error
        if _DONE_RE.search(text):
            return LineKind.DONE, error
    if "NCCL WARN" in text:
        return LineKind.NCCL_WARN, error
    if "NCCL INFO" in text or text.lstrip().startswith("NCCL version"):
        return LineKind.NCCL_INFO, error
    if is_nccl(text):
        return LineKind.TORCH_DIST, error
    if error is not None:
        return LineKind.ERROR, error
    return LineKind.PLAIN, None


@dataclass
class _Peeled:
    """What the launcher prefixes peeled off one line said (see :func:`_peel`)."""

    node: int | None
    rank: int | None = None
    local_rank: int | None = None
    host: str = ""
    stream: str | None = None
    pid: int | None = None
    prefixes: list[str] = field(default_factory=list)


def _peel(text: str, p: _Peeled, pdsh: bool) -> int:
    """Match one launcher prefix at the start of ``text`` and record what it says in ``p``;
    the prefix's length, 0 when there is none. Each kind at most once per line except
    torchrun's, which nests ([default0]:[rank0]:)."""
    m = _OPENMPI_RE.match(text)
    if m is not None:
        p.rank = int(m[2])
        p.stream = "stdout" if m[3] != "stderr" else "stderr"
        p.prefixes.append("openmpi")
        return m.end()
    m = _SKY_RE.match(text)
    if m is not None and "skypilot" not in p.prefixes:
        p.node = int(m[3])
        p.pid = int(m[4])
        p.host = m[5] or p.host or m[1]
        p.prefixes.append("skypilot")
        return m.end()
    m = _RAY_RE.match(text)
    if m is not None and "ray" not in p.prefixes:
        p.pid = int(m[2])
        p.host = m[3] or p.host
        p.prefixes.append("ray")
        return m.end()
    return _peel_torch(text, p) or _peel_pdsh(text, p, pdsh)


def _peel_torch(text: str, p: _Peeled) -> int:
    """torchrun's and torchx's prefixes, as :func:`_peel`."""
    m = _TORCHRUN_RANK_RE.match(text)
    if m is not None:
        p.rank = int(m[1])
        p.prefixes.append("torchrun")
        return m.end()
    m = _TORCHRUN_HOST_RE.match(text)
    if m is not None:
        p.host = m[1]
        p.local_rank = int(m[2])
        p.prefixes.append("torchrun")
        return m.end()
    m = _TORCHRUN_ROLE_RE.match(text)
    if m is not None and not m[1].startswith("rank"):
        p.local_rank = int(m[2])
        p.prefixes.append("torchrun")
        return m.end()
    m = _TORCHX_RE.match(text)
    if m is not None and "torchx" not in p.prefixes:
        p.node = int(m[2])
        p.local_rank = int(m[3])
        p.prefixes.append("torchx")
        return m.end()
    return 0


def _peel_pdsh(text: str, p: _Peeled, pdsh: bool) -> int:
    """pdsh's ``host: `` prefix, only as the outermost one, as :func:`_peel`."""
    if pdsh and not p.prefixes:
        m = _PDSH_RE.match(text)
        if m is not None and any(c.isdigit() or c == "-" for c in m[1]):
            p.host = m[1]
            p.prefixes.append("pdsh")
            return m.end()
    return 0


def parse_line(
    raw: str,
    *,
    node: int | None = None,
    gpus_per_node: int | None = None,
    pdsh: bool = True,
) -> ParsedLine:
    """Take ``raw`` apart. ``node`` and ``gpus_per_node``, when the caller knows them (a launch
    backend reading node i's output), turn torchrun's local rank into a global rank."""
    text = strip_ansi(raw).rstrip("\r\n")
    p = _Peeled(node)
    for _ in range(8):  # prefixes, outermost first
        n = _peel(text, p, pdsh)
        if not n:
            break
        text = text[n:]
    node, rank, local_rank, host, pid = p.node, p.rank, p.local_rank, p.host, p.pid
    repeated = 1
    if "repeated" in text:
        m = _RAY_REPEAT_RE.search(text)
        if m is not None:
            repeated = int(m[1])
            text = text[: m.start()]
    if rank is None and local_rank is not None and node is not None and gpus_per_node:
        rank = node * gpus_per_node + local_rank
    nccl_host = ""
    if "NCCL" in text:
        m = _NCCL_HEADER_RE.search(text)
        if m is not None:
            nccl_host = m[1]
            if not host:
                host = m[1]
            if pid is None:
                pid = int(m[2])
    kind, error = classify(text)
    step = parse_step(text) if kind is LineKind.STEP else None
    return ParsedLine(
        text=text,
        rank=rank,
        local_rank=local_rank,
        node=node,
        host=host,
        stream=p.stream,
        pid=pid,
        prefixes=tuple(p.prefixes),
        repeated=repeated,
        kind=kind,
        error=error,
        step=step,
        nccl_host=nccl_host,
    )


# ---- batch helpers: the monitor's hot path -------------------------------------------------


def scan_steps(lines: Sequence[str]) -> list[StepInfo]:
    """The trainer's step lines in a batch, in order."""
    joined = "\n".join(lines)
    if "[dtrain] step=" not in joined:
        return []
    out: list[StepInfo] = []
    for m in _STEP_RE.finditer(joined):
        try:
            out.append(
                StepInfo(int(m[1]), int(m[2]), float(m[3]), float(m[4]), float(m[5]), float(m[6]))
            )
        except ValueError:
            continue
    return out


@dataclass(frozen=True, slots=True)
class BatchFacts:
    """What the monitor needs from a batch of one rank's lines, found in one pass."""

    nccl: list[str]
    """Lines for the NCCL pane, in order."""
    errors: list[tuple[int, ErrorKind]]
    """``(index in the batch, kind)`` of each error line."""
    steps: list[StepInfo]
    done: bool


def scan_batch(lines: Sequence[str]) -> BatchFacts:
    """One pass over a batch: route NCCL lines, find errors, steps and the trainer's done line.

    The hot path of the monitor. NCCL INFO lines (the bulk of a chatty run) are only routed:
    they are never errors, steps or done lines, so the substring gates of the other checks run
    over the joined remaining lines only.
    """
    nccl: list[str] = []
    other: list[str] = []
    other_idx: list[int] = []
    for i, line in enumerate(lines):
        if "NCCL" in line:
            nccl.append(line)
            if "NCCL INFO" in line:
                continue
        other.append(line)
        other_idx.append(i)
    errors: list[tuple[int, ErrorKind]] = []
    steps: list[StepInfo] = []
    done = False
    if other:
        joined = "\n".join(other)
        if any(m in joined for m in _TORCH_DIST_MARKERS):
            seen = set(nccl)
            torch_lines = {j for j, x in enumerate(other) if x not in seen and is_nccl(x)}
            if torch_lines:
                # Keep batch order: rebuild the NCCL list from the original positions.
                keep = {other_idx[j] for j in torch_lines}
                nccl = [x for i, x in enumerate(lines) if "NCCL" in x or i in keep]
        if any(g in joined for g in _ERROR_GATE):
            for j, line in enumerate(other):
                kind = classify_error(line)
                if kind is not None:
                    errors.append((other_idx[j], kind))
        if "[dtrain]" in joined:
            steps = scan_steps(other)
            done = "[dtrain] done" in joined
    return BatchFacts(nccl, errors, steps, done)


# ---- NCCL facts from a whole log -----------------------------------------------------------

_NCCL_VERSION_RE = re.compile(r"NCCL version (\d+\.\d+\.\d+)(?:\+(\S+))?")
_INIT_COMPLETE_RE = re.compile(r"comm (0x[0-9a-f]+) rank (\d+) nranks (\d+).*Init COMPLETE")
_SUMMARY_PHRASES = (
    "NCCL WARN",
    "NCCL version",
    "Using network",
    "Init COMPLETE",
    "No device found",
    "bus bandwidth",
    "NCCL INFO Bootstrap",
)
_BUSBW_RE = re.compile(r"Avg bus bandwidth\s*:\s*([\d.]+)")


@dataclass(slots=True)
class NcclSummary:
    """What the NCCL pane's header says about a run: version, transports, init progress."""

    versions: set[str] = field(default_factory=set)
    networks: set[str] = field(default_factory=set)
    """``IB``, ``Socket``, ``AWS Libfabric``… from ``Using network X``."""
    transports: set[str] = field(default_factory=set)
    """Channel transports: ``P2P/IPC/read``, ``NET/IB/0/GDRDMA``…"""
    hosts: set[str] = field(default_factory=set)
    init_complete: int = 0
    init_ranks: set[tuple[str, int]] = field(default_factory=set)
    warnings: int = 0
    ib_no_device: bool = False
    avg_busbw_gbps: float | None = None
    _via_budget: int = 4096
    """Channel lines still looked at in :meth:`feed_batch` (transports are set up at init)."""
    _line_budget: int = 200_000
    """NCCL lines fully looked at by :meth:`feed_batch`; version, network and transports are
    printed at communicator set-up, so a firehose later on costs two substring scans a batch."""

    @property
    def gdrdma(self) -> bool:
        return any("GDRDMA" in t for t in self.transports)

    def feed(self, text: str) -> None:
        """Account for one prefix-free line."""
        if "NCCL" not in text and "bus bandwidth" not in text:
            return
        if "NCCL WARN" in text:
            self.warnings += 1
        m = _NCCL_HEADER_RE.search(text)
        if m is not None:
            self.hosts.add(m[1])
        if "NCCL version" in text:
            m = _NCCL_VERSION_RE.search(text)
            if m is not None:
                self.versions.add(m[1])
        if "Using network" in text:
            m = _NETWORK_RE.search(text)
            if m is not None:
                self.networks.add(m[1])
        if "Init COMPLETE" in text:
            self.init_complete += 1
            m = _INIT_COMPLETE_RE.search(text)
            if m is not None:
                self.init_ranks.add((m[1], int(m[2])))
        if " via " in text:
            m = _CHANNEL_VIA_RE.search(text)
            if m is not None:
                # Drop channel/device indices: NET/IB/3/GDRDMA -> NET/IB/GDRDMA.
                self.transports.add(_INDEX_SEGMENT_RE.sub("", m[1].strip()))
        if "NET/IB : No device found" in text:
            self.ib_no_device = True
        if "bus bandwidth" in text:
            m = _BUSBW_RE.search(text)
            if m is not None:
                self.avg_busbw_gbps = float(m[1])

    def feed_batch(self, lines: Sequence[str]) -> None:
        """Account for a batch of prefix-free lines; cheap for a firehose of plain INFO lines
        (one substring scan of the joined batch per fact, channel lines sampled)."""
        joined = "\n".join(lines)
        if "NCCL" not in joined and "bus bandwidth" not in joined:
            return
        if self._line_budget <= 0:
            # Past start-up only the facts that keep changing are looked for.
            phrases = [p for p in ("Init COMPLETE", "NCCL WARN") if p in joined]
        else:
            self._line_budget -= len(lines)
            phrases = [p for p in _SUMMARY_PHRASES if p in joined]
        if " via " in joined and self._via_budget > 0:
            phrases.append(" via ")
        if not phrases:
            return
        for line in lines:
            if any(p in line for p in phrases):
                if " via " in line:
                    if self._via_budget <= 0:
                        continue
                    self._via_budget -= 1
                self.feed(line)

    def headline(self) -> str:
        """One line for the NCCL pane's title: ``NCCL 2.21.5 · IB/GDRDMA · 16 init`` (empty
        before NCCL said anything)."""
        parts: list[str] = []
        if self.versions:
            parts.append("NCCL " + ",".join(sorted(self.versions)))
        if self.networks:
            net = "+".join(sorted(self.networks))
            parts.append(net + ("/GDRDMA" if self.gdrdma else ""))
        if self.init_complete:
            parts.append(f"{self.init_complete} init")
        if self.warnings:
            parts.append(f"{self.warnings} WARN")
        return " · ".join(parts)


def summarize_nccl(lines: Iterable[str]) -> NcclSummary:
    """Summarise raw lines (prefixes and ANSI are stripped here)."""
    summary = NcclSummary()
    for raw in lines:
        summary.feed(parse_line(raw).text)
    return summary

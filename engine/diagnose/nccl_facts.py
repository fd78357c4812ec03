"""NCCL's transport choices as facts, read from prefix-free lines
(:class:`engine.diagnose.transport.NcclFact`), and :class:`TransportNotes`, the transport check
fed as lines come. Used by the launcher (:mod:`engine.launch.transport_watch`, which writes
run.json's ``transport``), by the monitor (its rank state, ``monitor --follow``) and by
:mod:`engine.monitor.logparse` (the regexes its NCCL summary shares); it sits in diagnose so that
launch and monitor stay siblings over the run directory.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from engine.diagnose.transport import (
    MAX_NODES_TRACKED,
    FactKind,
    Finding,
    NcclFact,
    TransportCheck,
    TransportExpectation,
    TransportReport,
)

NETWORK_RE = re.compile(r"NCCL INFO Using network (.+?)\s*$")
CHANNEL_VIA_RE = re.compile(r"via ((?:NET|P2P|SHM)/[\w /-]*?\w)\s*$")
INDEX_SEGMENT_RE = re.compile(r"/\d+(?=/|$)")

# ---- NCCL's transport choices (the transport check's facts) ----------------------------------

_NET_IB_USING_RE = re.compile(r"NET/IB\w* : Using (.*)")
_IB_PORT_RE = re.compile(r"\[\d+\]([\w.-]+:\d+/(?:IB|RoCE))")
_SOCKET_USING_RE = re.compile(r"NET/Socket : Using (.*)")
_IFACE_ITEM_RE = re.compile(r"\[\d+\]([^\s:\[\]<>]+):")
_BOOTSTRAP_RE = re.compile(r"Bootstrap ?: Using (?:\[\d+\])?([^\s:\[\]<>]+):")
_SET_BY_ENV_RE = re.compile(r"NCCL INFO ([A-Z][A-Z0-9_]*) set (?:by environment )?to (.*?)\s*$")
_PLUGIN_LOADED_RE = re.compile(r"Loaded (?:net|coll) plugin (.+?)(?: \(v\d+\))?\.?\s*$")
_PLUGIN_FAILED_RE = re.compile(
    r"[Pp]lugin load (?:\([^)]*\) )?returned \d+ : (.+?)(?: : when loading \S+)?\s*$"
)
_IFACE_ERROR_PHRASES = (
    "no socket interface found",
    "No socket interface found",
    "no NCCL_SOCKET_IFNAME interface found",
    "No usable listening interface found",
    "No interface found in the same subnet",
    "is neither AF_INET(2) nor AF_INET6(10)",
)
_TRANSPORT_PHRASES = (
    "Using network",
    "NET/",
    "Bootstrap",
    " set ",
    "nterface found",
    "AF_INET",
    "lugin",
)
"""At least one of these is in every line :func:`nccl_transport_facts` finds a fact in."""


def nccl_transport_facts(text: str) -> list[NcclFact]:
    """What a prefix-free line says about NCCL's transport (see
    :class:`engine.diagnose.transport.FactKind`); [] for any other line."""
    F = FactKind
    out: list[NcclFact] = []
    if any(p in text for p in _IFACE_ERROR_PHRASES):
        i = text.find("WARN ")
        msg = text[i + 5 :] if i >= 0 else text
        return [NcclFact(F.IFACE_ERROR, msg.strip()[:200])]
    if "NCCL" not in text:
        return out
    if "Using network" in text:
        m = NETWORK_RE.search(text)
        if m is not None:
            out.append(NcclFact(F.NETWORK, m[1]))
            if "Libfabric" in m[1]:
                out.append(NcclFact(F.PLUGIN, "OFI"))
        return out
    if " via NET/" in text:
        m = CHANNEL_VIA_RE.search(text)
        if m is not None:
            out.append(NcclFact(F.CHANNEL, INDEX_SEGMENT_RE.sub("", m[1].strip())))
        return out
    if "NET/IB" in text:
        if "No device found" in text:
            out.append(NcclFact(F.IB_NO_DEVICE))
        m = _NET_IB_USING_RE.search(text)
        if m is not None:
            out.extend(NcclFact(F.IB_DEVICE, d) for d in _IB_PORT_RE.findall(m[1]))
        if "NET/IBext" in text:
            out.append(NcclFact(F.PLUGIN, "IBext"))
    if "NET/Socket : Using" in text:
        m = _SOCKET_USING_RE.search(text)
        if m is not None:
            out.extend(NcclFact(F.SOCKET_IFACE, i) for i in _IFACE_ITEM_RE.findall(m[1]))
    if "Bootstrap" in text:
        m = _BOOTSTRAP_RE.search(text)
        if m is not None:
            out.append(NcclFact(F.BOOTSTRAP_IFACE, m[1]))
    if " set " in text:
        m = _SET_BY_ENV_RE.search(text)
        if m is not None:
            value = m[2][:-1] if m[2].endswith(".") else m[2]
            out.append(NcclFact(F.ENV, f"{m[1]}={value}"))
    if "NET/OFI" in text:
        out.append(NcclFact(F.PLUGIN, "OFI"))
    if "lugin" in text:
        if "Using internal network plugin" in text or "No plugin found" in text:
            out.append(NcclFact(F.PLUGIN, "internal"))
        m = _PLUGIN_LOADED_RE.search(text)
        if m is not None:
            out.append(NcclFact(F.PLUGIN, m[1]))
        m = _PLUGIN_FAILED_RE.search(text)
        if m is not None:
            out.append(NcclFact(F.PLUGIN_FAILED, m[1]))
    return out


def scan_transport(lines: Sequence[str]) -> list[NcclFact]:
    """:func:`nccl_transport_facts` over a batch of prefix-free lines, in order; a batch without
    any transport phrase costs a join and a few substring scans."""
    joined = "\n".join(lines)
    phrases = [p for p in _TRANSPORT_PHRASES if p in joined]
    if not phrases:
        return []
    out: list[NcclFact] = []
    for line in lines:
        if any(p in line for p in phrases):
            out.extend(nccl_transport_facts(line))
    return out


NODE_LINE_BUDGET = 50_000
"""NCCL lines of each node a :class:`TransportNotes` looks at. NCCL picks its transport while
it sets a communicator up, at start-up; a firehose of NCCL INFO lines later on then costs
nothing (the look costs about 0.7 us a line)."""


def node_label(node: int, host: str = "") -> str:
    """How a node of a run is named in findings: ``node 1 (gpu-b)``."""
    return f"node {node} ({host})" if host else f"node {node}"


class TransportNotes:
    """A :class:`TransportCheck` over a run's lines that hands out each finding once.
    ``source_dir``: a run or bundle directory to judge against (read on the first transport
    line, when it surely exists)."""

    def __init__(
        self,
        expect: TransportExpectation | None = None,
        *,
        source_dir: Path | str | None = None,
    ) -> None:
        self.check = TransportCheck(expect)
        self.source_dir = Path(source_dir) if source_dir is not None else None
        self._told: set[tuple[str, str]] = set()
        self.budget: dict[int, int] = {}
        """NCCL lines still looked at, per node (see :data:`NODE_LINE_BUDGET`)."""

    def feed(self, node: int, host: str, lines: Sequence[str], nccl_lines: int = -1) -> bool:
        """Lines of ``node`` (prefix-free); True when the check learnt something.
        ``nccl_lines``: how many of them are NCCL's (what the budget counts; -1: all)."""
        left = self.budget.get(node, NODE_LINE_BUDGET)
        if left <= 0 or (node not in self.budget and len(self.budget) >= MAX_NODES_TRACKED):
            return False
        if nccl_lines < 0:
            nccl_lines = sum("NCCL" in x for x in lines)
        self.budget[node] = left - nccl_lines
        facts = scan_transport(lines)
        if not facts:
            return False
        if self.check.expect is None and self.source_dir is not None:
            self.check.set_expectation(TransportExpectation.load(self.source_dir))
        return self.check.observe(node_label(node, host), facts)

    def report(self) -> TransportReport:
        return self.check.report()

    def fresh(self) -> list[Finding]:
        """Findings not handed out before (each kind and title once)."""
        out: list[Finding] = []
        for f in self.check.report().findings:
            key = (f.kind.value, f.title)
            if key not in self._told:
                self._told.add(key)
                out.append(f)
        return out

"""Feeding the NCCL transport check (:mod:`engine.diagnose.transport`) from lines as they come:
:class:`TransportNotes` for consumers that print each finding once (``monitor --follow``, the
launcher, which also writes the report into run.json), :func:`check_log` for a whole foreign
log (launcher prefixes, ANSI colours and Ray's dedup suffixes are taken apart by
:func:`engine.monitor.logparse.parse_line`). The rank state (:mod:`engine.monitor.state`) keeps
its own check for the monitor's NCCL pane.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from engine.diagnose.transport import (
    MAX_NODES_TRACKED,
    Finding,
    TransportCheck,
    TransportExpectation,
    TransportReport,
)
from engine.monitor.logparse import nccl_transport_facts, parse_line, scan_transport

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


def check_log(lines: Iterable[str], expect: TransportExpectation | None = None) -> TransportReport:
    """The transport check over a whole log as captured (any launcher's prefixes): a node is
    named by NCCL's own ``host:pid:tid`` header, else by the prefix's host."""
    check = TransportCheck(expect)
    for raw in lines:
        if "NCCL" not in raw and "AF_INET" not in raw and "nterface found" not in raw:
            continue
        p = parse_line(raw)
        facts = nccl_transport_facts(p.text)
        if facts:
            check.observe(p.nccl_host or p.host or "?", facts)
    return check.report()

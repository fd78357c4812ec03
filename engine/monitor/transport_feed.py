"""The NCCL transport check (:mod:`engine.diagnose.transport`) over a whole foreign log:
:func:`check_log` (consumers fed line by line use :class:`engine.diagnose.nccl_facts.TransportNotes`:
``monitor --follow``, the launcher, which also writes the report into run.json). A foreign
log (launcher prefixes, ANSI colours and Ray's dedup suffixes are taken apart by
:func:`engine.monitor.logparse.parse_line`). The rank state (:mod:`engine.monitor.state`) keeps
its own check for the monitor's NCCL pane.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.diagnose.nccl_facts import nccl_transport_facts
from engine.diagnose.transport import TransportCheck, TransportExpectation, TransportReport
from engine.monitor.logparse import parse_line


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

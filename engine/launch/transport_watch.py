"""The launcher's NCCL transport check: every node's reader threads feed it the lines they read
(:class:`engine.launch.run_state.RunContext`), and run.json's ``transport`` entry is rewritten
when the judgement changes (verdict, networks chosen, findings), not on every new fact.

Judged against the bundle's plan.json, nccl.env and sky.yaml and the backend actually used
(:meth:`engine.diagnose.transport.TransportExpectation.load`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.diagnose.nccl_facts import TransportNotes
from engine.diagnose.transport import TransportExpectation
from engine.launch.torchrun_output import Groups
from engine.rundir.files import RunDir


class TransportWatch:
    """Thread-safe: :meth:`feed` is called from every stream's reader thread."""

    def __init__(self, run: RunDir, bundle_dir: Path, backend: str) -> None:
        self.run = run
        self.notes = TransportNotes(TransportExpectation.load(bundle_dir, backend=backend))
        self._lock = threading.Lock()
        self._written: Any = None

    def feed(self, groups: Groups, hosts: Sequence[str]) -> None:
        """Lines just read, per (node, rank); run.json is rewritten when the verdict changed.
        A run directory that cannot be written is the supervisor's to report (it finds out
        through the log writes); this never raises for it."""
        with self._lock:
            changed = False
            for (node, _rank), lines in groups.items():
                host = hosts[node] if 0 <= node < len(hosts) else ""
                changed = self.notes.feed(node, host, lines) or changed
            if not changed:
                return
            rec = self.notes.report().to_record()
            key = (
                rec.verdict,
                tuple(rec.chosen),
                tuple((label, str(n.network)) for label, n in rec.nodes.items()),
                tuple((f.kind, f.title, tuple(f.nodes)) for f in rec.findings),
            )
            if key == self._written:
                return
            self._written = key
            try:
                self.run.set_transport(rec)
            except OSError:
                pass

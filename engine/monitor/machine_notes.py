"""The GPU panel and the plan-against-measured line in text, for ``monitor --follow``: a
``[gpu] GPU 3 on node 1: throttled (HW slowdown)`` line the first time a machine is flagged,
and at the run's end a ``[plan] plan vs measured ...`` line that names the ``calibrate`` command
to run when the two disagree.

:mod:`cli.monitor_cmd` feeds it the events it prints; it keeps its own rank state
(:class:`engine.monitor.state.MonitorState`) from them. Pure but for reading plan.json once.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from pathlib import Path

from engine.monitor.compare import compare, read_plan_figures
from engine.monitor.machines import all_flags, machines
from engine.monitor.state import MonitorState
from engine.rundir.events import Event


class MachineNotes:
    def __init__(self, run_dir: Path | None) -> None:
        self.state = MonitorState()
        self.run_dir = shlex.quote(str(run_dir)) if run_dir is not None else "RUN"
        self.plan = read_plan_figures(run_dir)
        self._told: set[tuple[int, str]] = set()
        """(rank, flag kind) told: a slow rank's step time changes, it is told once."""
        self._now = 0.0

    def feed(self, events: Iterable[Event], now: float) -> list[str]:
        """Lines for the flags raised since the last call (each flag once)."""
        self._now = now
        self.state.apply(events, now)
        self.state.evaluate(now)
        out = []
        for f in all_flags(machines(self.state.ranks)):
            if (f.rank, f.kind) not in self._told:
                self._told.add((f.rank, f.kind))
                out.append(f"[gpu] {f.text}")
        return out

    def end(self) -> list[str]:
        """The plan-against-measured line, when there is something to compare."""
        self.state.evaluate(self._now)
        pvm = compare(self.plan, self.state.ranks)
        if pvm is None:
            return []
        offer = f"run `dtrain-tui calibrate {self.run_dir}` to fit the estimates to this run"
        return [f"[plan] {pvm.line(offer)}"]


__all__ = ["MachineNotes"]

"""The live monitor: a grid of per-rank (or per-node) panes, the NCCL pane, rank states with a
loss / throughput chart, the error list; filter and search across panes; jump to the next error.

``MonitorScreen(source, run_dir=None)`` watches any :class:`engine.rundir.events.EventSource` (a live
launch, a run directory being tailed, a canned list in tests); the wizard pushes it after a
launch, ``dtrain-tui monitor RUN_DIR`` runs it inside the small :class:`MonitorApp`.

Built for a firehose (64 ranks printing NCCL INFO at once): the engine's
:class:`~engine.monitor.reader.BatchReader` drains the source on a thread worker and delivers one
:class:`RankLinesReceived` per 50-250 ms, the next only once the screen has taken the previous
one in (so a busy UI makes batches bigger, never the queue longer). Panes are views onto capped
buffers; a batch costs a ``deque.extend`` per rank and drawing only touches visible rows. The
screen itself only wires things: the grid (:mod:`tui.widgets.pane_grid`) lays out, pages and
zooms panes, the header, strip, table, chart and error list draw the rank states.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal

from engine.errors import DtrainError
from engine.monitor.compare import read_plan_figures
from engine.monitor.reader import Batch, BatchReader, FirehoseTuning
from engine.monitor.state import ErrorRecord, MonitorState, Snapshot
from engine.rundir.events import EventSource, stop_run
from engine.rundir.record import FINAL_STATES, RunState, read_record
from tui.lifecycle import torn_down
from tui.messages import RankLinesReceived, RunFinished
from tui.screens.monitor_keys import MonitorKeys
from tui.screens.monitor_stop import StopGuard
from tui.widgets.charts import RankCharts
from tui.widgets.filter_box import FilterBox
from tui.widgets.gpu_panel import GpuPanel
from tui.widgets.monitor_footer import MonitorFooter
from tui.widgets.monitor_header import MonitorHeader
from tui.widgets.monitor_side import MonitorSide
from tui.widgets.nccl_pane import NcclPane
from tui.widgets.pane_frames import sync_in_frames
from tui.widgets.pane_grid import PaneGrid
from tui.widgets.plan_line import PlanLine
from tui.widgets.rank_pane import DEFAULT_MAX_LINES
from tui.widgets.rank_strip import RankStrip

CHROME_INTERVAL_S = 0.25
"""Header, rank strip, table, chart and pane titles redraw at most this often under a firehose
(panes themselves follow every batch); a state change (exit, finish) redraws at once."""
STOP_ECHO = re.compile(
    r"^Traceback \(most recent call last\):$|SignalException|got signal: (2|15)\b"
)
"""What torchrun prints when a stop reaches it (its own traceback for SIGTERM / SIGINT): in a
run that ended ``stopped`` these node lines are the stop itself, not errors to count."""


def stop_echo(rec: ErrorRecord, run_state: str) -> bool:
    """``rec`` is the echo of the user's stop: a node-level line of a run that ended stopped."""
    return run_state == RunState.STOPPED and rec.rank is None and bool(STOP_ECHO.search(rec.text))


def launch_nodes(source: EventSource, run_dir: Path | None) -> int:
    """How many nodes the run starts on: a launch backend's manifest, else run.json's
    ``nodes``; 0 when neither says (a canned source, a run.json not written yet)."""
    manifest = getattr(source, "manifest", None)
    nodes = getattr(manifest, "nodes", 0)
    if isinstance(nodes, int) and nodes > 0:
        return nodes
    if run_dir is None:
        return 0
    try:
        return read_record(run_dir).nodes
    except DtrainError:
        return 0


def _monitor_commands() -> Any:
    """The palette's monitor provider, imported when the palette first opens."""
    from tui.screens.monitor_commands import MonitorCommands

    return MonitorCommands


class MonitorScreen(MonitorKeys):
    """Watch ``source``. ``clock`` (wall seconds) is injectable so snapshots are repeatable.
    ``stop_source_on_exit``: closing the screen also stops the source (for a live launch: the
    run); off by default, so leaving the monitor never kills a run by surprise."""

    DEFAULT_CSS = """
    MonitorScreen { layout: vertical; layers: default filter; }
    MonitorScreen #mon-body { height: 1fr; }
    MonitorScreen.-fullscreen #mon-header { display: none; }
    MonitorScreen.-fullscreen #mon-strip { display: none; }
    MonitorScreen.-fullscreen #mon-side { display: none; }
    MonitorScreen.-fullscreen #nccl-pane { display: none; }
    MonitorScreen.-nccl-full #mon-body { display: none; }
    MonitorScreen.-nccl-full #nccl-pane { display: block; height: 1fr; }
    MonitorScreen.-fullscreen #mon-gpus, MonitorScreen.-fullscreen #mon-charts { display: none; }
    MonitorScreen.-nccl-full #mon-gpus, MonitorScreen.-nccl-full #mon-charts { display: none; }
    """
    COMMANDS: ClassVar[set[Any]] = {lambda: _monitor_commands()}

    BINDINGS = [
        # The footer shows these in this order and cuts what a narrow terminal cannot hold:
        # the keys a person needs in trouble first (all of them are in ? and the palette).
        Binding("b", "back", "Back to wizard"),
        Binding("q", "quit", "Quit"),  # shown where no wizard lies beneath; else "leave" below
        Binding("question_mark", "help", "Help"),
        Binding("ctrl+x", "stop_run", "Stop run"),
        # Once the run ended the footer drops "Stop run", and ctrl+x says why nothing stops.
        Binding("ctrl+x", "stop_run_over", "Stop run", show=False),
        Binding("e", "next_error", "Next error"),
        Binding("slash", "search", "Filter"),
        Binding("tab", "cycle(1)", "Next pane", show=False, priority=True),
        Binding("shift+tab", "cycle(-1)", "Prev pane", show=False, priority=True),
        Binding("z", "zoom", "Zoom"),
        Binding("v", "toggle_view", "Rank/node"),
        Binding("right_square_bracket", "page(1)", "Page →"),
        Binding("left_square_bracket", "page(-1)", "← Page", show=False),
        Binding("f", "follow", "Follow", show=False),
        Binding("c", "toggle_nccl", "NCCL pane"),
        Binding("t", "toggle_side", "Table"),
        Binding("escape", "clear", "Clear", show=False),
        Binding("d", "diagnose", "Diagnose", show=False),
        Binding("w", "toggle_sideways", "Long lines", show=False),
        Binding("q", "leave", "Leave", show=False),
        Binding("k", "calibrate", "Calibrate", show=False),
        Binding("g", "toggle_gpus", "GPUs", show=False),
        Binding("p", "toggle_charts", "Charts", show=False),
        Binding("f1", "help", "Help", show=False),
    ]

    def __init__(
        self,
        source: EventSource,
        run_dir: Path | None = None,
        *,
        title: str = "",
        world_size: int = 0,
        clock: Callable[[], float] = time.time,
        max_lines: int = DEFAULT_MAX_LINES,
        batch_interval: float = 0.1,
        hang_after_s: float = 60.0,
        idle_after_s: float = 10.0,
        stop_source_on_exit: bool = False,
        can_go_back: bool = False,
        nodes: int = 0,
    ) -> None:
        super().__init__()
        self.source = source
        self.can_go_back = can_go_back
        """A wizard lies beneath: ``b`` (or ``esc`` with nothing to clear, or ``q``) goes back to
        it and leaves the run going; the app keeps this screen, so it can be reopened."""
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.run_title = title or (self.run_dir.name if self.run_dir is not None else "run")
        self.idle_after_s = idle_after_s
        self.stop_source_on_exit = stop_source_on_exit
        state = MonitorState(world_size, hang_after_s=hang_after_s)
        state.transport_dir = self.run_dir  # the plan the NCCL transport is checked against
        self.reader = BatchReader(
            source,
            state,
            deliver=self._deliver,
            finish=self._finish,
            clock=clock,
            max_lines=max_lines,
            batch_interval=batch_interval,
        )
        """Owns the rank states on its thread; the screen sees the snapshots it delivers."""
        self.grid = PaneGrid(
            state.snapshot(clock()),
            max_lines=max_lines,
            idle_after_s=idle_after_s,
            on_change=self._render_chrome,
            id="pane-grid",
        )
        self.nccl = NcclPane(max_lines, id="nccl-pane")
        self.error_cursor: int | None = None
        self.delivered = 0
        """Lines handed to panes so far (the benchmark's figure)."""
        self.batches = 0
        self.max_batch_ms = 0.0
        """Longest time the UI thread spent taking in one batch (the benchmark reports it)."""
        self.finished: str | None = None
        self._tuning = FirehoseTuning()
        self._chrome_at = 0.0
        self._stop_guard = StopGuard()
        self._side_choice: bool | None = None
        """Shown (True) or hidden (False) by ``t``; None: by the terminal's width."""
        self._nccl_full = False
        self.plan_figures = read_plan_figures(self.run_dir)
        """What the run's plan.json promises (None: no plan to compare with)."""
        self.launch_nodes = nodes or launch_nodes(source, self.run_dir)
        """The nodes the run was launched on (0: not known yet), said while it starts."""

    @property
    def snapshot(self) -> Snapshot:
        """The rank states delivered with the latest batch."""
        return self.grid.snapshot

    # ---- composition -------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield MonitorHeader("", id="mon-header")
        yield RankStrip(idle_after_s=self.idle_after_s, id="mon-strip")
        yield PlanLine(id="mon-plan")
        with Horizontal(id="mon-body"):
            yield self.grid
            yield MonitorSide(idle_after_s=self.idle_after_s, id="mon-side")
        yield GpuPanel(id="mon-gpus")
        yield RankCharts(id="mon-charts")
        yield self.nccl
        yield FilterBox(id="mon-search")
        yield MonitorFooter()

    def on_mount(self) -> None:
        self._tuning.apply()
        self._size_side()
        self._size_nccl_pane()
        self._render_chrome()
        self.call_after_refresh(self.grid.relayout)
        self._read_events()
        self.set_interval(1.0, self._render_chrome)

    def on_unmount(self) -> None:
        self._tuning.restore()
        self.reader.stop.set()
        if self.stop_source_on_exit:
            self.source.stop()

    def on_resize(self) -> None:
        self._size_side()
        self._size_nccl_pane()
        self.grid.schedule_relayout()

    # ---- batches in ----------------------------------------------------------------------

    @work(thread=True, exclusive=True, exit_on_error=False, group="monitor-reader")
    def _read_events(self) -> None:
        self.reader.run()

    def _deliver(self, batch: Batch) -> None:
        """Reader thread: hand a batch to the UI (``post_message`` is thread-safe)."""
        msg = RankLinesReceived(batch.lines, batch.nodes, batch.nccl, batch.snapshot, batch.count)
        self.post_message(msg)

    def _finish(self, state: str, message: str) -> None:
        """Reader thread: the source is done (or could not start)."""
        self.post_message(RunFinished(state, message))

    async def on_rank_lines_received(self, msg: RankLinesReceived) -> None:
        if not self._composed():
            self.reader.taken()  # torn down (or not built yet): nothing to draw the lines on
            return
        t0 = time.perf_counter()
        try:
            root = self.reader.state.root_cause
            newly_failed = root is not None and self.grid.root_cause is None
            self.grid.root_cause = root
            snap = msg.snapshot
            state = self.finished or snap.run_state
            if state == RunState.STOPPED and any(stop_echo(e, state) for e in snap.errors):
                snap = replace(
                    snap, errors=tuple(e for e in snap.errors if not stop_echo(e, state))
                )
            new_panes = self.grid.take(msg.lines, msg.node_chunks, snap)
            was_empty = self.nccl.has_class("-empty")
            self.nccl.buffer.extend_chunks(msg.nccl)
            if was_empty and self.nccl.buffer.total:
                self._size_nccl_pane()
            self.delivered += msg.count
            self.batches += 1
            if new_panes:
                await self.grid.relayout()
            if newly_failed:
                self.grid.follow_root_cause()
            if time.monotonic() - self._chrome_at >= CHROME_INTERVAL_S or new_panes:
                self._render_chrome()
            sync_in_frames(self, [*self.grid.panes(), self.nccl], self.reader.taken)
        except BaseException:
            self.reader.taken()
            raise
        finally:
            self.max_batch_ms = max(self.max_batch_ms, 1000 * (time.perf_counter() - t0))

    def action_calibrate(self) -> None:
        """``k``: calibrate the plan's estimates from this run (tui/screens/calibrate_offer.py)."""
        from tui.screens.calibrate_offer import calibrate_from_run

        calibrate_from_run(self, self.run_dir)

    def on_screen_resume(self) -> None:
        from tui.screens.calibrate_offer import withdraw_offer

        withdraw_offer(self)  # another run's "press k to calibrate" is not this run's

    def on_run_finished(self, msg: RunFinished) -> None:
        from tui.screens.calibrate_offer import offer_calibration

        self.finished = msg.state
        self.refresh_bindings()  # ctrl+x Stop run leaves the footer
        if not self._composed():
            return  # the app is closing (or the screen not built yet): nothing to draw on
        offer_calibration(self, msg.state, self.run_dir)
        if msg.message and msg.state != RunState.SUCCEEDED:
            failed = msg.state == RunState.FAILED
            self.notify(msg.message, severity="error" if failed else "warning")
        self._render_chrome()

    # ---- chrome ----------------------------------------------------------------------------

    def _composed(self) -> bool:
        """Whether the screen's widgets exist: a run can end while the app tears the screen
        down (or before it is composed), and a message handled then has nothing to draw on.
        A header still there is no proof that the side panel's chart is
        (:func:`tui.lifecycle.torn_down`)."""
        if torn_down(self):
            return False
        return bool(self.query(MonitorHeader))

    def _render_chrome(self) -> None:
        if not self._composed():
            return
        self._chrome_at = time.monotonic()
        snap, grid = self.snapshot, self.grid
        run_state = self.finished or snap.run_state
        if run_state == RunState.STOPPED and any(stop_echo(e, run_state) for e in snap.errors):
            # The run ended stopped after the last batch: its stop's echo is no error.
            snap = replace(
                snap, errors=tuple(e for e in snap.errors if not stop_echo(e, run_state))
            )
            grid.snapshot = snap
        root = grid.root_cause
        header, nodes = self.query_one(MonitorHeader), self.launch_nodes
        header.show(self.run_title, run_state, snap, self.delivered, grid, nodes=nodes)
        self.query_one(RankStrip).show(snap, root)
        grid.retitle()
        self.nccl.retitle(self.reader.nccl_summary.headline(), snap.transport)
        if self.nccl.has_class("-empty") == bool(self.nccl.buffer.total or self.nccl.warning):
            self._size_nccl_pane()
        self.query_one(MonitorSide).show(snap, grid.focused_rank(), self.error_cursor, root)
        self._show_machines(snap, grid.focused_rank(), root)
        self._show_fullscreen()

    # ---- stopping, diagnosing ----------------------------------------------------------

    @property
    def run_over(self) -> bool:
        return self.finished is not None or self.snapshot.run_state in FINAL_STATES

    def action_stop_run_over(self) -> None:
        self.action_stop_run()

    def action_stop_run(self) -> None:
        """Stop the run (every rank on every node); asks for a second ``ctrl+x`` first. A run
        directory's run is stopped by its launcher (asked through ``RUN/stop.request``)."""
        snap = self.snapshot
        over = self.finished is not None or snap.run_state in FINAL_STATES
        answer = self._stop_guard.press(run_over=over, run_message=snap.run_message)
        self.notify(answer.message, severity=answer.severity)
        if answer.stop:
            self._stop_source()

    @work(thread=True, exclusive=True, exit_on_error=False, group="monitor-stop")
    def _stop_source(self) -> None:
        # Blocking at worst (commands, files): never on the UI thread. The screen goes on
        # watching and shows the run end.
        try:
            stop_run(self.source)
        except DtrainError as e:
            self.app.call_from_thread(self.notify, e.message, severity="warning")

    def action_diagnose(self) -> None:
        """Name the stuck rank now (the launcher asks every rank for its Flight Recorder dump)."""
        from tui.screens.monitor_diagnose import diagnose_in_worker

        diagnose_in_worker(self)

    # ---- helpers for tests ----------------------------------------------------------------

    def pane_lines(self, key: str) -> list[str]:
        """What a pane holds (all kept lines, filter ignored); ``nccl`` for the NCCL pane."""
        return (self.nccl.buffer if key == "nccl" else self.grid.buffer(key)).labelled()


class MonitorApp(App[int]):
    """A standalone app around :class:`MonitorScreen` (``dtrain-tui monitor RUN_DIR``, tests)."""

    TITLE = "dtrain-tui monitor"
    BINDINGS = [Binding("q", "quit", "Quit"), Binding("ctrl+c", "quit", "Quit", show=False)]

    def __init__(self, source: EventSource, run_dir: Path | None = None, **kwargs: object) -> None:
        super().__init__()
        kwargs.setdefault("stop_source_on_exit", True)
        self._source = source
        self._run_dir = run_dir
        self._kwargs = kwargs
        self.monitor: MonitorScreen | None = None

    def on_mount(self) -> None:
        self.monitor = MonitorScreen(self._source, self._run_dir, **self._kwargs)  # type: ignore[arg-type]
        self.push_screen(self.monitor)

    def action_quit(self) -> None:  # type: ignore[override]
        self.exit(0)


def run_monitor(run_dir: Path, *, hang_after_s: float = 60.0) -> int:
    """Open the monitor on a run directory (live-tailing it while it runs)."""
    from engine.monitor.tail import RunDirSource

    source = RunDirSource(run_dir)
    source.start()
    app = MonitorApp(source, run_dir, world_size=source.world_size, hang_after_s=hang_after_s)
    code = app.run()
    return int(code or 0)


__all__ = ["MonitorApp", "MonitorScreen", "run_monitor"]

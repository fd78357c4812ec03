"""The live monitor: a grid of per-rank (or per-node) panes, the NCCL pane, rank states with a
loss / throughput chart, the error list; filter and search across panes; jump to the next error.

``MonitorScreen(source, run_dir=None)`` watches any :class:`engine.monitor.events.EventSource` (a live
launch, a run directory being tailed, a canned list in tests); the wizard pushes it after a
launch, ``dtrain-tui monitor RUN_DIR`` runs it inside the small :class:`MonitorApp`.

Built for a firehose (64 ranks printing NCCL INFO at once): one reader thread drains the source,
classifies lines and updates the rank states, and posts one :class:`RankLinesReceived` per
50-250 ms, and only once the screen has taken the previous one (so a busy UI makes batches bigger,
never the queue longer). Panes are views onto capped buffers; a batch costs a ``deque.extend``
per rank and drawing only touches visible rows.
"""

from __future__ import annotations

import gc
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Container, Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Input, Label, Static
from textual.worker import get_current_worker

from engine.errors import DtrainError, one_line
from engine.monitor.events import (
    Event,
    EventSource,
    LineBatch,
    LineEvent,
    RankExit,
    RunStateChanged,
)
from engine.monitor.logparse import NcclSummary, scan_batch
from engine.monitor.state import MonitorState, RankState, RankStatus, Snapshot, exit_text
from tui.messages import RankLinesReceived, RunFinished
from tui.widgets.error_list import ErrorList
from tui.widgets.rank_chart import RankChart
from tui.widgets.rank_pane import DEFAULT_MAX_LINES, LinePattern, PaneBuffer, RankPane, tag_text
from tui.widgets.rank_table import RankTable, state_style

PANE_MIN_WIDTH = 36
PANE_MIN_HEIGHT = 6
"""Smallest pane worth showing (border included); more ranks than fit go to further pages."""
GC_GEN0_THRESHOLD = 50_000
"""While the monitor is open: a firehose allocates (a launch backend's per-line events), and
CPython's default (a collection every 700 allocations, walking every widget and buffer) cost
more than half the throughput and stalled key presses for hundreds of ms. The start-up objects
are frozen out of collection and young collections run 70x less often; restored on close."""
SWITCH_INTERVAL_S = 0.001
"""GIL hand-over interval while the monitor is open (CPython's default is 5 ms): the reader
thread is CPU-bound under a firehose, and each of the few event-loop hops a key press takes
waits up to one interval for the GIL."""
SOURCE_PENDING_BYTES = 128 << 10
"""Output a launch backend may queue for the monitor before its readers wait for a poll (at
most one read's worth goes on while the screen paints; its default is megabytes)."""
PANES_PER_FRAME = 6
"""Panes that take in new lines per frame (a batch's panes are spread over several frames)."""
CHROME_INTERVAL_S = 0.25
"""Header, rank strip, table, chart and pane titles redraw at most this often under a firehose
(panes themselves follow every batch); a state change (exit, finish) redraws at once."""
SIDE_MIN_SCREEN_WIDTH = 110
"""Below this width the rank table / chart / error side panel starts hidden (``t`` shows it)."""


def grid_shape(n: int, width: int, height: int) -> tuple[int, int]:
    """Columns and rows for ``n`` panes in ``width`` x ``height`` cells: as many as fit at
    :data:`PANE_MIN_WIDTH` x :data:`PANE_MIN_HEIGHT`, shaped so panes are wide rather than tall
    and few cells are left empty. Pages take the rest when ``n`` exceeds columns x rows."""
    n = max(1, n)
    cols_fit = max(1, width // PANE_MIN_WIDTH)
    rows_fit = max(1, height // PANE_MIN_HEIGHT)
    if n >= cols_fit * rows_fit:
        return cols_fit, rows_fit
    best: tuple[float, int, int] | None = None
    for cols in range(1, min(cols_fit, n) + 1):
        rows = math.ceil(n / cols)
        if rows > rows_fit:
            continue
        aspect = (width / cols) / max(1.0, height / rows)
        score = abs(math.log(max(aspect, 1e-6) / 3.0)) + 0.35 * (cols * rows - n)
        if best is None or score < best[0]:
            best = (score, cols, rows)
    assert best is not None
    return best[1], best[2]


class MonitorScreen(Screen[None]):
    """Watch ``source``. ``clock`` (wall seconds) is injectable so snapshots are repeatable.
    ``stop_source_on_exit``: closing the screen also stops the source (for a live launch: the
    run); off by default, so leaving the monitor never kills a run by surprise."""

    DEFAULT_CSS = """
    MonitorScreen { layout: vertical; }
    MonitorScreen #mon-header { height: 1; background: $panel; padding: 0 1; }
    MonitorScreen #mon-strip { height: auto; max-height: 2; padding: 0 1; }
    MonitorScreen #mon-body { height: 1fr; }
    MonitorScreen #pane-grid { layout: grid; grid-size: 1 1; width: 1fr; height: 1fr; }
    MonitorScreen #mon-side { width: 52; border-left: vkey $panel-lighten-2; }
    MonitorScreen #mon-side.-hidden { display: none; }
    MonitorScreen #rank-table { height: 1fr; }
    MonitorScreen #errors-title { color: $error; padding: 0 1; }
    MonitorScreen #error-list { height: auto; max-height: 8; }
    MonitorScreen #nccl-pane { height: 7; }
    MonitorScreen #nccl-pane.-hidden { display: none; }
    MonitorScreen #mon-search { dock: bottom; display: none; }
    MonitorScreen #mon-search.-open { display: block; }
    """

    BINDINGS = [
        Binding("tab", "cycle(1)", "Next pane", show=False, priority=True),
        Binding("shift+tab", "cycle(-1)", "Prev pane", show=False, priority=True),
        Binding("z", "zoom", "Zoom"),
        Binding("v", "toggle_view", "Rank/node"),
        Binding("right_square_bracket", "page(1)", "Page →"),
        Binding("left_square_bracket", "page(-1)", "← Page", show=False),
        Binding("slash", "search", "Filter"),
        Binding("e", "next_error", "Next error"),
        Binding("f", "follow", "Follow", show=False),
        Binding("c", "toggle_nccl", "NCCL pane"),
        Binding("t", "toggle_side", "Table"),
        Binding("escape", "clear", "Clear", show=False),
        Binding("ctrl+x", "stop_run", "Stop run"),
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
    ) -> None:
        super().__init__()
        self.source = source
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.run_title = title or (self.run_dir.name if self.run_dir is not None else "run")
        self.clock = clock
        self.max_lines = max_lines
        self.batch_interval = batch_interval
        self.idle_after_s = idle_after_s
        self.stop_source_on_exit = stop_source_on_exit
        self.state = MonitorState(world_size, hang_after_s=hang_after_s, idle_after_s=idle_after_s)
        """Owned by the reader thread; the screen reads :attr:`snapshot`."""
        self.snapshot: Snapshot = self.state.snapshot(clock())
        self.rank_buffers: dict[int, PaneBuffer] = {}
        self.node_buffers: dict[int, PaneBuffer] = {}
        self.nccl_buffer = PaneBuffer(max_lines, tagged=True)
        self.nccl_summary = NcclSummary()
        self.view = "rank"
        self.page = 0
        self.pages = 1
        self.zoomed: str | None = None
        self.focused_key: str | None = None
        self.pattern: LinePattern | None = None
        self.error_cursor: int | None = None
        self.delivered = 0
        """Lines handed to panes so far (the benchmark's figure)."""
        self.batches = 0
        self.max_batch_ms = 0.0
        """Longest time the UI thread spent taking in one batch (the benchmark reports it)."""
        self.finished: str | None = None
        self._ready = threading.Event()
        self._ready.set()
        self._stop_reader = threading.Event()
        self._shown: list[str] = []
        self._shape = (0, 0)
        self._relayout_pending = False
        self._gc_saved: tuple[int, ...] = gc.get_threshold()
        self._chrome_at = 0.0
        self._strip_len = -1
        self._stop_armed_at = 0.0
        self._switch_saved = sys.getswitchinterval()
        for r in range(world_size):
            self.rank_buffers[r] = PaneBuffer(max_lines)

    # ---- composition -------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static("", id="mon-header")
        yield Static("", id="mon-strip")
        with Horizontal(id="mon-body"):
            yield Container(id="pane-grid")
            with Vertical(id="mon-side"):
                yield RankTable(idle_after_s=self.idle_after_s, id="rank-table")
                yield RankChart(id="rank-chart")
                yield Label("errors", id="errors-title")
                yield ErrorList(id="error-list")
        yield RankPane(self.nccl_buffer, "nccl", "NCCL", id="nccl-pane")
        yield Input(
            placeholder="filter all panes: text, or re:REGEX  (Esc clears)", id="mon-search"
        )
        yield Footer()

    def on_mount(self) -> None:
        self._gc_saved = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(max(GC_GEN0_THRESHOLD, self._gc_saved[0]), *self._gc_saved[1:])
        self._switch_saved = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_saved, SWITCH_INTERVAL_S))
        if self.app.size.width < SIDE_MIN_SCREEN_WIDTH:
            self.query_one("#mon-side").add_class("-hidden")
        self._size_nccl_pane()
        self._render_chrome()
        self.call_after_refresh(self._relayout)
        self._read_events()
        self.set_interval(1.0, self._tick)

    def on_unmount(self) -> None:
        gc.set_threshold(*self._gc_saved)
        gc.unfreeze()
        sys.setswitchinterval(self._switch_saved)
        self._stop_reader.set()
        if self.stop_source_on_exit:
            self.source.stop()

    def on_resize(self) -> None:
        self._size_nccl_pane()
        self._schedule_relayout()

    def _size_nccl_pane(self) -> None:
        self.query_one("#nccl-pane", RankPane).styles.height = max(5, self.app.size.height // 5)

    # ---- the reader thread ---------------------------------------------------------------

    @work(thread=True, exclusive=True, exit_on_error=False, group="monitor-reader")
    def _read_events(self) -> None:
        worker = get_current_worker()
        source, state = self.source, self.state
        try:
            source.start()
        except Exception as e:  # noqa: BLE001 - shown to the user as one line
            self.post_message(RunFinished("failed", f"could not start: {one_line(e)}"))
            return
        if getattr(source, "max_pending_bytes", 0) > SOURCE_PENDING_BYTES:
            # A launch backend's readers pause once this much output waits for our next poll:
            # while the screen paints (and this thread waits for it) they soon stop taking the
            # GIL from the UI thread, instead of reading on for megabytes.
            source.max_pending_bytes = SOURCE_PENDING_BYTES  # type: ignore[attr-defined]
        lines: dict[int, list[str]] = {}
        nodes: dict[int, list[tuple[int | None, Sequence[str]]]] = {}
        nccl: list[tuple[int | None, Sequence[str]]] = []
        count = 0
        cap = self.max_lines * 4
        last_post = time.monotonic()
        last_state_post = last_post
        changed = False
        while not worker.is_cancelled and not self._stop_reader.is_set():
            if changed and not self._ready.is_set():
                # The screen is still taking in the last batch: leave new lines with the source
                # (its own reader keeps them) instead of competing with the UI thread for the
                # GIL; key presses are answered sooner and the next batch is bigger.
                self._ready.wait(0.05)
                continue
            done = source.done
            events = [] if done else source.poll(0.02)
            if events:
                changed = True
                count += self._collect(events, lines, nodes, nccl, cap)
                time.sleep(0)  # let the UI thread take the GIL between reads
            now_m = time.monotonic()
            due = now_m - last_post >= self.batch_interval
            heartbeat = now_m - last_state_post >= 1.0
            if self._ready.is_set() and ((changed and due) or heartbeat or (done and changed)):
                if len(nccl) > cap:
                    del nccl[:-cap]  # chunks: bounded while the screen is busy
                self._ready.clear()
                snap = state.snapshot(self.clock())
                self.post_message(RankLinesReceived(lines, nodes, nccl, snap, count))
                lines, nodes, nccl, count, changed = {}, {}, [], 0, False
                last_post = last_state_post = now_m
            elif done and not changed:
                self.post_message(RunFinished(state.run_state, state.run_message))
                return
            elif not events:
                time.sleep(0.005)

    def _collect(
        self,
        events: list[Event],
        lines: dict[int, list[str]],
        nodes: dict[int, list[tuple[int | None, Sequence[str]]]],
        nccl: list[tuple[int | None, Sequence[str]]],
        cap: int,
    ) -> int:
        """Reader thread: fold ``events`` into the pending batch and the rank states; returns
        the number of lines. Consecutive lines of one rank are scanned together, once."""
        state = self.state
        now = self.clock()
        count = 0
        run: list[str] = []
        key: tuple[int | None, int, str] | None = None

        def flush(rank: int | None, node: int, host: str, batch: Sequence[str]) -> None:
            facts = scan_batch(batch)
            state.ingest_lines(rank, node, batch, now, host, facts)
            if rank is not None:
                lst = lines.get(rank)
                if lst is None:
                    lst = lines[rank] = []
                lst.extend(batch)
                if len(lst) > cap:
                    del lst[:-cap]
            nl = nodes.get(node)
            if nl is None:
                nl = nodes[node] = []
            nl.append((rank, batch))
            if len(nl) > cap:
                del nl[:-cap]  # chunks: bounded while the screen is busy
            if facts.nccl:
                nccl.append((rank, facts.nccl))
                self.nccl_summary.feed_batch(facts.nccl)

        for ev in events:
            if isinstance(ev, LineEvent):
                k = (ev.rank, ev.node, ev.host)
                if k != key:
                    if run and key is not None:
                        flush(key[0], key[1], key[2], run)
                    run, key = [], k
                run.append(ev.line)
                count += 1
                continue
            if run and key is not None:
                flush(key[0], key[1], key[2], run)
                run, key = [], None
            if isinstance(ev, LineBatch):
                flush(ev.rank, ev.node, ev.host, ev.lines)
                count += len(ev.lines)
            else:
                state.apply([ev], now)
        if run and key is not None:
            flush(key[0], key[1], key[2], run)
        return count

    # ---- batches in ------------------------------------------------------------------------

    async def on_rank_lines_received(self, msg: RankLinesReceived) -> None:
        t0 = time.perf_counter()
        try:
            new_panes = False
            for rank, lines in msg.lines.items():
                buf = self.rank_buffers.get(rank)
                if buf is None:
                    buf = self.rank_buffers[rank] = PaneBuffer(self.max_lines)
                    new_panes = True
                buf.extend(lines)
            for node, chunks in msg.node_chunks.items():
                nbuf = self.node_buffers.get(node)
                if nbuf is None:
                    nbuf = self.node_buffers[node] = PaneBuffer(self.max_lines, tagged=True)
                    new_panes = new_panes or self.view == "node"
                nbuf.extend_chunks(chunks)
            self.nccl_buffer.extend_chunks(msg.nccl)
            self.snapshot = msg.snapshot
            for r in msg.snapshot.ranks:
                if r not in self.rank_buffers:
                    self.rank_buffers[r] = PaneBuffer(self.max_lines)
                    new_panes = True
            self.delivered += msg.count
            self.batches += 1
            if new_panes:
                await self._relayout()
            now = time.monotonic()
            if now - self._chrome_at >= CHROME_INTERVAL_S or new_panes:
                self._render_chrome()
            self._sync_panes([*self._grid_panes(), self.query_one("#nccl-pane", RankPane)])
        except BaseException:
            self._ready.set()
            raise
        finally:
            self.max_batch_ms = max(self.max_batch_ms, 1000 * (time.perf_counter() - t0))

    def _sync_panes(self, panes: list[RankPane]) -> None:
        """Show the new lines in ``panes``, :data:`PANES_PER_FRAME` per frame: a frame that
        repaints every pane of a 160x48 grid holds the event loop for tens of ms, several small
        ones let key presses in between. Ready for the next batch once this one is on screen:
        the reader does not take the GIL from the UI thread while it paints."""
        try:
            for pane in panes[:PANES_PER_FRAME]:
                if pane.is_attached:
                    pane.sync()
        except BaseException:
            self._ready.set()
            raise
        rest = panes[PANES_PER_FRAME:]
        if rest:
            if not self.call_after_refresh(self._sync_panes, rest):
                self._sync_panes(rest)
        elif not self.call_after_refresh(self._ready.set):
            self._ready.set()

    def on_run_finished(self, msg: RunFinished) -> None:
        self.finished = msg.state
        if msg.message and msg.state != "succeeded":
            self.notify(msg.message, severity="error" if msg.state == "failed" else "warning")
        self._render_chrome()

    def _tick(self) -> None:
        self._render_chrome()

    # ---- layout ---------------------------------------------------------------------------

    def _keys(self) -> list[str]:
        if self.view == "node":
            nodes = set(self.node_buffers) | {st.node for st in self.snapshot.ranks.values()}
            for n in nodes:
                if n not in self.node_buffers:
                    self.node_buffers[n] = PaneBuffer(self.max_lines, tagged=True)
            return [f"n{n}" for n in sorted(nodes)] or ["n0"]
        return [f"r{r}" for r in sorted(self.rank_buffers)]

    def _buffer(self, key: str) -> PaneBuffer:
        if key.startswith("n"):
            node = int(key[1:])
            if node not in self.node_buffers:
                self.node_buffers[node] = PaneBuffer(self.max_lines, tagged=True)
            return self.node_buffers[node]
        return self.rank_buffers.setdefault(int(key[1:]), PaneBuffer(self.max_lines))

    def _grid_panes(self) -> list[RankPane]:
        return list(self.query_one("#pane-grid").query_children(RankPane))

    def _schedule_relayout(self) -> None:
        if not self._relayout_pending:
            self._relayout_pending = True
            self.call_after_refresh(self._relayout)

    async def _relayout(self) -> None:
        self._relayout_pending = False
        grid = self.query_one("#pane-grid", Container)
        keys = self._keys()
        if self.zoomed is not None and self.zoomed in keys:
            keys = [self.zoomed]
        width = grid.size.width or self.app.size.width
        height = grid.size.height or max(PANE_MIN_HEIGHT, self.app.size.height - 12)
        cols, rows = grid_shape(len(keys), width, height)
        per_page = cols * rows
        self.pages = max(1, math.ceil(len(keys) / per_page))
        if self.focused_key in keys and self.zoomed is None:
            # Keep the focused pane on screen after a resize or a view change.
            self.page = keys.index(self.focused_key) // per_page
        self.page = min(max(0, self.page), self.pages - 1)
        shown = keys[self.page * per_page : (self.page + 1) * per_page]
        if (
            shown == self._shown
            and (cols, rows) == self._shape
            and len(grid.children) == len(shown)
        ):
            return
        self._shown, self._shape = shown, (cols, rows)
        grid.styles.grid_size_columns = cols
        grid.styles.grid_size_rows = rows
        await grid.remove_children()
        panes = [RankPane(self._buffer(k), k, self._pane_title(k)) for k in shown]
        for p in panes:
            p.id = f"pane-{p.key}"
            if self.pattern is not None:
                p.pattern = self.pattern
        await grid.mount_all(panes)
        for p in panes:
            p.sync(force=True)
            if p.key == self.focused_key:
                p.focus()
        self._render_chrome()

    # ---- chrome ----------------------------------------------------------------------------

    def _pane_title(self, key: str) -> str:
        snap = self.snapshot
        if key.startswith("n"):
            node = int(key[1:])
            ranks = sorted(r for r, st in snap.ranks.items() if st.node == node)
            hosts = {snap.ranks[r].host for r in ranks if snap.ranks[r].host}
            span = f" r{ranks[0]}-{ranks[-1]}" if ranks else ""
            return f"node {node}{span}" + (f" · {sorted(hosts)[0]}" if hosts else "")
        rank = int(key[1:])
        st = snap.ranks.get(rank)
        if st is None:
            return f"rank {rank}"
        parts = [f"rank {rank}", st.label(snap.now, self.idle_after_s)]
        if st.step is not None:
            parts.append(f"step {st.step}/{st.total_steps}")
        if st.loss is not None:
            parts.append(f"loss {st.loss:.3f}")
        if st.hung:
            parts.append("HUNG?")
        if st.straggler:
            parts.append("SLOW")
        if st.errors:
            parts.append(f"ERR {st.errors}")
        return " · ".join(parts)

    def _render_chrome(self) -> None:
        self._chrome_at = time.monotonic()
        snap = self.snapshot
        run_state = self.finished or snap.run_state
        header = Text(no_wrap=True, overflow="ellipsis")
        header.append(" monitor ", "bold reverse")
        header.append(f" {self.run_title} ", "bold")
        style = {"failed": "bold red", "succeeded": "green", "stopped": "yellow"}.get(
            run_state, "cyan"
        )
        header.append(f"● {run_state}", style)
        nodes = len({st.node for st in snap.ranks.values()}) or 1
        header.append(f"  {len(snap.ranks)} ranks · {nodes} node{'s' if nodes > 1 else ''}")
        header.append(f"  {self.delivered:,} lines")
        header.append(f"  view {self.view}")
        if self.pages > 1:
            header.append(f"  page {self.page + 1}/{self.pages}", "bold")
        if self.zoomed:
            header.append(f"  zoom {self.zoomed}", "bold")
        if self.pattern is not None:
            header.append(f"  filter {self.pattern.text!r}", "bold yellow")
        if snap.errors:
            header.append(f"  {len(snap.errors)} errors", "bold red")
        self.query_one("#mon-header", Static).update(header, layout=False)  # one row, always

        strip = Text(overflow="fold")
        for r in sorted(snap.ranks):
            st = snap.ranks[r]
            label = st.label(snap.now, self.idle_after_s)
            glyph = {
                RankStatus.STARTING: "○",
                RankStatus.RUNNING: "●",
                RankStatus.EXITED: "✓",
                RankStatus.FAILED: "✗",
                RankStatus.STOPPED: "■",
            }[st.status]
            if st.hung:
                glyph = "?"
            sty = state_style(st, label) or "cyan"
            if st.errors or st.straggler:
                sty += " underline"
            if st.status is RankStatus.FAILED:
                strip.append(f"r{r}{glyph}{exit_text(st.exit_code)} ", sty)
            else:
                strip.append(f"r{r}{glyph} ", sty)
        # The strip wraps to at most two rows: a layout only when its length changed.
        strip_len = len(strip.plain)
        self.query_one("#mon-strip", Static).update(strip, layout=strip_len != self._strip_len)
        self._strip_len = strip_len

        for pane in self._grid_panes():
            pane.border_title = self._pane_title(pane.key)
            pst = snap.ranks.get(int(pane.key[1:])) if pane.key.startswith("r") else None
            pane.set_class(pst is not None and pst.status is RankStatus.FAILED, "-failed")
            pane.set_class(pst is not None and pst.status is RankStatus.EXITED, "-exited")
            pane.set_class(pst is not None and (pst.hung or pst.straggler), "-flagged")
        nccl = self.query_one("#nccl-pane", RankPane)
        headline = self.nccl_summary.headline()
        if self.nccl_buffer.total:
            nccl.border_title = f"NCCL · {self.nccl_buffer.total:,} lines" + (
                f" · {headline}" if headline else ""
            )
        else:
            nccl.border_title = "NCCL · no lines yet (gloo, or launch with NCCL_DEBUG=INFO)"
        selected = self._focused_rank()
        self.query_one(RankTable).show(snap, selected)
        self.query_one(RankChart).show(
            snap.ranks.get(selected) if selected is not None else self._first_rank(snap)
        )
        self.query_one(ErrorList).show(snap.errors, self.error_cursor)

    def _first_rank(self, snap: Snapshot) -> RankState | None:
        return snap.ranks[min(snap.ranks)] if snap.ranks else None

    def _focused_rank(self) -> int | None:
        key = self.focused_key
        if key is not None and key.startswith("r"):
            return int(key[1:])
        return None

    # ---- focus, zoom, pages, views ------------------------------------------------------

    def on_descendant_focus(self, event: object) -> None:
        focused = self.focused
        if isinstance(focused, RankPane) and focused.key != "nccl":
            if self.focused_key != focused.key:
                self.focused_key = focused.key
                self._render_chrome()

    def action_cycle(self, step: int) -> None:
        """Focus the next pane, across pages (and the NCCL pane at the end of the cycle)."""
        keys = self._keys()
        cur = self.focused
        if isinstance(cur, Input):
            self.focus_next() if step > 0 else self.focus_previous()
            return
        order = keys + (["nccl"] if not self.query_one("#nccl-pane").has_class("-hidden") else [])
        here = cur.key if isinstance(cur, RankPane) else None
        idx = order.index(here) if here in order else -1
        target = order[(idx + step) % len(order)] if order else None
        if target is None:
            return
        self._focus_key(target)

    def _focus_key(self, key: str) -> None:
        if key == "nccl":
            self.query_one("#nccl-pane", RankPane).focus()
            return
        self.focused_key = key
        if self.zoomed is not None:
            self.zoomed = key
        for pane in self._grid_panes():
            if pane.key == key:
                pane.focus()
                self._render_chrome()
                return
        self._schedule_relayout()

    def action_zoom(self) -> None:
        cur = self.focused
        if self.zoomed is not None:
            self.zoomed = None
        elif isinstance(cur, RankPane) and cur.key != "nccl":
            self.zoomed = cur.key
            self.focused_key = cur.key
        elif self.focused_key is not None:
            self.zoomed = self.focused_key
        else:
            keys = self._keys()
            self.zoomed = self.focused_key = keys[0] if keys else None
        self._schedule_relayout()

    def action_page(self, step: int) -> None:
        if self.pages <= 1:
            return
        self.page = (self.page + step) % self.pages
        self.focused_key = None
        self._schedule_relayout()

    def action_toggle_view(self) -> None:
        self.view = "node" if self.view == "rank" else "rank"
        self.zoomed = None
        self.focused_key = None
        self.page = 0
        self._schedule_relayout()

    def action_toggle_nccl(self) -> None:
        self.query_one("#nccl-pane").toggle_class("-hidden")
        self._schedule_relayout()

    def action_toggle_side(self) -> None:
        self.query_one("#mon-side").toggle_class("-hidden")
        self._schedule_relayout()

    def action_follow(self) -> None:
        focused = self.focused
        if isinstance(focused, RankPane):
            focused.resume()

    def action_stop_run(self) -> None:
        """Stop the run (every rank on every node); asks for a second ``ctrl+x`` first. A run
        directory's run is stopped by its launcher (asked through ``RUN/stop.request``)."""
        if self.finished is not None or self.snapshot.run_state in (
            "succeeded",
            "failed",
            "stopped",
        ):
            message = self.snapshot.run_message
            if message.startswith("launcher died"):
                self.notify(f"nothing to stop: the {message}", severity="warning")
            else:
                self.notify("the run has already ended")
            return
        now = time.monotonic()
        if now - self._stop_armed_at > 3.0:
            self._stop_armed_at = now
            self.notify("press ctrl+x again to stop the run on every node", severity="warning")
            return
        self._stop_armed_at = 0.0
        self.notify("stopping the run…")
        self._stop_source()

    @work(thread=True, exclusive=True, exit_on_error=False, group="monitor-stop")
    def _stop_source(self) -> None:
        # Stop the run, not the watching: a source that can (a backend, a run directory whose
        # launcher polls for the request) stops it and the screen shows the run end; any other
        # source is stopped outright. Blocking at worst: never on the UI thread.
        request = getattr(self.source, "request_stop", None)
        if request is None:
            self.source.stop()
            return
        try:
            request()
        except DtrainError as e:
            self.app.call_from_thread(self.notify, e.message, severity="warning")

    # ---- filter / search / errors -------------------------------------------------------

    def action_search(self) -> None:
        box = self.query_one("#mon-search", Input)
        box.add_class("-open")
        if self.pattern is not None:
            box.value = self.pattern.text
        box.focus()

    @on(Input.Submitted, "#mon-search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        text = event.value
        box = self.query_one("#mon-search", Input)
        box.remove_class("-open")
        if not text:
            self.set_filter(None)
        else:
            try:
                self.set_filter(LinePattern(text))
            except Exception as e:  # noqa: BLE001 - a bad regex is a message, not a crash
                self.notify(
                    f"filter: {e}; fix the pattern or drop the re: prefix", severity="error"
                )
                return
        self._refocus()

    def set_filter(self, pattern: LinePattern | None) -> None:
        """Show only lines matching ``pattern`` in every pane (None: show everything)."""
        self.pattern = pattern
        for pane in [*self._grid_panes(), self.query_one("#nccl-pane", RankPane)]:
            pane.set_pattern(pattern)
        self._render_chrome()

    def action_clear(self) -> None:
        box = self.query_one("#mon-search", Input)
        if box.has_class("-open"):
            box.remove_class("-open")
            self._refocus()
        elif self.pattern is not None:
            self.set_filter(None)
        elif self.zoomed is not None:
            self.zoomed = None
            self._schedule_relayout()

    def _refocus(self) -> None:
        if self.focused_key is not None:
            self._focus_key(self.focused_key)
        else:
            panes = self._grid_panes()
            if panes:
                panes[0].focus()

    def action_next_error(self) -> None:
        errors = self.snapshot.errors
        if not errors:
            self.notify("no errors so far")
            return
        cur = -1 if self.error_cursor is None else self.error_cursor
        self.error_cursor = (cur + 1) % len(errors)
        rec = errors[self.error_cursor]
        if self.pattern is not None:
            self.set_filter(None)
        if rec.rank is None and self.view == "rank":
            self.view = "node"
        key = f"r{rec.rank}" if self.view == "rank" else f"n{rec.node}"
        self.focused_key = key
        if self.zoomed is not None:
            self.zoomed = key
        self.call_after_refresh(self._show_error, key, rec.rank, rec.text, rec.line_no)
        self._schedule_relayout()
        self._render_chrome()

    def _show_error(self, key: str, rank: int | None, text: str, line_no: int) -> None:
        for pane in self._grid_panes():
            if pane.key != key:
                continue
            pane.focus()
            found = (
                pane.scroll_to_index(line_no)
                if key.startswith("r")
                else pane.scroll_to_text(text, rank)
            )
            if not found:
                where = f"rank{rank}" if rank is not None else "node"
                self.notify(
                    f"that error is older than the pane's last {self.max_lines} lines; "
                    f"see logs/{where}*.log in the run directory"
                )
            return

    # ---- helpers for tests ----------------------------------------------------------------

    def pane(self, key: str) -> RankPane | None:
        for p in self._grid_panes():
            if p.key == key:
                return p
        return None

    def pane_lines(self, key: str) -> list[str]:
        """What a pane holds (all kept lines, filter ignored); ``nccl`` for the NCCL pane."""
        buf = self.nccl_buffer if key == "nccl" else self._buffer(key)
        if buf.tags is None:
            return list(buf.texts)
        return [f"{tag_text(tag)}: {text}" for tag, text in zip(buf.tags, buf.texts, strict=True)]


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


__all__ = [
    "MonitorApp",
    "MonitorScreen",
    "RankExit",
    "RunStateChanged",
    "grid_shape",
    "run_monitor",
]

"""The monitor's grid of panes: one :class:`RankPane` per rank (or per node in the node view), as
many as fit, further ones on pages; zoom shows one pane alone.

Used by the monitor screen (``tui.screens.monitor``), which hands it each batch with the rank
states after it (:meth:`take`) and the user's moves (focus, zoom, page, view, next error). The
grid owns the lines (one :class:`PaneBuffer` per rank and per node, kept for ranks on other pages
too), so panes can be re-created on any layout change without losing anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from textual import events
from textual.containers import Container
from textual.widget import Widget

from engine.monitor.reader import Chunks
from engine.monitor.state import ErrorRecord, RankState, RankStatus, Snapshot
from tui.widgets.rank_pane import LinePattern, PaneBuffer, RankPane, fit_title

PANE_MIN_WIDTH = 36
PANE_MIN_HEIGHT = 6
"""Smallest pane worth showing (border included); more ranks than fit go to further pages."""
CHROME_ROWS = 12
"""Rows the rest of the screen takes, for a layout before the grid has a size of its own."""


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


def page_layout(
    keys: list[str], zoomed: str | None, focused: str | None, page: int, width: int, height: int
) -> tuple[list[str], int, int, int, int]:
    """What a grid of ``width`` x ``height`` cells shows of the panes ``keys``: the keys shown,
    columns, rows, the page (the one holding ``focused``, unless zoomed) and the page count."""
    if zoomed is not None and zoomed in keys:
        keys = [zoomed]
    cols, rows = grid_shape(len(keys), width, height)
    per_page = cols * rows
    pages = max(1, math.ceil(len(keys) / per_page))
    if focused in keys and zoomed is None:
        # Keep the focused pane on screen after a resize or a view change.
        page = keys.index(focused) // per_page
    page = min(max(0, page), pages - 1)
    return keys[page * per_page : (page + 1) * per_page], cols, rows, page, pages


def stopped_by_peer(st: RankState, root_cause: int | None) -> bool:
    """A failed rank the run's failure is not blamed on, ended by a signal or lost: the launcher
    (or the collective) stopped it after the root cause failed."""
    if root_cause is None or st.rank == root_cause or st.status is not RankStatus.FAILED:
        return False
    return st.exit_code is None or st.exit_code < 0 or st.exit_code > 128


def title_parts(
    key: str, snap: Snapshot, idle_after_s: float, root_cause: int | None = None
) -> list[tuple[int, str]]:
    """A pane's border title as ``(priority, field)`` pairs in display order; a narrow pane
    drops the fields of lowest priority first (:func:`fit_title`), never cuts one."""
    if key.startswith("n"):
        node = int(key[1:])
        ranks = sorted(r for r, st in snap.ranks.items() if st.node == node)
        hosts = {snap.ranks[r].host for r in ranks if snap.ranks[r].host}
        out = [(9, f"node {node}")]
        if ranks:
            out.append((5, f"r{ranks[0]}-{ranks[-1]}"))
        if hosts:
            out.append((3, sorted(hosts)[0]))
        return out
    rank = int(key[1:])
    st = snap.ranks.get(rank)
    if st is None:
        return [(9, f"rank {rank}")]
    parts = [(9, f"rank {rank}")]
    if root_cause == rank and st.status is RankStatus.FAILED:
        parts.append((8, "ROOT CAUSE"))
    label = (
        "stopped by peer" if stopped_by_peer(st, root_cause) else st.label(snap.now, idle_after_s)
    )
    parts.append((8, label))
    if st.step is not None:
        parts.append((4, f"step {st.step}/{st.total_steps}"))
    if st.loss is not None:
        parts.append((2, f"loss {st.loss:.3f}"))
    if st.hung:
        parts.append((7, "HUNG?"))
    if st.straggler:
        parts.append((6, "SLOW"))
    if st.errors:
        parts.append((7, f"ERR {st.errors}"))
    return parts


def mark_pane(pane: RankPane, snap: Snapshot, root: int | None) -> None:
    """The state classes of ``pane`` (``-failed``, ``-root-cause``, ``-peer``, ``-exited``,
    ``-flagged``) from its rank's state in ``snap``; none for a node pane."""
    pst = snap.ranks.get(int(pane.key[1:])) if pane.key.startswith("r") else None
    failed = pst is not None and pst.status is RankStatus.FAILED
    is_root = failed and root is not None and pst is not None and pst.rank == root
    peer = pst is not None and stopped_by_peer(pst, root)
    pane.set_class(is_root, "-root-cause")
    pane.set_class(peer, "-peer")
    pane.set_class(failed and not peer, "-failed")
    pane.set_class(pst is not None and pst.status is RankStatus.EXITED, "-exited")
    pane.set_class(pst is not None and (pst.hung or pst.straggler), "-flagged")


def pane_title(
    key: str,
    snap: Snapshot,
    idle_after_s: float,
    root_cause: int | None = None,
    width: int | None = None,
) -> str:
    """A pane's border title: ``rank 3 · ROOT CAUSE · failed 1 · step 6/20 · loss 2.430 · ERR 2``,
    or ``node 1 · r2-r3 · host`` for a node pane; fitted to ``width`` by whole fields."""
    return fit_title(title_parts(key, snap, idle_after_s, root_cause), width)


def first_focus(
    shown: list[str], chosen: str | None, focused: Widget | None, root_cause: int | None
) -> str | None:
    """Where the focus starts among the panes ``shown`` while the user has not ``chosen`` one
    (nor does anything else hold it, ``focused``): the root-cause rank's pane on a failure, else
    the first (rank 0); None: leave it."""
    if chosen is not None or not shown:
        return None
    if focused is not None and not isinstance(focused, RankPane):
        return None  # the filter box, say
    if focused is not None and focused.key != "nccl":
        return None
    root = f"r{root_cause}" if root_cause is not None else None
    return root if root in shown else shown[0]


def scroll_to_record(pane: RankPane, rec: ErrorRecord) -> bool:
    """Show ``rec``'s line in ``pane`` (a rank pane by its index, a node pane by its text and
    rank); False when the pane no longer keeps it."""
    if pane.key.startswith("r"):
        return pane.scroll_to_index(rec.line_no)
    return pane.scroll_to_text(rec.text, rec.rank)


class PaneGrid(Container):
    """The panes of one view (``rank`` or ``node``) and page. ``on_change`` runs when the grid
    re-created its panes or another pane took the focus (the screen redraws its chrome)."""

    DEFAULT_CSS = """
    PaneGrid { layout: grid; grid-size: 1 1; width: 1fr; height: 1fr; }
    """

    def __init__(
        self,
        snapshot: Snapshot,
        *,
        max_lines: int,
        idle_after_s: float,
        on_change: Callable[[], None],
        id: str | None = None,  # noqa: A002
    ) -> None:
        super().__init__(id=id)
        self.snapshot = snapshot
        """The latest rank states (what the keys of the node view and the titles come from)."""
        self.max_lines = max_lines
        self.idle_after_s = idle_after_s
        self.on_change = on_change
        self.rank_buffers = {r: PaneBuffer(max_lines) for r in sorted(snapshot.ranks)}
        self.node_buffers: dict[int, PaneBuffer] = {}
        self.view = "rank"
        self.page = 0
        self.pages = 1
        self.zoomed: str | None = None
        self.focused_key: str | None = None
        self.pattern: LinePattern | None = None
        self.root_cause: int | None = None
        self.auto_key: str | None = None
        """The pane the focus was put on by itself (:meth:`start_key`), until the user moves it."""
        """The rank the run's failure is blamed on (the screen sets it from the rank states)."""
        self.sideways = False
        """Long lines scroll sideways (←/→) instead of being cut at the pane's edge."""
        self._views: dict[str, tuple[int, str | None, str | None]] = {}
        """Page, focused pane and zoom each view was left with (``v`` twice comes back to it)."""
        self._shown: list[str] = []
        self._shape = (0, 0)
        self._relayout_pending = False

    # ---- lines -------------------------------------------------------------------------

    def take(
        self,
        lines: Mapping[int, list[str]],
        node_chunks: Mapping[int, Chunks],
        snapshot: Snapshot,
    ) -> bool:
        """Put a batch's lines in the buffers and keep its ``snapshot``; True when it brought a
        rank or node that needs a pane of its own (the caller lays the grid out again)."""
        new_panes = False
        for rank, rank_lines in lines.items():
            buf = self.rank_buffers.get(rank)
            if buf is None:
                buf = self.rank_buffers[rank] = PaneBuffer(self.max_lines)
                new_panes = True
            buf.extend(rank_lines)
        for node, chunks in node_chunks.items():
            nbuf = self.node_buffers.get(node)
            if nbuf is None:
                nbuf = self.node_buffers[node] = PaneBuffer(self.max_lines, tagged=True)
                new_panes = new_panes or self.view == "node"
            nbuf.extend_chunks(chunks)
        self.snapshot = snapshot
        for r in snapshot.ranks:
            if r not in self.rank_buffers:
                self.rank_buffers[r] = PaneBuffer(self.max_lines)
                new_panes = True
        return new_panes

    def keys(self) -> list[str]:
        """The keys of every pane of the current view, in order (all pages)."""
        if self.view == "node":
            nodes = set(self.node_buffers) | {st.node for st in self.snapshot.ranks.values()}
            for n in nodes:
                if n not in self.node_buffers:
                    self.node_buffers[n] = PaneBuffer(self.max_lines, tagged=True)
            return [f"n{n}" for n in sorted(nodes)] or ["n0"]
        return [f"r{r}" for r in sorted(self.rank_buffers)]

    def buffer(self, key: str) -> PaneBuffer:
        if key.startswith("n"):
            node = int(key[1:])
            if node not in self.node_buffers:
                self.node_buffers[node] = PaneBuffer(self.max_lines, tagged=True)
            return self.node_buffers[node]
        return self.rank_buffers.setdefault(int(key[1:]), PaneBuffer(self.max_lines))

    def panes(self) -> list[RankPane]:
        """The panes on screen now."""
        return list(self.query_children(RankPane))

    def pane(self, key: str) -> RankPane | None:
        for p in self.panes():
            if p.key == key:
                return p
        return None

    def focused_rank(self) -> int | None:
        key = self.focused_key
        if key is not None and key.startswith("r"):
            return int(key[1:])
        return None

    def set_pattern(self, pattern: LinePattern | None) -> None:
        """Show only lines matching ``pattern`` in every pane (None: show everything)."""
        self.pattern = pattern
        for pane in self.panes():
            pane.set_pattern(pattern)

    # ---- layout ------------------------------------------------------------------------

    def schedule_relayout(self) -> None:
        if not self._relayout_pending:
            self._relayout_pending = True
            self.call_after_refresh(self.relayout)

    async def relayout(self) -> None:
        """Re-create the panes if what the grid should show (view, zoom, page, size) changed."""
        self._relayout_pending = False
        width = self.size.width or self.app.size.width
        height = self.size.height or max(PANE_MIN_HEIGHT, self.app.size.height - CHROME_ROWS)
        shown, cols, rows, self.page, self.pages = page_layout(
            self.keys(), self.zoomed, self.focused_key, self.page, width, height
        )
        if (
            shown == self._shown
            and (cols, rows) == self._shape
            and len(self.children) == len(shown)
        ):
            return
        self._shown, self._shape = shown, (cols, rows)
        self.styles.grid_size_columns = cols
        self.styles.grid_size_rows = rows
        await self.remove_children()
        panes = [RankPane(self.buffer(k), k, self._title(k)) for k in shown]
        for p in panes:
            p.id = f"pane-{p.key}"
            p.title_parts = self._parts(p.key)
            p.set_sideways(self.sideways)
            if self.pattern is not None:
                p.pattern = self.pattern
        await self.mount_all(panes)
        start = self.start_key(shown)
        if start is not None:
            self.auto_key = start
        for p in panes:
            p.sync(force=True)
            if p.key == self.focused_key:
                p.focus()
            elif p.key == start:
                # After the first frame: a pane focused as it mounts can paint before its
                # component styles exist.
                self.call_after_refresh(self._focus_start, p)
        self.on_change()

    def start_key(self, shown: list[str]) -> str | None:
        """Where the focus starts (:func:`first_focus`); None: leave it."""
        return first_focus(shown, self.focused_key, self.screen.focused, self.root_cause)

    def _focus_start(self, pane: RankPane) -> None:
        """Focus ``pane``, the start pane, unless another took its place meanwhile."""
        if self.auto_key == pane.key and self.focused_key is None and pane.is_attached:
            pane.focus()

    def follow_root_cause(self) -> None:
        """A root cause became known: the focus goes to its pane, unless the user moved it."""
        if self.root_cause is None or self.focused_key not in (None, self.auto_key):
            return
        key = f"r{self.root_cause}"
        if key != self.focused_key and key in self.keys():
            self.auto_key = key
            self.focus_key(key)

    def _title(self, key: str) -> str:
        # Width 0: the pane is not measured yet, so its first frame shows only the field that
        # always stays; its first resize fits the rest (never a title cut at the border).
        return pane_title(key, self.snapshot, self.idle_after_s, self.root_cause, width=0)

    def _parts(self, key: str) -> list[tuple[int, str]]:
        return title_parts(key, self.snapshot, self.idle_after_s, self.root_cause)

    def set_sideways(self, on: bool) -> None:
        """Long lines: scroll sideways (True) or cut at the pane's edge (False), every pane."""
        self.sideways = on
        for pane in self.panes():
            pane.set_sideways(on)

    def retitle(self) -> None:
        """Titles and state classes of the panes on screen, from the latest rank states."""
        for pane in self.panes():
            pane.set_title_parts(self._parts(pane.key))
            mark_pane(pane, self.snapshot, self.root_cause)

    # ---- moves ---------------------------------------------------------------------------

    def next_key(self, here: str | None, step: int, *, with_nccl: bool) -> str | None:
        """The key ``step`` panes on from ``here`` (across pages; ``nccl`` ends the cycle when
        ``with_nccl``); None when there is no pane at all."""
        order = self.keys() + (["nccl"] if with_nccl else [])
        idx = order.index(here) if here in order else -1
        return order[(idx + step) % len(order)] if order else None

    def focus_key(self, key: str) -> None:
        """Focus pane ``key`` (following it with the zoom); when it is not on screen the grid
        lays itself out to show it."""
        self.focused_key = key
        if self.zoomed is not None:
            self.zoomed = key
        pane = self.pane(key)
        if pane is None:
            self.schedule_relayout()
            return
        pane.focus()
        self.on_change()

    def refocus(self) -> None:
        """Give the focus back to the pane that had it (or the first), after the filter box."""
        if self.focused_key is not None:
            self.focus_key(self.focused_key)
            return
        panes = self.panes()
        if panes:
            panes[0].focus()

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        focused = self.screen.focused
        if isinstance(focused, RankPane) and self.focused_key != focused.key:
            self.focused_key = focused.key
            self.on_change()

    def zoom(self, focused: Widget | None) -> None:
        """Zoom in on the focused pane (or the last one focused, or the first); out if zoomed."""
        if self.zoomed is not None:
            self.zoomed = None
        elif isinstance(focused, RankPane) and focused.key != "nccl":
            self.zoomed = focused.key
            self.focused_key = focused.key
        elif self.focused_key is not None:
            self.zoomed = self.focused_key
        else:
            keys = self.keys()
            self.zoomed = self.focused_key = keys[0] if keys else None
        self.schedule_relayout()

    def unzoom(self) -> bool:
        """Leave the zoom; False when there was none."""
        if self.zoomed is None:
            return False
        self.zoomed = None
        self.schedule_relayout()
        return True

    def turn_page(self, step: int) -> None:
        if self.pages <= 1:
            return
        self.page = (self.page + step) % self.pages
        self.focused_key = None
        self.schedule_relayout()

    def toggle_view(self) -> None:
        """Rank panes <-> node panes. Each view comes back as it was left (page, focused pane,
        zoom), so ``v`` twice is the layout it started from; a view seen first starts on its
        first page, nothing zoomed."""
        self._views[self.view] = (self.page, self.focused_key, self.zoomed)
        self.view = "node" if self.view == "rank" else "rank"
        self.page, self.focused_key, self.zoomed = self._views.get(self.view, (0, None, None))
        self.schedule_relayout()

    def show_error(self, rec: ErrorRecord) -> None:
        """Bring the pane holding ``rec`` on screen, focus it and scroll to the error line (the
        node view for an error no rank can be named for)."""
        if rec.rank is None and self.view == "rank":
            self.view = "node"
        key = f"r{rec.rank}" if self.view == "rank" else f"n{rec.node}"
        self.focused_key = key
        if self.zoomed is not None:
            self.zoomed = key
        self.call_after_refresh(self._scroll_to_error, key, rec)
        self.schedule_relayout()

    def _scroll_to_error(self, key: str, rec: ErrorRecord) -> None:
        pane = self.pane(key)
        if pane is None:
            return
        pane.focus()
        if not scroll_to_record(pane, rec):
            where = f"rank{rec.rank}" if rec.rank is not None else "node"
            self.notify(
                f"that error is older than the pane's last {self.max_lines} lines; "
                f"see logs/{where}*.log in the run directory"
            )

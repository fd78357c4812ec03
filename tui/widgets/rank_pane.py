"""One pane of the monitor's grid: the capped tail of one rank's (or one node's) lines.

The lines live in a :class:`PaneBuffer` owned by the monitor screen, not in the widget, so panes
can be re-created on a page change, a zoom or a rank/node view switch without losing anything, and
so lines of ranks on other pages are still kept. A batch costs one ``deque.extend`` (C speed);
drawing uses Textual's Line API: only visible rows are rendered, from plain strings.

Tailing: the pane follows the end until the user scrolls up; then it holds still and its
subtitle says how many new lines wait (``end`` or ``f`` resumes). Lines that report an error are
drawn in the error colour; with a filter set the pane shows only the matching lines, matches
highlighted.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import NamedTuple

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from engine.monitor.logparse import classify_error
from engine.monitor.textsafe import safe_lines
from tui.format import plural

DEFAULT_MAX_LINES = 5000
"""Lines a pane keeps; the run directory keeps everything."""

NO_TAG = -1
"""Tag of a line no rank can be named for (node panes, NCCL pane): drawn as ``node``."""


TITLE_SEP = " · "
TITLE_CHROME = 4
"""Cells of a pane's width its border title cannot use (the corners and a space each side)."""


def fit_title(parts: list[tuple[int, str]], width: int | None) -> str:
    """Join ``parts``, dropping the lowest-priority fields (the latest first among equals) until
    the title fits ``width`` cells (None: no limit); the first field always stays."""
    keep = list(parts)
    while width is not None and len(keep) > 1 and len(TITLE_SEP.join(t for _, t in keep)) > width:
        drop = min(range(1, len(keep)), key=lambda i: (keep[i][0], -i))
        del keep[drop]
    return TITLE_SEP.join(t for _, t in keep)


class PaneBuffer:
    """The capped tail of one pane's lines, plus how many ever arrived. A tagged buffer (node
    and NCCL panes) keeps each line's rank in a parallel deque of ints: no tuple per line, so a
    firehose allocates nothing the garbage collector has to walk."""

    __slots__ = ("texts", "tags", "total")

    def __init__(self, max_lines: int = DEFAULT_MAX_LINES, *, tagged: bool = False) -> None:
        self.texts: deque[str] = deque(maxlen=max_lines)
        self.tags: deque[int] | None = deque(maxlen=max_lines) if tagged else None
        self.total = 0

    def extend(self, lines: Sequence[str], tag: int | None = None) -> None:
        n = len(lines)
        keep = self.texts.maxlen
        if keep is not None and n > keep:
            lines = lines[n - keep :]  # the older ones would be pushed out at once
        # Escape sequences and control characters in rank output never reach the terminal
        # (one search per batch when there are none).
        self.texts.extend(safe_lines(lines))
        if self.tags is not None:
            self.tags.extend(repeat(NO_TAG if tag is None else tag, len(lines)))
        self.total += n

    def extend_chunks(self, chunks: Sequence[tuple[int | None, Sequence[str]]]) -> None:
        """``extend`` with each (tag, lines) chunk in order; chunks that the newer ones would
        push out are only counted, so a batch costs at most the lines the pane keeps."""
        need = self.texts.maxlen
        start = len(chunks)
        if need is None:
            start = 0
        else:
            while start > 0 and need > 0:
                start -= 1
                need -= len(chunks[start][1])
        for i in range(start):
            self.total += len(chunks[i][1])
        for tag, lines in chunks[start:]:
            self.extend(lines, tag)

    def labelled(self) -> list[str]:
        """The kept lines, each after its rank (``r3: ...``, ``node: ...``) in a tagged buffer:
        what a pane holds, filter ignored (tests, benchmarks)."""
        if self.tags is None:
            return list(self.texts)
        return [f"{tag_text(tag)}: {text}" for tag, text in zip(self.tags, self.texts, strict=True)]

    @property
    def first_index(self) -> int:
        """Absolute index (0 = first line ever) of the oldest line still kept."""
        return self.total - len(self.texts)


def tag_text(tag: int) -> str:
    return "node" if tag == NO_TAG else f"r{tag}"


class LinePattern:
    """A filter: substring (case-insensitive) or, with a ``re:`` prefix, a regular expression."""

    def __init__(self, text: str) -> None:
        self.text = text
        if text.startswith("re:"):
            self.regex = re.compile(text[3:])
        else:
            self.regex = re.compile(re.escape(text), re.IGNORECASE)

    def search(self, line: str) -> bool:
        return self.regex.search(line) is not None

    def spans(self, line: str) -> list[tuple[int, int]]:
        return [m.span() for m in self.regex.finditer(line) if m.end() > m.start()]


class FilteredLines:
    """The lines of a :class:`PaneBuffer` that match a :class:`LinePattern` (with their tags
    for a tagged buffer), taken in a batch at a time: only lines that arrived since the last
    :meth:`take` are searched."""

    __slots__ = ("pattern", "texts", "tags", "upto")

    def __init__(self, pattern: LinePattern, buf: PaneBuffer) -> None:
        self.pattern = pattern
        self.texts: deque[str] = deque(maxlen=buf.texts.maxlen)
        self.tags: deque[int] | None = (
            deque(maxlen=buf.texts.maxlen) if buf.tags is not None else None
        )
        self.upto = buf.first_index
        """Absolute index of the first line of ``buf`` not searched yet."""

    def take(self, buf: PaneBuffer) -> None:
        """Search the lines that arrived in ``buf`` since the last call."""
        new = min(buf.total - max(self.upto, buf.first_index), len(buf.texts))
        if new > 0:
            search = self.pattern.regex.search
            start = len(buf.texts) - new
            for row in range(start, len(buf.texts)):
                text = buf.texts[row]
                if search(text):
                    self.texts.append(text)
                    if self.tags is not None and buf.tags is not None:
                        self.tags.append(buf.tags[row])
        self.upto = buf.total


_NO_STYLES = Style()
"""What :func:`component_style` returns for a component class a pane has no styles for (yet,
or any more): plain, and never cached."""


def component_style(pane: ScrollView, name: str, *, partial: bool = False) -> Style:
    """The Rich style of ``pane``'s component class ``name``, or :data:`_NO_STYLES` while it has
    none: Textual clears a removed widget's component styles, and the compositor may still paint
    it once from a map made before the removal (the monitor's relayout removes and re-creates
    panes under a firehose); that frame is drawn plain, never a ``KeyError``."""
    return pane.get_component_rich_style(name, partial=partial, default=_NO_STYLES)


class _RowStyles(NamedTuple):
    base: Style
    tag: Style
    """The rank tag in front of each line of a node or NCCL pane."""
    error: Style
    highlight: Style
    """Added to the line ``e`` (next error) jumped to."""


class RankPane(ScrollView, can_focus=True):
    """A view onto a :class:`PaneBuffer`. ``key`` names what it shows (``r3``, ``n1``, ``nccl``)."""

    DEFAULT_CSS = """
    RankPane {
        border: round $panel-lighten-2;
        border-title-color: $text-muted;
        border-subtitle-color: $warning;
        background: $surface;
        overflow-x: hidden;
        overflow-y: auto;
        scrollbar-size-vertical: 1;
        height: 1fr;
        width: 1fr;
        min-height: 3;
    }
    RankPane:focus { border: round $accent; border-title-color: $text; }
    RankPane.-failed { border: round $error; border-title-color: $error; }
    RankPane.-exited { border-title-color: $success; }
    RankPane.-flagged { border: round $warning; }
    RankPane.-failed:focus { border: double $error; }
    RankPane.-root-cause { border: heavy $error; border-title-color: $error; border-title-style: bold; }
    RankPane.-root-cause:focus { border: double $error; }
    RankPane.-peer { border-title-color: $text-disabled; color: $text-muted; }
    RankPane.-sideways { overflow-x: auto; scrollbar-size-horizontal: 1; }
    """

    COMPONENT_CLASSES = {
        "rank-pane--error",
        "rank-pane--match",
        "rank-pane--tag",
        "rank-pane--highlight",
    }
    DEFAULT_CSS += """
    RankPane > .rank-pane--error { color: $error; text-style: bold; }
    RankPane > .rank-pane--match { background: $accent 40%; }
    RankPane > .rank-pane--tag { color: $text-muted; }
    RankPane > .rank-pane--highlight { text-style: reverse; }
    """

    def __init__(self, buffer: PaneBuffer, key: str, title: str = "", *, id: str | None = None):  # noqa: A002
        super().__init__(id=id)
        self.buffer = buffer
        self.key = key
        self.border_title = title or key
        self.title_parts: list[tuple[int, str]] = []
        """The title's fields by priority (:func:`tui.widgets.pane_grid.fit_title`): refitted
        to the pane's width on every resize."""
        self.sideways = False
        self.follow = True
        self.pattern: LinePattern | None = None
        self._filtered: FilteredLines | None = None
        """Matching lines when a filter is set (None: the buffer itself)."""
        self._seen_total = buffer.total
        self._paused_at_total = 0
        self._evicted_seen = buffer.first_index

    # ---- data --------------------------------------------------------------------------

    @property
    def lines(self) -> deque[str]:
        """The texts shown (the filtered ones when a filter is set)."""
        return self._filtered.texts if self._filtered is not None else self.buffer.texts

    @property
    def tags(self) -> deque[int] | None:
        return self._filtered.tags if self._filtered is not None else self.buffer.tags

    def set_title_parts(self, parts: list[tuple[int, str]]) -> None:
        """Set the border title from whole fields, fitted to the pane's width."""
        self.title_parts = parts
        self._fit_title()

    def _fit_title(self) -> None:
        if not self.title_parts:
            return
        # Not measured yet (width 0): the first field only, until the first resize fits the
        # rest; a title cut at the border by Textual would cut inside a field.
        width = max(0, self.size.width - TITLE_CHROME)
        self.border_title = fit_title(self.title_parts, width)

    def set_sideways(self, on: bool) -> None:
        """Long lines scroll sideways (``←``/``→``) when ``on``, else they are cut at the edge."""
        self.sideways = on
        self.set_class(on, "-sideways")
        if not on:
            self.scroll_to(x=0, animate=False, immediate=True)
        self._size_virtual()
        self.refresh()

    def _size_virtual(self) -> None:
        width = self.size.width
        if self.sideways:
            tag_cells = 6 if self.buffer.tags is not None else 0
            # Measured only while scrolling sideways: the firehose path never pays for it.
            widest = max(map(len, self.lines), default=0)
            width = max(width, widest + tag_cells + 1)
        self.virtual_size = Size(width, len(self.lines))

    def write_lines(self, lines: Iterable[str], tag: int | None = None) -> None:
        """Append lines to this pane's buffer and show them (tests and simple callers)."""
        self.buffer.extend(list(lines), tag)
        self.sync()

    def set_pattern(self, pattern: LinePattern | None) -> None:
        self.pattern = pattern
        self._filtered = None
        self.sync(force=True)
        self.follow = True
        self._to_end()

    def _update_view(self) -> None:
        if self.pattern is None:
            self._filtered = None
            return
        if self._filtered is None:
            self._filtered = FilteredLines(self.pattern, self.buffer)
        self._filtered.take(self.buffer)

    def sync(self, *, force: bool = False) -> None:
        """Take in what arrived in the buffer since the last call: resize, follow or count."""
        buf = self.buffer
        if not force and buf.total == self._seen_total:
            return
        at_end = self.follow
        evicted = buf.first_index - self._evicted_seen
        self._evicted_seen = buf.first_index
        self._seen_total = buf.total
        self._update_view()
        self._size_virtual()
        if at_end:
            if self.size.height > 0:
                # Now, so the frame that shows the new lines is the one at the end (a deferred
                # scroll paints the pane twice per batch).
                self.scroll_to(y=self.max_scroll_y, animate=False, immediate=True)
            else:
                self._to_end()
        elif self.pattern is None and evicted > 0:
            # Keep the rows under the reader still while old lines fall off the top.
            self.scroll_to(y=max(0, self.scroll_y - evicted), animate=False, immediate=True)
        self._update_subtitle()
        self.refresh()

    @property
    def waiting(self) -> int:
        """Lines that arrived since the user scrolled away from the end."""
        return 0 if self.follow else max(0, self.buffer.total - self._paused_at_total)

    def _update_subtitle(self) -> None:
        if not self.follow and self.waiting:
            self.border_subtitle = f"⏸ {plural(self.waiting, 'new line')} · end to follow"
        elif not self.follow:
            self.border_subtitle = "⏸ paused"
        elif self.pattern is not None:
            self.border_subtitle = plural(len(self.lines), "match")
        else:
            self.border_subtitle = ""

    def _to_end(self) -> None:
        # After the layout has caught up with a new virtual size (as Textual's Log does).
        # The check runs then, so a scroll-up in between wins.
        def end() -> None:
            if self.follow:
                self.scroll_end(animate=False, immediate=True, x_axis=False)

        self.call_after_refresh(end)

    def resume(self) -> None:
        self.follow = True
        self._to_end()
        self._update_subtitle()

    def pause(self) -> None:
        if self.follow:
            self.follow = False
            self._paused_at_total = self.buffer.total
            self._update_subtitle()

    def scroll_to_index(self, absolute: int) -> bool:
        """Show the line with absolute index ``absolute`` (pausing the tail); False if it is
        no longer kept."""
        row = absolute - self.buffer.first_index
        if self.pattern is not None or row < 0 or row >= len(self.buffer.texts):
            return False
        self._show_row(row)
        return True

    def scroll_to_text(self, text: str, tag: int | None = None) -> bool:
        """Show the most recent line equal to ``text`` (and tagged ``tag``); False if none."""
        texts, tags = self.lines, self.tags
        want = NO_TAG if tag is None else tag
        for row in range(len(texts) - 1, -1, -1):
            if texts[row] == text and (tags is None or tags[row] == want):
                self._show_row(row)
                return True
        return False

    def _show_row(self, row: int) -> None:
        self.pause()
        height = max(1, self.scrollable_content_region.height)
        self.scroll_to(y=max(0, row - height // 2), animate=False, immediate=True)
        self._highlight_row = row
        self.refresh()

    _highlight_row: int | None = None

    # ---- scrolling ---------------------------------------------------------------------

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value < old_value and new_value < self.max_scroll_y:
            self.pause()
        elif not self.follow and new_value >= self.max_scroll_y and new_value > old_value:
            self.follow = True
            self._highlight_row = None
            self._update_subtitle()

    def action_scroll_end(self) -> None:
        self.resume()

    def on_resize(self) -> None:
        self._size_virtual()
        self._fit_title()
        if self.follow:
            self._to_end()

    # ---- drawing -----------------------------------------------------------------------

    def notify_style_update(self) -> None:
        self._styles = None
        super().notify_style_update()

    def _row_styles(self) -> _RowStyles:
        """The styles rows are drawn in: looked up once per style change, not once per row (each
        lookup walks the DOM, and under a firehose every visible row of every pane is redrawn
        several times a second: those walks were a third of a frame's cost)."""
        key = (self.has_focus, frozenset(self.classes), self.app.current_theme.name)
        cached = self._styles
        if cached is not None and cached[0] == key:
            return cached[1]
        base = self.rich_style
        tag, error = (
            component_style(self, "rank-pane--tag"),
            component_style(self, "rank-pane--error"),
        )
        highlight = component_style(self, "rank-pane--highlight", partial=True)
        styles = _RowStyles(base, base + tag, base + error, highlight)
        if all(s is not _NO_STYLES for s in (tag, error, highlight)):
            self._styles = (key, styles)
        return styles

    _styles: tuple[object, _RowStyles] | None = None

    def render_lines(self, crop: Region) -> list[Strip]:
        self._render_ctx = (
            self.scrollable_content_region.width,
            int(self.scroll_y),
            self._row_styles(),
            int(self.scroll_x) if self.sideways else 0,
        )
        try:
            return super().render_lines(crop)
        finally:
            self._render_ctx = None

    _render_ctx: tuple[int, int, _RowStyles, int] | None = None

    def render_line(self, y: int) -> Strip:
        ctx = self._render_ctx
        if ctx is None:
            x0 = int(self.scroll_x) if self.sideways else 0
            ctx = (self.scrollable_content_region.width, int(self.scroll_y), self._row_styles(), x0)
        width, scroll_y, styles, x0 = ctx
        base = styles.base
        row = scroll_y + y
        lines = self.lines
        if row >= len(lines) or width <= 0:
            return Strip.blank(width, base)
        text = lines[row]
        segments: list[Segment] = []
        tags = self.tags
        if tags is not None:
            tag = tag_text(tags[row])
            segments.append(Segment(f"{tag:>4}│ ", styles.tag))
        text = text.expandtabs(4)
        style = base
        if classify_error(text) is not None:
            style = styles.error
        if row == self._highlight_row:
            style = style + styles.highlight
        if self.pattern is not None:
            match_style = style + component_style(self, "rank-pane--match")
            segments += match_segments(text, self.pattern, style, match_style)
        else:
            segments.append(Segment(text, style))
        return Strip(segments).crop_extend(x0, x0 + width, base)


def match_segments(text: str, pattern: LinePattern, style: Style, match: Style) -> list[Segment]:
    """``text`` in ``style``, with what ``pattern`` matches in ``match``."""
    segments: list[Segment] = []
    pos = 0
    for start, end in pattern.spans(text):
        if start > pos:
            segments.append(Segment(text[pos:start], style))
        segments.append(Segment(text[start:end], match))
        pos = end
    segments.append(Segment(text[pos:], style))
    return segments

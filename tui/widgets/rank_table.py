"""The monitor's rank table: one row per rank with its state (starting, running, idle N s,
exited 0, failed code/signal), last step, loss, tokens/s and flags (ERR, HUNG?, SLOW).

Rendered from a :class:`engine.monitor.state.Snapshot` as one Rich ``Text`` (no widget per row),
so 64 ranks redraw in well under a millisecond at the monitor's 4-10 updates a second.
"""

from __future__ import annotations

from rich.text import Text

from engine.monitor.state import RankState, Snapshot
from tui.widgets.rank_states import RankStateView, state_class


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def rank_flags(st: RankState, root_cause: int | None = None) -> list[str]:
    flags: list[str] = ["ROOT"] if st.rank == root_cause and st.status.value == "failed" else []
    if st.errors:
        flags.append(f"ERR×{st.errors}" if st.errors > 1 else "ERR")
    if st.hung:
        flags.append("HUNG?")
    if st.straggler:
        flags.append("SLOW")
    return flags


class RankTable(RankStateView):
    """Rank, node, state, step, loss, tokens/s, flags. ``selected`` marks the focused rank."""

    COMPONENT_CLASSES = {"rank-table--heading", "rank-table--errors", "rank-table--flags"}
    DEFAULT_CSS = """
    RankTable {
        height: auto; max-height: 100%; overflow-y: auto; padding: 0 1;
        text-wrap: nowrap; text-overflow: ellipsis;
    }
    RankTable > .rank-table--heading { text-style: bold; }
    RankTable > .rank-table--errors { color: ansi_red; text-style: bold; }
    RankTable > .rank-table--flags { color: ansi_yellow; }
    """

    def __init__(self, *, idle_after_s: float = 10.0, id: str | None = None) -> None:  # noqa: A002
        super().__init__("", id=id)
        self.idle_after_s = idle_after_s
        self.selected: int | None = None
        self._shown: Text | None = None
        self._rows = -1

    def show(
        self, snap: Snapshot, selected: int | None = None, root_cause: int | None = None
    ) -> None:
        self.selected = selected
        table = self.render_table(snap, root_cause)
        if table == self._shown:  # same text and styles
            return
        # Lay the screen out again only when the table's height may change (rows added).
        rows = table.plain.count("\n")
        self.update(table, layout=rows != self._rows)
        self._shown, self._rows = table, rows

    def render_table(self, snap: Snapshot, root_cause: int | None = None) -> Text:
        out = Text(no_wrap=True, overflow="ellipsis")
        out.append(
            f"{'rank':>4} {'state':<14} {'step':>7} {'loss':>6} {'tok/s':>7} flags\n",
            self.style_of("rank-table--heading"),
        )
        errors, flagged = self.style_of("rank-table--errors"), self.style_of("rank-table--flags")
        for r in sorted(snap.ranks):
            st = snap.ranks[r]
            label = st.label(snap.now, self.idle_after_s)
            name = state_class(st, label, root_cause)
            if name == "peer":
                label = "stopped (peer)"
            step = "-" if st.step is None else f"{st.step}/{st.total_steps}"
            mark = "▸" if r == self.selected else " "
            out.append(f"{mark}{r:>3} ")
            out.append(f"{label:<14.14}", self.state_style(st, label, root_cause))
            loss, tps = _num(st.loss, "6.3f"), _num(st.tokens_per_s, "7.0f")
            out.append(f" {step:>7} {loss:>6} {tps:>7} ")
            flag_style = errors if st.errors or name == "root" else flagged
            out.append(" ".join(rank_flags(st, root_cause)), flag_style)
            out.append("\n")
        out.rstrip()
        return out

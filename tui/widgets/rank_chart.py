"""A small chart of one rank's loss and throughput (tokens/s, or samples/s or it/s where its
lines give only those) over its recent steps (two sparklines)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Sparkline

from engine.monitor.state import RankState


class RankChart(Vertical):
    DEFAULT_CSS = """
    RankChart { height: auto; padding: 0 1; }
    RankChart Label { width: 1fr; color: $text-muted; }
    RankChart Sparkline { height: 2; margin-bottom: 0; }
    """

    def compose(self) -> ComposeResult:
        yield Label("loss", id="chart-loss-label")
        yield Sparkline([], id="chart-loss")
        yield Label("tokens/s", id="chart-tps-label")
        yield Sparkline([], id="chart-tps")

    def show(self, st: RankState | None) -> None:
        loss = list(st.loss_history) if st is not None else []
        tps = list(st.tps_history) if st is not None else []
        who = f"r{st.rank} " if st is not None else ""
        last_loss = f" {loss[-1]:.4f}" if loss else " -"
        unit = st.throughput_unit if st is not None else "tokens/s"  # what the rank's lines give
        places = 0 if unit == "tokens/s" or (tps and tps[-1] >= 100) else 2
        last_tps = f" {tps[-1]:,.{places}f}" if tps else " -"
        # One-line labels of fixed width: a new text needs a repaint, not a layout of the
        # screen (which costs a firehose frame tens of milliseconds); unchanged, nothing.
        for sel, text in (
            ("#chart-loss-label", f"{who}loss{last_loss}"),
            ("#chart-tps-label", f"{who}{unit}{last_tps}"),
        ):
            label = self.query_one(sel, Label)
            if str(label.content) != text:
                label.update(text, layout=False)
        for sel, data in (("#chart-loss", loss), ("#chart-tps", tps)):
            spark = self.query_one(sel, Sparkline)
            if spark.data != data:
                spark.data = data

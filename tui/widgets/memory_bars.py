"""Per-GPU memory of one candidate layout as bars against the GPU's memory: params, grads,
optimizer, activations and buffers, then the total with the GPU limit marked."""

from __future__ import annotations

from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from engine.plan.result import Layout
from tui.format import gb

_PARTS = ("params", "grads", "optimizer", "activations", "buffers")
_LABEL_W = 12
_VALUE_W = 9


def describe(lay: Layout) -> str:
    """``zero2 · deepspeed · tp1 pp1 dp8`` plus micro-batch × accumulation."""
    deg = f"tp{lay.tp} pp{lay.pp} dp{lay.dp}"
    if lay.cp > 1:
        deg += f" cp{lay.cp}"
    if lay.ep > 1:
        deg += f" ep{lay.ep}"
    off = f" · offload {lay.offload.value}" if lay.offload.value != "none" else ""
    return f"{deg} · mb {lay.micro_batch}×{lay.grad_accum}{off}"


class MemoryBars(Widget):
    """One card: title, five bars and a total bar, scaled to max(GPU memory, total)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        *(f"memory-bars--{part}" for part in _PARTS),
        "memory-bars--fits",
        "memory-bars--nofit",
    }
    DEFAULT_CSS = """
    MemoryBars { height: auto; min-width: 34; border: round $panel-lighten-2; padding: 0 1; }
    MemoryBars.-recommended { border: round $accent; }
    MemoryBars.-nofit { border: round $error; }
    MemoryBars > .memory-bars--params { color: $primary; }
    MemoryBars > .memory-bars--grads { color: $secondary; }
    MemoryBars > .memory-bars--optimizer { color: $accent; }
    MemoryBars > .memory-bars--activations { color: $warning; }
    MemoryBars > .memory-bars--buffers { color: $foreground; }
    MemoryBars > .memory-bars--fits { color: $success; }
    MemoryBars > .memory-bars--nofit { color: $error; }
    """

    def __init__(self, layout: Layout, gpu_memory: int, *, recommended: bool) -> None:
        super().__init__()
        self.layout_ = layout
        self.gpu_memory = gpu_memory
        self.recommended = recommended
        self.set_class(recommended, "-recommended")
        self.set_class(not layout.fits, "-nofit")
        title = f"★ {layout.strategy.value}" if recommended else layout.strategy.value
        self.border_title = f"{title} · {layout.framework.value}"

    def render(self) -> Text:
        style = self.get_component_rich_style
        lay = self.layout_
        mem = lay.memory_per_gpu
        width = max(self.size.width, _LABEL_W + _VALUE_W + 6)
        bar_w = max(width - _LABEL_W - _VALUE_W - 1, 4)
        scale = max(self.gpu_memory, mem.total, 1)
        out = Text(no_wrap=True, overflow="ellipsis")
        out.append(describe(lay) + "\n", style="dim")
        for part in _PARTS:
            value = int(getattr(mem, part))
            out.append(f"{part:<{_LABEL_W}}")
            out.append_text(_bar(value / scale, bar_w, style(f"memory-bars--{part}", partial=True)))
            out.append(f"{gb(value):>{_VALUE_W}}\n")
        fits_style = style(f"memory-bars--{'fits' if lay.fits else 'nofit'}", partial=True)
        out.append(f"{'total':<{_LABEL_W}}", style="bold")
        out.append_text(_bar(mem.total / scale, bar_w, fits_style, limit=self.gpu_memory / scale))
        out.append(f"{gb(mem.total):>{_VALUE_W}}\n", style="bold")
        pct = 100 * mem.total / self.gpu_memory if self.gpu_memory else 0
        verdict = "fits" if lay.fits else "does NOT fit"
        out.append(f"{pct:.0f}% of {gb(self.gpu_memory)} · {verdict}", style=fits_style)
        if mem.cpu_bytes:
            out.append(f" · {gb(mem.cpu_bytes)} on CPU", style="dim")
        if lay.rejected_because:
            out.append("\n")
            out.append(f"✗ {lay.rejected_because}", style="italic")
        return out


def _bar(frac: float, width: int, colour: str | Style, *, limit: float | None = None) -> Text:
    """``████▌░░░`` with eighth-block precision; ``limit`` marks the GPU memory with ``│``."""
    frac = min(max(frac, 0.0), 1.0)
    eighths = round(frac * width * 8)
    full, rem = divmod(eighths, 8)
    cells = ["█"] * full
    if rem and full < width:
        cells.append(" ▏▎▍▌▋▊▉"[rem])
    cells += ["░"] * (width - len(cells))
    t = Text()
    mark = min(round(limit * width), width - 1) if limit is not None and limit < 1 else None
    for i, c in enumerate(cells):
        if i == mark:
            t.append("│", style="bold")
        elif c == "░":
            t.append(c, style="dim")
        else:
            t.append(c, style=colour)
    return t

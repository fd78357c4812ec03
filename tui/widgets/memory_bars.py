"""Per-GPU memory of one candidate layout as bars against the GPU's memory: params, grads,
optimizer, activations, buffers and NCCL's buffers, then the total with the usable limit marked
(``│``: the plan's ``usable_bytes``, what the planner judged every layout by: the GPU's memory
less the CUDA context, fragmentation and a calibration's measured overhead) and the margin left
under it. Sizes are GiB (2^30 bytes), as nvidia-smi and torch count them, MiB below 1 GiB."""

from __future__ import annotations

from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from engine.plan.annotate import NameForm, describe
from engine.plan.result import Layout
from tui.format import size

_PARTS = ("params", "grads", "optimizer", "activations", "buffers", "nccl")
_LABEL_W = 12
_VALUE_W = 9


def gib(n_bytes: float) -> str:
    """Bytes as GiB with one decimal, MiB below 1 GiB (``tui.format.size``)."""
    return size(n_bytes)


class MemoryBars(Widget):
    """One card: title, six bars and a total bar, scaled to max(GPU memory, total); ``usable``
    (bytes) is marked on the total bar and the margin is measured against it; ``mark`` is added
    to the title (``flowchart's pick``); ``reason`` (default: the layout's ``rejected_because``)
    says why an alternative is not the plan, marked ✗ only when it does not fit."""

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
    MemoryBars > .memory-bars--nccl { color: $secondary-lighten-2; }
    MemoryBars > .memory-bars--fits { color: $success; }
    MemoryBars > .memory-bars--nofit { color: $error; }
    """

    def __init__(
        self,
        layout: Layout,
        gpu_memory: int,
        *,
        recommended: bool,
        usable: int | None = None,
        mark: str = "",
        reason: str = "",
    ) -> None:
        super().__init__()
        self.layout_ = layout
        self.gpu_memory = gpu_memory
        self.usable = usable if usable is not None else gpu_memory
        self.recommended = recommended
        self.reason = reason or (layout.rejected_because or "")
        """Why this layout is not the plan (short), shown under its bars."""
        self.set_class(recommended, "-recommended")
        self.set_class(not layout.fits, "-nofit")
        title = f"★ {layout.strategy.value}" if recommended else layout.strategy.value
        off = f" · offload {layout.offload.value}" if layout.offload.value != "none" else ""
        self.border_title = f"{title} · {layout.framework.value}{off}"
        if mark:
            self.border_subtitle = mark

    def render(self) -> Text:
        style = self.get_component_rich_style
        lay = self.layout_
        mem = lay.memory_per_gpu
        width = max(self.size.width, _LABEL_W + _VALUE_W + 6)
        bar_w = max(width - _LABEL_W - _VALUE_W - 1, 4)
        scale = max(self.gpu_memory, mem.total, 1)
        out = Text(no_wrap=True, overflow="ellipsis")
        out.append(describe(lay, NameForm.CARD) + "\n", style="dim")
        for part in _PARTS:
            value = int(getattr(mem, part))
            out.append(f"{part:<{_LABEL_W}}")
            out.append_text(_bar(value / scale, bar_w, style(f"memory-bars--{part}", partial=True)))
            out.append(f"{gib(value):>{_VALUE_W}}\n")
        fits_style = style(f"memory-bars--{'fits' if lay.fits else 'nofit'}", partial=True)
        out.append(f"{'total':<{_LABEL_W}}", style="bold")
        out.append_text(_bar(mem.total / scale, bar_w, fits_style, limit=self.usable / scale))
        out.append(f"{gib(mem.total):>{_VALUE_W}}\n", style="bold")
        out.append(f"│ usable {gib(self.usable)} of {gib(self.gpu_memory)}\n", style="dim")
        margin = self.usable - mem.total
        verdict = "fits" if lay.fits else "does NOT fit"
        if margin >= 0:
            text = f"margin {gib(margin)} ({100 * margin / max(self.usable, 1):.0f}%) · {verdict}"
        else:
            text = f"over by {gib(-margin)} · {verdict}"
        out.append(text, style=fits_style)
        if mem.cpu_bytes:
            out.append(f" · {gib(mem.cpu_bytes)} on CPU", style="dim")
        if self.reason and not self.recommended:
            out.append("\n")
            if lay.fits:
                out.append(f"not the plan: {self.reason}", style="dim italic")
            else:
                out.append(f"✗ {self.reason}", style=fits_style + Style(italic=True))
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

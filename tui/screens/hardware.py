"""Step 2, the machines: accelerator from the catalog (memory and peak shown), GPUs per node,
nodes, host RAM and the intra-node link."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.widgets import Input, OptionList, Select, Static
from textual.widgets.option_list import Option

from engine.errors import one_line
from engine.plan.names import IntraNodeLink
from engine.plan.specs import HardwareSpec
from tui import services
from tui.screens.step import AUTO, StepPane, set_text
from tui.session import Step, WizardSession
from tui.suggesters import WordSuggester
from tui.widgets.field_row import FieldRow
from tui.widgets.memory_bars import gib as gb

if TYPE_CHECKING:
    from engine.plan.catalog import GpuType


def gpu_line(g: GpuType) -> str:
    """``H100 SXM 80GB · 79.6 GiB · 989 TFLOPS bf16 · nvlink 450 GB/s``."""
    prec = g.default_precision()
    return (
        f"{g.name} · {gb(g.memory_bytes)} · {g.peak_tflops(prec):g} TFLOPS {prec.value}"
        f" · {g.intra_link.value} {g.intra_gbps:g} GB/s · ${g.price_per_hour:g}/h"
    )


class HardwareStep(StepPane):
    STEP = Step.HARDWARE
    BOUND_HINTS: ClassVar[dict[str, str]] = {
        "gpus_per_node": "a node holds 1 to 64 GPUs; more machines go in Nodes",
        "cpu_ram_gb": "host RAM per node in GB, e.g. 512",
    }

    def __init__(self, session: WizardSession) -> None:
        super().__init__(session)
        self.gpus: list[GpuType] = []
        self.catalog_error = ""

    def compose(self) -> ComposeResult:
        yield Static("Hardware", classes="step-title")
        yield Static("", id="hardware-summary", classes="summary", markup=False)
        yield FieldRow(
            "gpu", "GPU type", placeholder="catalog key or alias, e.g. H100 (→ completes)"
        )
        gpu_list = OptionList(id="gpu-list", compact=True)
        # Not a Tab stop of its own (digits typed after Tab went into it and vanished): ↓/↑ in
        # the GPU field move its highlight (→ completes the field), a click picks.
        gpu_list.can_focus = False
        yield gpu_list
        yield FieldRow("gpus_per_node", "GPUs per node")
        yield FieldRow("nodes", "Nodes")
        yield FieldRow(
            "cpu_ram_gb", "Host RAM per node", placeholder="GB; empty: 2 GB per GB of GPU memory"
        )
        yield Static("Intra-node link", classes="select-label")
        yield Select(
            [("auto (the GPU's usual link)", AUTO)] + [(v.value, v.value) for v in IntraNodeLink],
            value=AUTO,
            allow_blank=False,
            compact=True,
            id="f-intra_node_link",
        )

    def load(self) -> None:
        try:
            self.gpus = services.list_gpus()
            self.catalog_error = ""
        except Exception as e:  # noqa: BLE001
            self.gpus = []
            self.catalog_error = one_line(e)
        hw = self.session.spec.hardware
        rows = self.rows()
        rows["gpu"].value = hw.gpu
        rows["gpu"].input.suggester = WordSuggester([g.key for g in self.gpus])
        rows["gpus_per_node"].value = str(hw.gpus_per_node)
        rows["nodes"].value = str(hw.nodes)
        rows["cpu_ram_gb"].value = "" if hw.cpu_ram_gb is None else f"{hw.cpu_ram_gb:g}"
        self.query_one("#f-intra_node_link", Select).value = (
            hw.intra_node_link.value if hw.intra_node_link else AUTO
        )
        ol = self.query_one("#gpu-list", OptionList)
        # load() runs again when a profile is loaded: refill the list, never add to it.
        ol.clear_options()
        if self.catalog_error:
            ol.add_option(Option(Text(self.catalog_error, style="italic"), disabled=True))
        # The widest key sets the column, so a long one (h100-sxm-500w) never runs into the memory.
        key_w = max((len(g.key) for g in self.gpus), default=0) + 1
        for g in self.gpus:
            prec = g.default_precision()
            label = Text(f"{g.key:<{key_w}}", style="bold", no_wrap=True, overflow="ellipsis")
            label.append(f"{gb(g.memory_bytes):>9} {g.peak_tflops(prec):>4g} TF {prec.value}")
            ol.add_option(Option(label, id=g.key))
        self._highlight(hw.gpu)

    def _highlight(self, key: str) -> None:
        keys = [g.key for g in self.gpus]
        if key in keys:
            self.query_one("#gpu-list", OptionList).highlighted = keys.index(key)

    @on(OptionList.OptionSelected, "#gpu-list")
    def _picked(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id:
            self.rows()["gpu"].value = event.option.id

    @on(Input.Submitted, "#f-gpu")
    def _accept(self, event: Input.Submitted) -> None:
        event.stop()

    def on_key(self, event: events.Key) -> None:
        """↓/↑ in the GPU field move the highlight in the list below it."""
        focused = self.app.focused
        if isinstance(focused, Input) and focused.id == "f-gpu" and event.key in ("down", "up"):
            ol = self.query_one("#gpu-list", OptionList)
            if event.key == "down":
                ol.action_cursor_down()
            else:
                ol.action_cursor_up()
            event.stop()
            event.prevent_default()

    def check(self) -> list[str]:
        data, errs = self.read_fields(
            {"gpu": "str", "gpus_per_node": "int", "nodes": "int", "cpu_ram_gb": "float"}
        )
        if "gpu" not in data and "gpu" not in errs:
            errs["gpu"] = "type a GPU from the list below, e.g. h100-sxm, a100-80gb or cpu"
        link = self.select_value("intra_node_link")
        if link:
            data["intra_node_link"] = link
        if "gpu" in data and not errs:
            try:
                data["gpu"] = services.get_gpu(_resolve(data["gpu"])).key
            except Exception as e:  # noqa: BLE001 - unknown GPU names come back as one line
                errs["gpu"] = getattr(e, "message", None) or one_line(e)
        model, problems = self.build(HardwareSpec, data, errs)
        summary = self.query_one("#hardware-summary", Static)
        if model is None:
            set_text(summary, "")
            return problems
        assert isinstance(model, HardwareSpec)
        self._highlight(model.gpu)
        try:
            g = services.get_gpu(model.gpu)
            line = gpu_line(g)
        except Exception as e:  # noqa: BLE001
            line = one_line(e)
        set_text(
            summary,
            f"{line}\nworld size {model.world_size} = {model.nodes} node(s) × {model.gpus_per_node}",
        )
        self.session.set_section("hardware", model)
        return []


def _resolve(text: str) -> str:
    from engine.plan.catalog import resolve_gpu_key

    return resolve_gpu_key(text)

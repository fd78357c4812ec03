"""Step 1, the model: a preset from a searchable list, a local ``config.json`` (path completion),
explicit dimensions, or a bare parameter count. The parameter count (total, and active per token
for MoE) updates as you type, from ``engine.plan.models.resolve_model``.

Switching tabs only shows another source: the model stays the one in use until the user acts in
the new tab (picks a preset, edits a field, presses Enter or "Use this source"). A config.json
whose ``model_type`` the engine cannot read fills the Dimensions tab from the keys it has and says
so, instead of the CLI's flags."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Button, Input, OptionList, Static, TabbedContent, TabPane
from textual.widgets.option_list import Option

from engine.errors import DtrainError, one_line
from engine.fsio import JSON_LIMIT, read_regular_text
from engine.plan.dims import ModelDims
from engine.plan.specs import ModelSpec
from tui import services
from tui.format import count
from tui.screens.step import StepPane, set_text
from tui.session import Step, WizardSession
from tui.suggesters import PathSuggester
from tui.widgets.field_row import FieldRow

_DIMS = {
    "layers": "int",
    "hidden": "int",
    "heads": "int",
    "kv_heads": "int",
    "head_dim": "int",
    "vocab": "int",
    "ffn": "int",
    "num_experts": "int",
    "experts_per_token": "int",
}
_DIM_LABELS = {
    "layers": "Layers",
    "hidden": "Hidden size",
    "heads": "Attention heads",
    "kv_heads": "KV heads (GQA)",
    "head_dim": "Head width",
    "vocab": "Vocabulary",
    "ffn": "MLP size",
    "num_experts": "Experts (MoE)",
    "experts_per_token": "Experts per token",
}
_SOURCE_LABELS = {
    "src-preset": "Preset",
    "src-config": "config.json",
    "src-dims": "Dimensions",
    "src-count": "Param count",
}
_FIELD_LABELS = {
    "config_path": "config.json path",
    "params": "Parameters",
    "mtp_layers": "MTP modules",
    **_DIM_LABELS,
}
"""The label of each field the engine may refuse (the summary points at it)."""
_FIELD_SOURCE = {
    "config_path": "src-config",
    "params": "src-count",
    **dict.fromkeys(_DIMS, "src-dims"),
}
"""The tab whose field this is: editing it makes that tab the model's source."""
_HF_KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "head_dim": ("head_dim", "kv_channels"),
    "vocab": ("vocab_size",),
    "ffn": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "num_experts": ("num_local_experts", "num_experts"),
    "experts_per_token": ("num_experts_per_tok",),
}
"""Hugging Face config keys that name each dimension, for a model_type the engine can't read."""


def summarize(dims: ModelDims) -> str:
    head = f"{dims.name} ({dims.arch}) · {count(dims.params_total)} parameters"
    if dims.is_moe:
        head += (
            f" · {count(dims.params_active)} active per token"
            f" · {dims.num_experts} experts, top-{dims.experts_per_token}"
        )
    shape = (
        f"{dims.layers} layers · hidden {dims.hidden} · {dims.heads} heads"
        f" ({dims.kv_heads} kv) · MLP {dims.ffn}{' gated' if dims.gated_mlp else ''}"
        f" · vocab {dims.vocab}"
    )
    shape += "".join(f" · {n}" for n in services.architecture_notes(dims))
    return f"{head}\n{shape}"


class ModelStep(StepPane):
    STEP = Step.MODEL

    def __init__(self, session: WizardSession) -> None:
        super().__init__(session)
        self.presets: list[tuple[str, str]] = []
        self.preset_error = ""
        self.selected_preset: str | None = None
        self.dims: ModelDims | None = None
        self.applied = "src-preset"
        """The tab the session's model comes from; another tab shown changes nothing until the
        user acts in it."""

    def compose(self) -> ComposeResult:
        yield Static("Model", classes="step-title")
        yield Static("", id="model-summary", classes="summary", markup=False)
        with TabbedContent(id="model-source", initial="src-preset"):
            with TabPane("Preset", id="src-preset"):
                yield FieldRow("preset", "Search presets", placeholder="type to filter, ⏎ picks")
                yield OptionList(id="preset-list", compact=True)
                yield Button("Use this source", id="use-src-preset", compact=True)
            with TabPane("config.json", id="src-config"):
                yield FieldRow(
                    "config_path",
                    "config.json path",
                    placeholder="path/to/config.json (→ completes)",
                    suggester=PathSuggester(),
                )
                yield Button("Use this source", id="use-src-config", compact=True)
            with TabPane("Dimensions", id="src-dims"):
                for name, label in _DIM_LABELS.items():
                    yield FieldRow(
                        name,
                        label,
                        placeholder=""
                        if name in ("layers", "hidden", "heads", "vocab")
                        else "optional",
                    )
                yield Button("Use these dimensions", id="use-src-dims", compact=True)
            with TabPane("Param count", id="src-count"):
                yield FieldRow("params", "Parameters", placeholder="e.g. 7B, 350M or 1.3e9")
                yield Button("Use this source", id="use-src-count", compact=True)
        # Whichever the source: multi-token prediction modules Megatron trains beside it.
        yield FieldRow(
            "mtp_layers",
            "MTP modules",
            placeholder="the model's own (DeepSeek-V3: 1)",
        )

    # --- loading ------------------------------------------------------------------------------
    def load(self) -> None:
        try:
            self.presets = services.presets()
        except Exception as e:  # noqa: BLE001 - presets are optional decoration
            self.presets = []
            self.preset_error = one_line(e)
        m = self.session.spec.model
        rows = self.rows()
        # Every field from this spec, emptied where it has no value: a field left as an earlier
        # spec filled it (a MoE profile's experts, then a dense one loaded) would be read back
        # into the new spec.
        rows["config_path"].set_quietly(str(m.config_path) if m.config_path else "")
        rows["preset"].set_quietly(m.preset or "")
        rows["params"].set_quietly(f"{m.params:g}" if m.params else "")
        for name in _DIMS:
            value = getattr(m, name)
            rows[name].set_quietly("" if value is None else str(value))
        rows["mtp_layers"].set_quietly("" if m.mtp_layers is None else str(m.mtp_layers))
        source = "src-dims"
        if m.config_path:
            source = "src-config"
        elif m.preset:
            self.selected_preset = m.preset
            source = "src-preset"
        elif m.layers and m.hidden:
            source = "src-dims"
        elif m.params:
            source = "src-count"
        self._fill_presets(rows["preset"].value)
        self.applied = source
        self.query_one(TabbedContent).active = source

    def _fill_presets(self, query: str) -> None:
        ol = self.query_one("#preset-list", OptionList)
        q = query.strip().lower()
        ol.clear_options()
        if self.preset_error:
            ol.add_option(Option(Text(self.preset_error, style="italic"), disabled=True))
            return
        matches = [(n, d) for n, d in self.presets if q in n.lower() or q in d.lower()]
        for name, desc in matches:
            label = Text(name, style="bold")
            if desc:
                label.append(f"  {desc}", style="dim")
            ol.add_option(Option(label, id=name))
        if not matches:
            ol.add_option(
                Option(Text(f"no preset matches {query!r}", style="italic"), disabled=True)
            )
            return
        names = [n for n, _ in matches]
        if self.selected_preset in names:
            ol.highlighted = names.index(self.selected_preset)
        else:
            ol.highlighted = 0

    # --- events -------------------------------------------------------------------------------
    def on_input_changed(self, event: Input.Changed) -> None:
        name = (event.input.id or "").removeprefix("f-")
        if event.input.id == "f-preset" and not self._loading:
            text = event.value.strip().lower()
            names = {n.lower(): n for n, _ in self.presets}
            if self.applied == "src-preset":
                self.selected_preset = names.get(text)
            self._fill_presets(event.value)
        elif name in _FIELD_SOURCE and not self._loading:
            self.applied = _FIELD_SOURCE[name]  # editing a source's field chooses that source
        super().on_input_changed(event)

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        name = (event.input.id or "").removeprefix("f-")
        if name in _FIELD_SOURCE:
            event.stop()
            self.use_source(_FIELD_SOURCE[name])

    @on(Button.Pressed)
    def _use_pressed(self, event: Button.Pressed) -> None:
        if (event.button.id or "").startswith("use-"):
            event.stop()
            self.use_source((event.button.id or "").removeprefix("use-"))

    def use_source(self, source: str) -> None:
        """Make ``source`` (a tab id) the model's source, with what its fields hold."""
        if source == "src-preset":
            ol = self.query_one("#preset-list", OptionList)
            if ol.highlighted is not None:
                opt = ol.get_option_at_index(ol.highlighted)
                if opt.id:
                    self._pick(opt.id)
                    return
        self.applied = source
        self.revalidate()

    @on(Input.Submitted, "#f-preset")
    def _pick_highlighted(self, event: Input.Submitted) -> None:
        event.stop()
        ol = self.query_one("#preset-list", OptionList)
        if ol.highlighted is not None:
            opt = ol.get_option_at_index(ol.highlighted)
            if opt.id:
                self._pick(opt.id)

    @on(OptionList.OptionSelected, "#preset-list")
    def _picked(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id:
            self._pick(event.option.id)

    def _pick(self, name: str) -> None:
        self.applied = "src-preset"
        self.selected_preset = name
        row = self.rows()["preset"]
        with row.input.prevent(Input.Changed):
            row.value = name
        row.input.cursor_position = len(name)  # retyping goes on from the end, not mid-name
        self._fill_presets(name)
        self.revalidate()

    @on(TabbedContent.TabActivated)
    def _source_changed(self, event: TabbedContent.TabActivated) -> None:
        """Showing another tab changes nothing but the note saying where the model comes from."""
        event.stop()
        if not self._loading:
            self.revalidate()

    def on_key(self, event: events.Key) -> None:
        """↓/↑ in the preset search move the highlight in the list below it."""
        focused = self.app.focused
        if isinstance(focused, Input) and focused.id == "f-preset" and event.key in ("down", "up"):
            ol = self.query_one("#preset-list", OptionList)
            if event.key == "down":
                ol.action_cursor_down()
            else:
                ol.action_cursor_up()
            event.stop()
            event.prevent_default()

    # --- validation ---------------------------------------------------------------------------
    @property
    def source(self) -> str:
        """The tab the model comes from (not necessarily the one shown)."""
        return self.applied

    @property
    def shown(self) -> str:
        """The tab on screen."""
        return self.query_one(TabbedContent).active or "src-preset"

    def check(self) -> list[str]:
        source = self.source
        data: dict[str, Any]
        errs: dict[str, str] = {}
        if source == "src-preset":
            if not self.selected_preset:
                text = self.rows()["preset"].value.strip()
                errs["preset"] = (
                    f"no preset named {text!r}; pick one from the list (⏎ picks the highlighted)"
                    if text
                    else "pick a preset from the list (type to filter, ⏎ picks)"
                )
            data = {"preset": self.selected_preset}
        elif source == "src-config":
            data, errs = self.read_fields({"config_path": "str"})
            if "config_path" not in data and not errs:
                errs["config_path"] = (
                    "type the path of a Hugging Face config.json (or its directory)"
                )
        elif source == "src-count":
            data, errs = self.read_fields({"params": "count"})
            if "params" not in data and not errs:
                errs["params"] = "type a parameter count such as 7B, 350M or 1.3e9"
        else:
            data, errs = self.read_fields(_DIMS)
        extra, extra_errs = self.read_fields({"mtp_layers": "int"})
        data.update(extra)
        errs.update(extra_errs)
        for row in self.rows().values():
            row.set_error(None)
        model, problems = self.build(ModelSpec, data, errs)
        summary = self.query_one("#model-summary", Static)
        self.dims = None
        note = self._source_note()
        if model is None:
            set_text(summary, note)
            return problems
        assert isinstance(model, ModelSpec)
        try:
            self.dims = services.resolve_model(model)
        except DtrainError as e:
            name = e.field.rsplit(".", 1)[-1] if e.field else ""
            message = e.message
            if name == "config_path" and "--" in message:
                message = unreadable_config(self.rows(), model, message)
            rows = self.rows()
            at_field = name in rows and rows[name].display
            if at_field:
                rows[name].set_error(message)
            text = f"{e.field}: {message}" if e.field else message
            # Said once, where the user acts: under the field when it is there.
            label = _FIELD_LABELS.get(name, name)
            shown = f"{label}: the reason is under the field below" if at_field else text
            set_text(summary, f"✗ {shown}{note}")
            return [text]
        except Exception as e:  # noqa: BLE001 - odd input must not crash the wizard
            msg = one_line(e)
            set_text(summary, f"✗ {msg}{note}")
            return [msg]
        else:
            set_text(summary, summarize(self.dims) + note)
        self.session.set_section("model", model)
        return []

    def _source_note(self) -> str:
        """Where the model comes from, and when another tab is shown, that it changes nothing."""
        used = _SOURCE_LABELS.get(self.source, self.source)
        if self.shown == self.source:
            return ""
        shown = _SOURCE_LABELS.get(self.shown, self.shown)
        # Name the button this tab shows (the Dimensions tab's reads "Use these dimensions").
        button = "Use these dimensions" if self.shown == "src-dims" else "Use this source"
        return (
            f"\nThe model still comes from the {used} tab; edit the {shown} tab or press "
            f"{button} to switch."
        )

    def first_focus(self) -> Widget | None:
        source = self.shown
        if source == "src-preset":
            return self.query_one("#f-preset", Input)
        if source == "src-config":
            return self.query_one("#f-config_path", Input)
        if source == "src-count":
            return self.query_one("#f-params", Input)
        return self.query_one("#f-layers", Input)


def unreadable_config(rows: dict[str, FieldRow], model: ModelSpec, message: str) -> str:
    """The engine's config.json refusal, told for the wizard: what it could not read, and
    the Dimensions tab (``rows``) filled from the config's keys where it names them."""
    head = message.split(";")[0].split(" (supported")[0]
    filled = fill_dims_from(rows, model.config_path)
    if filled:
        return (
            f"{head}; the Dimensions tab is filled in from this config.json "
            f"({', '.join(filled)}): check it and press Use these dimensions"
        )
    return (
        f"{head}; open the Dimensions tab, enter its layers, hidden size, heads and "
        "vocabulary (and MLP size, KV heads), then press Use these dimensions"
    )


def fill_dims_from(rows: dict[str, FieldRow], path: Path | str | None) -> list[str]:
    """Copy the dimensions a Hugging Face config names into the Dimensions tab's ``rows``
    (without making it the source); the names filled."""
    if path is None:
        return []
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(read_regular_text(p, JSON_LIMIT, follow=True))
    except (OSError, ValueError, RecursionError, DtrainError):
        return []
    if not isinstance(data, dict):
        return []
    inner = data.get("text_config")
    if isinstance(inner, dict):
        data = {**data, **inner}
    filled: list[str] = []
    for name, keys in _HF_KEYS.items():
        value = next((data[k] for k in keys if isinstance(data.get(k), int)), None)
        if value is not None and rows[name].value != str(value):
            rows[name].set_quietly(str(value))
        if value is not None:
            filled.append(name)
    return filled

"""The base of every wizard step: a scrolling pane that edits one part of the spec.

A step reads its part of the spec from the :class:`~tui.session.WizardSession`, builds its
sub-spec from its fields with the engine's own validation (pydantic models in
``engine.plan.specs``), shows each message next to its field, hands a valid sub-spec back to the
session and posts :class:`~tui.messages.StepValidated` (the wizard records the errors, the app
re-plans). Parsing here only turns text into numbers; every rule lives in the engine.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ValidationError
from textual.containers import VerticalScroll
from textual.walk import walk_depth_first
from textual.widget import Widget
from textual.widgets import Button, Input, OptionList, Select, Static, Tabs

from engine.errors import DtrainError, one_line
from tui.lifecycle import torn_down
from tui.messages import StepValidated
from tui.widgets.field_row import FieldRow

if TYPE_CHECKING:
    from tui.session import Step, WizardSession

AUTO = "auto"
"""The Select value meaning "let the planner choose" (the spec field stays None)."""

_FIELD_PREFIX = re.compile(r"^(?:[a-z_]+\.)?([a-z_]+): ")

_FOCUS_FIRST = (Input, Select, OptionList, Button, Tabs)
"""What a step's first focus may be: its first focusable field, list, button or tab."""


class StepPane(VerticalScroll):
    """One wizard step, editing ``session`` (the wizard's, handed in by the wizard screen).
    Subclasses set ``STEP`` and implement ``load`` and ``check`` (and ``draw_session`` when
    they show part of the plan)."""

    STEP: ClassVar[Step]
    BOUND_HINTS: ClassVar[dict[str, str]] = {}
    """What to do instead, per field, added to a value out of its bounds."""

    def __init__(self, session: WizardSession) -> None:
        super().__init__(id=f"step-{self.STEP}", classes="step")
        self.session = session
        """The wizard's state: the spec this step edits a part of, the plan it shows."""
        self._loading = False
        self._rows: dict[str, FieldRow] | None = None
        """The step's field rows, found once it is mounted (they are all composed, never added
        later): a query walks every widget of the step, and steps read their rows on each
        refresh."""

    # --- to implement -------------------------------------------------------------------------
    def load(self) -> None:
        """Fill the fields from ``self.session.spec``."""

    def check(self) -> list[str]:
        """Validate the fields, show messages, hand a valid sub-spec to the session; return
        the errors."""
        return []

    def draw_session(self) -> None:
        """A step that shows part of the plan updates it here (from :meth:`session_changed`,
        only while its widgets exist). Called often: compare before touching the DOM."""

    def clear_forced_layout(self) -> None:
        """Drop every forced layout setting (the badge's clear button) and re-plan; the
        decision step's force fields, if built, are emptied too."""
        from engine.plan.specs import LayoutSpec
        from tui.session import Step

        self.session.set_section("layout", LayoutSpec())
        built = self.screen.query(f"#step-{Step.DECISION}").results(StepPane)
        decision = next(built, None)
        if decision is not None and decision is not self:
            decision.reload()
        if decision is not self:
            self.revalidate()

    def allow_focus(self) -> bool:
        """The pane itself is a Tab stop only while it scrolls (the arrows then scroll it): a
        pane that fits on screen would be a stop that shows no focus and takes no key."""
        return self.can_focus and (self.max_scroll_y > 0 or self.max_scroll_x > 0)

    def first_focus(self) -> Widget | None:
        # Walked lazily, in the DOM order a query has, stopping at the first match (a query
        # matched every widget of the step against the selector first).
        for w in walk_depth_first(self, Widget, with_root=False):
            if isinstance(w, _FOCUS_FIRST) and w.focusable:
                return w
        return None

    # --- shared machinery ---------------------------------------------------------------------
    ready = False
    """Composed and loaded: :meth:`session_changed` reaches the widgets (a pane still being
    mounted has none to update yet; it draws the session itself when it is ready)."""

    ahead = False
    """Built ahead of its first visit (the wizard builds the steps in idle time, so a move
    only switches): until :meth:`entered` it fills its fields and draws the session but
    validates nothing, so the steps not visited yet record no verdict, as when a step was
    built on its first visit; entering it then loads and validates the spec as it is then."""

    def draw_ahead(self) -> None:
        """Built ahead and hidden, about to be laid out before its first visit: draw now what
        entering the step would draw (so that the layout done ahead is the one shown)."""

    def entered(self) -> None:
        """The wizard switched to this step: the first time, a step built ahead loads the
        spec as it is now and validates it (what building it on this visit did)."""
        if self.ahead:
            self.ahead = False
            self.reload()

    def on_mount(self) -> None:
        self.reload()
        self.ready = True
        self.session_changed()

    def session_changed(self) -> None:
        """The wizard drew the session again (a plan arrived or was refused, a step was
        validated): :meth:`draw_session`, once the step is mounted and until it is torn down;
        before, nothing (mounting draws it), after, nothing (there is nothing to draw on). Safe
        to call at any moment: callers need no guard."""
        if self.ready and not torn_down(self):
            self.draw_session()

    def reload(self) -> None:
        """Refill the fields from the session's spec and validate them."""
        self._loading = True
        try:
            self.load()
        finally:
            self._loading = False
        self.revalidate()

    def revalidate(self) -> None:
        if self.ahead:
            return  # not entered yet: validated (from the spec as it is then) when entered
        try:
            errors = self.check()
        except Exception as e:  # noqa: BLE001 - odd input must never crash the wizard
            errors = [one_line(e)]
        self.post_message(StepValidated(self.STEP, list(errors)))

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        if not self._loading:
            self.revalidate()

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        if not self._loading:
            self.revalidate()

    def rows(self) -> dict[str, FieldRow]:
        if self._rows is not None:
            return self._rows
        rows = {r.field_name: r for r in self.query(FieldRow)}
        if self.ready:
            self._rows = rows  # mounted and composed: the rows are all there for good
        return rows

    def select_value(self, name: str) -> str | None:
        """A Select's value, None for auto or blank."""
        value = self.query_one(f"#f-{name}", Select).value
        if value is Select.BLANK or value == AUTO:
            return None
        return str(value)

    def read_fields(self, kinds: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
        """Parse each field's text by kind (int, float, count, str); empty means unset."""
        rows = self.rows()
        data: dict[str, Any] = {}
        errs: dict[str, str] = {}
        for name, kind in kinds.items():
            row = rows.get(name)
            if row is None:
                continue
            text = row.value.strip()
            if not text:
                continue
            try:
                data[name] = parse_value(text, kind)
            except ValueError as e:
                errs[name] = str(e)
        return data, errs

    def build(
        self, cls: type[BaseModel], data: dict[str, Any], errs: dict[str, str]
    ) -> tuple[BaseModel | None, list[str]]:
        """Validate ``data`` as ``cls``; show one message per field; return (model, errors)."""
        model: BaseModel | None = None
        general: list[str] = []
        if not errs:
            try:
                model = cls.model_validate(data)
            except ValidationError as e:
                for err in e.errors():
                    loc = [str(p) for p in err.get("loc", ())]
                    msg = human_message(err)
                    name = loc[0] if loc else field_of(msg)
                    msg = _FIELD_PREFIX.sub("", msg)
                    if name:
                        errs.setdefault(name, msg)
                    else:
                        general.append(msg)
            except DtrainError as e:
                name = e.field.rsplit(".", 1)[-1] if e.field else ""
                if name:
                    errs[name] = e.message
                else:
                    general.append(e.message)
        for name, hint in self.BOUND_HINTS.items():
            if errs.get(name, "").startswith("must be"):
                errs[name] += f"; {hint}"
        rows = self.rows()
        for name, row in rows.items():
            row.set_error(errs.get(name))
        for name, msg in errs.items():
            if name not in rows:
                general.append(f"{name}: {msg}")
        problems = [f"{n}: {m}" for n, m in errs.items() if n in rows] + general
        return (model if not problems else None), problems


def set_text(widget: Static, text: str) -> None:
    """Update a Static only when its text changes: an update re-lays out the screen, and
    steps re-validate on every key."""
    if getattr(widget, "_dtrain_text", None) != text:
        widget._dtrain_text = text  # type: ignore[attr-defined]
        widget.update(text)


_BOUNDS = {
    "greater_than_equal": ("ge", "must be at least {}"),
    "less_than_equal": ("le", "must be at most {}"),
    "greater_than": ("gt", "must be more than {}"),
    "less_than": ("lt", "must be less than {}"),
}


def human_message(err: Any) -> str:
    """One line a person reads for one pydantic error: bounds in words with the value typed
    (``must be at least 1, not 0``), never pydantic's own phrasing; model-level messages (the
    engine's) as they are."""
    kind = str(err.get("type", ""))
    if kind in _BOUNDS:
        key, text = _BOUNDS[kind]
        bound = (err.get("ctx") or {}).get(key)
        if bound is not None:
            typed = err.get("input")
            return text.format(_num(bound)) + (f", not {_num(typed)}" if typed is not None else "")
    if kind == "finite_number":
        return "must be a finite number"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return "must be a whole number, e.g. 8"
    if kind in ("float_parsing", "float_type"):
        return "must be a number, e.g. 3.5"
    if kind == "enum":
        expected = (err.get("ctx") or {}).get("expected")
        return f"must be one of {expected}" if expected else "not one of the choices"
    return clean_message(str(err.get("msg", "invalid")))


def _num(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def clean_message(msg: str) -> str:
    return msg.removeprefix("Value error, ")


def field_of(msg: str) -> str:
    """The field a model-level message names (``model.kv_heads: …`` -> ``kv_heads``)."""
    m = _FIELD_PREFIX.match(msg)
    return m.group(1) if m else ""


def parse_value(text: str, kind: str) -> Any:
    """Text to a value of ``kind``; raises ValueError with a message a person can act on."""
    compact = text.replace("_", "").replace(",", "").replace(" ", "")
    if kind == "int":
        try:
            return int(compact)
        except ValueError:
            try:
                f = float(compact)
            except ValueError:
                f = math.nan
            if math.isfinite(f) and f.is_integer():
                return int(f)
            raise ValueError(f"{text[:40]!r} is not a whole number; type digits, e.g. 8") from None
    if kind == "float":
        try:
            f = float(compact)
        except ValueError:
            raise ValueError(f"{text[:40]!r} is not a number; type e.g. 3.5 or 1e-4") from None
        if not math.isfinite(f):
            raise ValueError("must be a finite number")
        return f
    if kind == "count":
        return compact
    return text

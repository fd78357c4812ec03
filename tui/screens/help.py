"""The help screen: every key the wizard answers to, and what each step does."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.session import Step

KEYS: tuple[tuple[str, str], ...] = (
    ("Ctrl+N", "next step (refused while the current step has errors)"),
    ("Ctrl+B", "previous step"),
    ("Tab / Shift+Tab", "next / previous field"),
    ("→ or End", "accept a completion (paths, GPU names)"),
    ("↑ ↓ then ⏎", "pick from a list (presets, GPUs, bundle files)"),
    ("Ctrl+S", "write the bundle (what it would replace or remove is listed first: Ctrl+S again)"),
    ("Ctrl+E", "configs: open the highlighted file (as written) in $VISUAL / $EDITOR"),
    ("Ctrl+Y", "configs: copy the command that starts the highlighted script, or the run"),
    ("Ctrl+L", "write the bundle and start the run, then watch it"),
    ("Ctrl+R", "re-plan now"),
    ("Ctrl+O", "profiles: save or load the whole spec"),
    ("Ctrl+G", "open a past or running run's monitor (b / esc there comes back here)"),
    ("Ctrl+P", "command palette (every action by name)"),
    ("Ctrl+T", "toggle light / dark theme"),
    ("F1", "this help"),
    ("Ctrl+Q", "quit"),
)

STEPS: dict[Step, str] = {
    Step.MODEL: "a preset, a local config.json, dimensions or a bare parameter count",
    Step.HARDWARE: "GPU type, GPUs per node, nodes, host RAM",
    Step.NETWORK: "inter-node tier and interfaces; the bandwidth the plan assumes",
    Step.TRAINING: "sequence, batch, precision (and FP8 scaling), optimizer, token budget and price",
    Step.DECISION: "the flowchart path, memory per GPU, time and cost; force a layout",
    Step.CONFIGS: "preview every bundle file, diff against disk, write, edit, copy the command",
    Step.LAUNCH: "backend, hosts, run directory; start and watch every rank",
}
"""What each step does, in the help's list of steps."""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape", "dismiss", "Close"),
        Binding("f1", "dismiss", "Close"),
        Binding("q", "dismiss", "Close", show=False),
    ]

    def compose(self) -> ComposeResult:
        keys = Table(box=None, show_header=False, padding=(0, 2))
        keys.add_column(style="bold", no_wrap=True)
        keys.add_column()
        for k, what in KEYS:
            keys.add_row(k, what)
        steps = Table(box=None, show_header=False, padding=(0, 2))
        steps.add_column(style="bold", no_wrap=True)
        steps.add_column()
        for step in Step:
            steps.add_row(f"{step.number} {step.label}", STEPS[step])
        with VerticalScroll(id="help-body"):
            yield Static(Text("Keys", style="bold underline"))
            yield Static(keys, id="help-keys")
            yield Static(Text("\nSteps", style="bold underline"))
            yield Static(steps)
            yield Static(Text("\nEsc closes this help.", style="dim"))

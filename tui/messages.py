"""Messages of the wizard and the monitor, each named for a fact. Workers post them from threads
(``post_message`` is thread-safe); the app records what they say in the
:class:`~tui.session.WizardSession` and the screens draw it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:  # annotations only: importing them costs start-up time
    from engine.monitor.state import Snapshot as MonitorSnapshot
    from engine.plan.result import Plan
    from engine.rundir.events import EventSource
    from tui.session import Step


@dataclass
class StepValidated(Message):
    """A step re-checked its fields (and handed a valid sub-spec to the session); ``errors``
    is empty when the step is valid."""

    step: Step
    errors: list[str]


@dataclass
class StepEntered(Message):
    """The wizard now shows ``step``."""

    step: Step


@dataclass
class PlanStarted(Message):
    """The planner started on the current spec (generation ``generation``)."""

    generation: int


@dataclass
class PlanComputed(Message):
    """The planner returned ``plan`` for spec generation ``generation``."""

    plan: Plan
    generation: int
    elapsed_s: float
    forcing: str = ""
    """What forcing the layout costs against the auto plan (``engine.plan.annotate.
    forcing_cost``); "" when nothing is forced."""


@dataclass
class PlanFailed(Message):
    """The planner refused the spec; ``message`` is its one-line reason."""

    message: str
    generation: int


@dataclass
class BundleRendered(Message):
    """The writers rendered the bundle for the current plan."""

    files: dict[str, str]
    generation: int


@dataclass
class BundleRenderFailed(Message):
    """The writers refused the plan of ``generation``; ``message`` is their one-line reason."""

    message: str
    generation: int


@dataclass
class BundleWritten(Message):
    """The bundle was written into ``out_dir``; ``summary`` is the line shown to the user."""

    out_dir: Path
    summary: str


@dataclass
class BundleWriteFailed(Message):
    """Writing the bundle failed (or was refused: files the user edited); one line."""

    message: str


@dataclass
class RunStarted(Message):
    """A launch backend was made for the written bundle (not started: the monitor starts and
    watches it); its run keeps its logs in ``run_dir``."""

    source: EventSource
    run_dir: Path


@dataclass
class LaunchFailed(Message):
    """Writing the bundle or making the backend failed; ``message`` is the one-line reason."""

    message: str


# ---- monitor (owned by the monitor screen; posted from its reader thread) -------------------


@dataclass
class RankLinesReceived(Message):
    """A batch of output arrived: ``lines`` per rank; ``node_chunks`` per node, in arrival
    order, as (rank or None, lines) chunks; ``nccl`` the (rank, lines) chunks for the NCCL pane;
    and the rank states after the batch. One message per 50-250 ms, never one per line."""

    lines: dict[int, list[str]]
    node_chunks: dict[int, list[tuple[int | None, Sequence[str]]]]
    nccl: list[tuple[int | None, Sequence[str]]]
    snapshot: MonitorSnapshot
    count: int


@dataclass
class BundleWriteNeedsConfirm(Message):
    """Writing into ``out`` would replace, back up or delete files already there: ``lines``
    say what (one per kind); ``conflicts`` some are the user's edits; ``token`` is what a
    second write must match to go ahead (the plan generation and the directory)."""

    out: Path
    lines: list[str]
    conflicts: bool
    token: tuple[int, str]


@dataclass
class RunFinished(Message):
    """The watched source will send nothing more (``state``: succeeded, failed, stopped…)."""

    state: str
    message: str


@dataclass
class PreflightRequested(Message):
    """The user pressed the Launch step's Preflight button (the step runs the preflight)."""

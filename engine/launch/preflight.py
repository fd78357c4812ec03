"""Run a bundle's preflight (``preflight.py``) in the run's own torchrun world, on any launch
backend, and turn rank 0's result line into a verdict in ``RUN/preflight.json``.

Called by ``dtrain-tui preflight`` and the wizard's Launch step. The preflight is the bundle
itself, started as ``launch`` starts it (same node scripts, ``nccl.env``, hosts, rendezvous and
:class:`LaunchOptions`) with ``DTRAIN_PREFLIGHT=1`` in every node's environment, which makes the
node scripts run ``preflight.py`` instead of the training script. Rank 0 prints its result as one
line; it reaches ``RUN/logs/rank0.stdout.log`` on every backend, so nothing is fetched from the
nodes. The run directory is a normal one (``run.json``, logs, commands) plus ``preflight.json``.

A preflight ends by itself; one still going at its deadline is stopped (every process of it, as a
stopped launch) and reported as such. SkyPilot's task file (``sky.yaml``) reads
``DTRAIN_PREFLIGHT`` as the node scripts do.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.diagnose.preflight import PREFLIGHT_JSON, PreflightReport, analyze, parse_result_line
from engine.errors import DtrainError
from engine.fsio import JSON_LIMIT, atomic_write_text, open_regular, read_regular_text
from engine.launch import make_backend
from engine.launch.base import LaunchBackend
from engine.launch.options import LaunchOptions
from engine.rundir.events import Event
from engine.rundir.files import rank_log
from engine.rundir.record import RunState, read_record
from engine.write.launch_scripts import PREFLIGHT_SCRIPT, PREFLIGHT_VAR

PASSED_ENV = ("DTRAIN_PREFLIGHT_MAX_MB", "DTRAIN_PREFLIGHT_SLOW", "DTRAIN_PREFLIGHT_SLOW_S")
"""Taken from the launcher's environment into every node's (the size cap, and the test hook
that makes ranks slow: see ``engine/trainer/preflight.py``)."""
DEADLINE_S = 900.0
"""Default limit for a whole preflight (start, measure, end); a 1 GiB sweep on 64 GPUs takes
well under a minute once the world is up."""
BACKENDS = ("local", "ssh", "slurm", "skypilot")


def preflight_options(
    options: LaunchOptions, *, max_mb: int | None = None, environ: Mapping[str, str] | None = None
) -> LaunchOptions:
    """``options`` with the preflight's environment added (a copy)."""
    env = dict(options.env)
    src = os.environ if environ is None else environ
    env.update({k: src[k] for k in PASSED_ENV if k in src})
    if max_mb is not None:
        env["DTRAIN_PREFLIGHT_MAX_MB"] = str(max_mb)
    env[PREFLIGHT_VAR] = "1"
    return replace(options, env=env)


def start_preflight(
    kind: str,
    bundle_dir: Path,
    run_dir: Path | None,
    options: LaunchOptions,
    *,
    sbatch_args: Sequence[str] = (),
    max_mb: int | None = None,
) -> LaunchBackend:
    """The backend that runs the preflight of ``bundle_dir`` (not started yet: call ``start()``)."""
    if kind not in BACKENDS:
        raise DtrainError(
            f"preflight runs on {', '.join(BACKENDS)}, not {kind!r}; pass one of them",
            field="--backend",
        )
    if max_mb is not None and not 1 <= max_mb <= 1 << 16:
        raise DtrainError(f"{max_mb} is outside 1..65536 MiB", field="--max-mb")
    if not (Path(bundle_dir) / PREFLIGHT_SCRIPT).is_file():
        raise DtrainError(
            f"{bundle_dir} has no {PREFLIGHT_SCRIPT}; rewrite the bundle with this dtrain-tui "
            "(dtrain-tui write ... --out DIR)",
            field="BUNDLE_DIR",
        )
    opts = preflight_options(options, max_mb=max_mb)
    return make_backend(kind, Path(bundle_dir), run_dir, opts, sbatch_args=sbatch_args)


def drive(
    backend: LaunchBackend,
    *,
    deadline_s: float = DEADLINE_S,
    on_events: Callable[[list[Event]], None] | None = None,
    stops_asked: Callable[[], int] | None = None,
) -> None:
    """Poll a started preflight until it ends. ``stops_asked``: how many stops the user asked
    for (1: stop, 2 and more: kill now). Past ``deadline_s`` the run is stopped."""
    end = time.monotonic() + deadline_s
    asked = 0
    while not backend.done:
        n = stops_asked() if stops_asked else 0
        if n > asked:
            if asked == 0:
                backend.request_stop("preflight stopped by the user")
            else:
                backend.kill("preflight stopped by the user")
            asked = n
        if time.monotonic() > end and not backend.stopping:
            backend.request_stop(f"preflight still running after its deadline ({deadline_s:g} s)")
        events = backend.poll(0.1)
        if events and on_events is not None:
            on_events(events)
    backend.wait(60)


def finish_preflight(backend: LaunchBackend) -> PreflightReport:
    """Rank 0's result of an ended preflight, analysed and written to ``RUN/preflight.json``
    (atomically). Raises DtrainError naming why when there is no result."""
    run = backend.run.path
    return analyze_run_dir(run, fallback_reason=f"run {backend.state}: {backend.run.record.reason}")


def analyze_run_dir(run: Path, *, fallback_reason: str = "") -> PreflightReport:
    """The preflight result in run directory ``run``: analysed, and written to preflight.json."""
    log = rank_log(run, 0, "stdout")
    try:
        fd = open_regular(log, within=run)
        with open(fd, encoding="utf-8", errors="replace") as f:
            raw = parse_result_line(f)
    except (FileNotFoundError, DtrainError):  # none, or not a regular file of the run
        raw = None
    if raw is None:
        reason = fallback_reason
        try:
            rec = read_record(run)
            if rec.state != RunState.SUCCEEDED or not reason:
                reason = f"run {rec.state}: {rec.reason}"
        except DtrainError:
            pass
        raise DtrainError(
            f"the preflight printed no result ({reason}); see {run / 'logs'}", field="preflight"
        )
    plan = _read_json(run / "plan.json")
    try:
        hosts = read_record(run).hosts
    except DtrainError:
        hosts = []
    report = analyze(raw, plan, hosts)
    atomic_write_text(run / PREFLIGHT_JSON, report.to_json())
    return report


def run_preflight(
    kind: str,
    bundle_dir: Path,
    run_dir: Path | None,
    options: LaunchOptions,
    *,
    sbatch_args: Sequence[str] = (),
    max_mb: int | None = None,
    deadline_s: float = DEADLINE_S,
    on_events: Callable[[list[Event]], None] | None = None,
    stops_asked: Callable[[], int] | None = None,
) -> tuple[LaunchBackend, PreflightReport]:
    """Start, drive and finish a preflight (the wizard's and the tests' one call)."""
    backend = start_preflight(
        kind, bundle_dir, run_dir, options, sbatch_args=sbatch_args, max_mb=max_mb
    )
    backend.start()
    drive(backend, deadline_s=deadline_s, on_events=on_events, stops_asked=stops_asked)
    return backend, finish_preflight(backend)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(read_regular_text(path, JSON_LIMIT))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, DtrainError):
        return None
    return data if isinstance(data, dict) else None

"""The wizard's only door into the engine: thin calls to engine public functions.

Each function imports its engine module when first called, so the app starts without loading the
planner, the writers or the launch backends (and never torch, deepspeed or sky). The engine's own
errors (one line each) come back to the caller, who shows them on screen.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from engine.plan.dims import ModelDims
from engine.plan.names import NetworkTier
from engine.plan.specs import ModelSpec, Spec

if TYPE_CHECKING:
    from engine.launch import LaunchBackend
    from engine.plan.catalog import GpuType, NetworkType
    from engine.plan.result import Plan
    from engine.write import WriteReport
    from engine.write.bundle import WritePreview


def presets() -> list[tuple[str, str]]:
    """(name, one-line description) of every built-in model preset, in catalog order."""
    from engine.plan.models import list_presets, preset_description

    return [(name, preset_description(name)) for name in list_presets()]


def resolve_model(model: ModelSpec) -> ModelDims:
    """Exact dimensions and parameter counts of ``model``."""
    from engine.plan.models import resolve_model

    return resolve_model(model)


def architecture_notes(dims: ModelDims) -> list[str]:
    """What the model line adds to the shape: latent attention, head width, shared experts,
    leading dense layers."""
    from engine.plan.models import architecture_notes

    return architecture_notes(dims)


def list_gpus() -> list[GpuType]:
    """The accelerator catalog."""
    from engine.plan.catalog import list_gpus

    return list_gpus()


def get_gpu(key: str) -> GpuType:
    from engine.plan.catalog import get_gpu

    return get_gpu(key)


def get_network(tier: NetworkTier) -> NetworkType:
    from engine.plan.catalog import get_network

    return get_network(tier)


def make_plan(spec: Spec) -> Plan:
    """Run the planner (called from a worker thread)."""
    from engine.plan.planner import plan

    return plan(spec)


def render_bundle(plan: Plan) -> dict[str, str]:
    """File name -> text of every bundle file, as the writers would write them."""
    from engine.write import render_bundle

    return {name: f.text for name, f in render_bundle(plan).items()}


def write_bundle(plan: Plan, out: Path, *, force: bool = False) -> WriteReport:
    """Write the bundle atomically into ``out``; returns the writers' report. Refuses (one
    line) to replace files the user edited unless ``force`` (then they are backed up)."""
    from engine.write import write_bundle

    return write_bundle(plan, out, force=force)


def preview_write(files: dict[str, str], out: Path) -> WritePreview:
    """What writing ``files`` (name -> text, without bundle.json) into ``out`` would create,
    replace, back up and remove; reads the directory, writes nothing."""
    from engine.write.bundle import preview_write

    return preview_write(files, out)


def load_profile_spec(name: str, config_dir: Path | None) -> Spec:
    """The spec held by profile ``name`` (a saved profile or a built-in preset)."""
    from profiles.store import ProfileStore

    return ProfileStore(config_dir).load(name).spec


def start_run(spec: Spec, bundle_dir: Path, run_root: Path | None) -> tuple[LaunchBackend, Path]:
    """A launch backend for the bundle in ``bundle_dir``, not started yet (the monitor starts
    it and watches it), and its run directory under ``run_root`` (None: the engine's default)."""
    from engine import launch
    from engine.rundir.files import new_run_dir
    from engine.write.manifest import read_manifest

    options = launch.LaunchOptions.from_spec(spec.launch)
    run_dir = None if run_root is None else new_run_dir(read_manifest(bundle_dir).name, run_root)
    backend = launch.make_backend(spec.launch.backend.value, bundle_dir, run_dir, options)
    return backend, Path(backend.run.path)

"""The wizard's only door into the engine: thin, guarded calls to engine public functions.

Each function imports its engine module when first called, so the app starts without loading the
planner, the writers or the launch backends (and never torch, deepspeed or sky). A part of the
engine that is missing raises :class:`Unavailable`, which the screens show as a state ("planner not
available"), never as a traceback.
"""

from __future__ import annotations

import importlib
import re
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from engine.plan.specs import ModelDims, ModelSpec, NetworkTier, Spec

if TYPE_CHECKING:
    from engine.plan.result import Plan


class Unavailable(Exception):
    """A part of the engine this action needs is not installed or not built yet."""


def _module(name: str, what: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (e.name == name or name.startswith(e.name)):
            raise Unavailable(f"{what} not available ({name} is missing)") from None
        raise


def _func(mod: str, name: str, what: str) -> Any:
    fn = getattr(_module(mod, what), name, None)
    if fn is None:
        raise Unavailable(f"{what} not available ({mod}.{name} is missing)")
    return fn


def presets() -> list[tuple[str, str]]:
    """(name, one-line description) of every built-in model preset, in catalog order."""
    items = _func("engine.plan.models", "list_presets", "model presets")()
    describe = getattr(_module("engine.plan.models", "model presets"), "preset_description", None)
    out: list[tuple[str, str]] = []
    for item in items:
        name = item if isinstance(item, str) else str(getattr(item, "name", item))
        desc = ""
        if describe is not None:
            try:
                desc = str(describe(name))
            except Exception:  # noqa: BLE001 - a description is decoration only
                desc = ""
        out.append((name, desc))
    return out


def resolve_model(model: ModelSpec) -> ModelDims:
    """Exact dimensions and parameter counts of ``model``."""
    dims: ModelDims = _func("engine.plan.models", "resolve_model", "model resolver")(model)
    return dims


def list_gpus() -> list[Any]:
    """The accelerator catalog (``engine.plan.catalog.GpuType`` items)."""
    gpus: list[Any] = _func("engine.plan.catalog", "list_gpus", "GPU catalog")()
    return gpus


def get_gpu(key: str) -> Any:
    return _func("engine.plan.catalog", "get_gpu", "GPU catalog")(key)


def get_network(tier: NetworkTier) -> Any:
    return _func("engine.plan.catalog", "get_network", "network catalog")(tier)


def make_plan(spec: Spec) -> Plan:
    """Run the planner (called from a worker thread)."""
    result: Plan = _func("engine.plan.planner", "plan", "planner")(spec)
    return result


def _writers() -> ModuleType:
    try:
        return _module("engine.write", "config writers")
    except Unavailable:
        return _module("engine.write.bundle", "config writers")


def render_bundle(plan: Plan) -> dict[str, str]:
    """File name -> text of every bundle file, as the writers would write them."""
    fn = getattr(_writers(), "render_bundle", None)
    if fn is None:
        raise Unavailable("config writers not available (render_bundle is missing)")
    files: Mapping[str, Any] = fn(plan)
    return {name: f if isinstance(f, str) else str(f.text) for name, f in files.items()}


def write_bundle(plan: Plan, out: Path, *, force: bool = False) -> Any:
    """Write the bundle atomically into ``out``; returns the writers' report. Refuses (one
    line) to replace files the user edited unless ``force`` (then they are backed up)."""
    fn = getattr(_writers(), "write_bundle", None)
    if fn is None:
        raise Unavailable("config writers not available (write_bundle is missing)")
    return fn(plan, out, force=force)


def load_profile_spec(name: str, config_dir: Path | None) -> Spec:
    """The spec held by profile ``name`` (a saved profile or a built-in preset)."""
    store_cls = _func("profiles.store", "ProfileStore", "profiles")
    spec: Spec = store_cls(config_dir).load(name).spec
    return spec


def start_run(spec: Spec, bundle_dir: Path, run_root: Path | None) -> tuple[Any, Path]:
    """A launch backend for the bundle in ``bundle_dir``, not started yet (the monitor starts
    it and watches it), and its run directory under ``run_root`` (None: the engine's default)."""
    launch = _module("engine.launch", "launch backends")
    base = _module("engine.launch.base", "launch backends")
    from engine.write.manifest import read_manifest

    sl = spec.launch
    options = base.LaunchOptions(
        hosts=sl.parsed_hosts(),
        identity_file=sl.identity_file,
        known_hosts=sl.known_hosts,
        ssh_user=sl.ssh_user,
        remote_workdir=sl.remote_workdir,
        remote_setup=sl.remote_setup,
        hang_timeout_s=sl.hang_timeout_s,
        nccl_debug=sl.nccl_debug,
        nccl_debug_subsys=sl.nccl_debug_subsys,
        env=dict(sl.env),
        sky_cluster=sl.sky_cluster,
        sky_cloud=sl.sky_cloud,
        sky_down=sl.sky_down,
        sky_autostop_min=sl.sky_autostop_min,
    )
    run_dir: Path | None = None
    if run_root is not None:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", read_manifest(bundle_dir).name).strip("-.") or "run"
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = run_root / f"{stamp}-{name}"
        n = 1
        while run_dir.exists():
            n += 1
            run_dir = run_root / f"{stamp}-{name}-{n}"
    backend = launch.make_backend(sl.backend.value, bundle_dir, run_dir, options)
    return backend, Path(backend.run.path)

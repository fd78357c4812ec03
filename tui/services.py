"""The wizard's only door into the engine: thin, guarded calls to engine public functions.

Each function imports its engine module when first called, so the app starts without loading the
planner, the writers or the launch backends (and never torch, deepspeed or sky). A part of the
engine that is missing raises :class:`Unavailable`, which the screens show as a state ("planner not
available"), never as a traceback.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from engine.plan import Plan
from engine.specs import ModelDims, ModelSpec, NetworkTier, Spec


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
    items = _func("engine.models", "list_presets", "model presets")()
    describe = getattr(_module("engine.models", "model presets"), "preset_description", None)
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
    dims: ModelDims = _func("engine.models", "resolve_model", "model resolver")(model)
    return dims


def list_gpus() -> list[Any]:
    """The accelerator catalog (``engine.catalog.GpuType`` items)."""
    gpus: list[Any] = _func("engine.catalog", "list_gpus", "GPU catalog")()
    return gpus


def get_gpu(key: str) -> Any:
    return _func("engine.catalog", "get_gpu", "GPU catalog")(key)


def get_network(tier: NetworkTier) -> Any:
    return _func("engine.catalog", "get_network", "network catalog")(tier)


def make_plan(spec: Spec) -> Plan:
    """Run the planner (called from a worker thread)."""
    result: Plan = _func("engine.planner", "plan", "planner")(spec)
    return result


def render_bundle(plan: Plan) -> dict[str, str]:
    """File name -> text of every bundle file, as the writers would write them."""
    files: Mapping[str, str] = _func("engine.writers", "render_bundle", "config writers")(plan)
    return dict(files)


def write_bundle(plan: Plan, out: Path) -> Any:
    """Write the bundle atomically into ``out``; returns whatever the writers report."""
    return _func("engine.writers", "write_bundle", "config writers")(plan, out)


def load_profile_spec(name: str, config_dir: Path | None) -> Spec:
    """The spec held by profile ``name`` (a saved profile or a built-in preset)."""
    store_cls = _func("profiles.store", "ProfileStore", "profiles")
    spec: Spec = store_cls(config_dir).load(name).spec
    return spec

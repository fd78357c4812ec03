"""Launch backends: start a written bundle locally (torchrun), over SSH (paramiko) or through
SkyPilot, and turn everything the ranks print into events tagged with node, global rank and
stream, written to a run directory first. See :mod:`engine.launch.base` for the interface."""

from __future__ import annotations

from pathlib import Path

from engine.launch.base import LaunchBackend, LaunchError
from engine.launch.options import LaunchOptions

__all__ = ["LaunchBackend", "LaunchError", "LaunchOptions", "make_backend"]


def make_backend(
    kind: str, bundle_dir: Path, run_dir: Path | None = None, options: LaunchOptions | None = None
) -> LaunchBackend:
    """The backend named ``kind`` (local | ssh | skypilot) for ``bundle_dir``."""
    if kind == "local":
        from engine.launch.local import LocalBackend

        return LocalBackend(bundle_dir, run_dir, options)
    if kind == "ssh":
        from engine.launch.ssh import SshBackend

        return SshBackend(bundle_dir, run_dir, options)
    if kind == "skypilot":
        from engine.launch.skypilot import SkyPilotBackend

        return SkyPilotBackend(bundle_dir, run_dir, options)
    raise LaunchError(f"unknown backend {kind!r}; use local, ssh or skypilot", field="--backend")

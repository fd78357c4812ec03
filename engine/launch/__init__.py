"""Launch backends: start a written bundle locally (torchrun), over SSH (paramiko), through
SkyPilot or as a Slurm batch job, and turn everything the ranks print into events tagged with
node, global rank and stream, written to a run directory first. See :mod:`engine.launch.base` for the interface."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from engine.launch.base import LaunchBackend, LaunchError
from engine.launch.options import LaunchOptions
from engine.plan.names import Backend

__all__ = ["LaunchBackend", "LaunchError", "LaunchOptions", "make_backend"]


def make_backend(
    kind: Backend | str,
    bundle_dir: Path,
    run_dir: Path | None = None,
    options: LaunchOptions | None = None,
    *,
    sbatch_args: Sequence[str] = (),
) -> LaunchBackend:
    """The backend named ``kind`` (local | ssh | skypilot | slurm) for ``bundle_dir``;
    ``sbatch_args``: Slurm options given at launch, put on sbatch's command line."""
    try:
        which = Backend(kind)
    except ValueError:
        raise LaunchError(
            f"unknown backend {kind!r}; use local, ssh, skypilot or slurm", field="--backend"
        ) from None
    if which is Backend.LOCAL:
        from engine.launch.local import LocalBackend

        return LocalBackend(bundle_dir, run_dir, options)
    if which is Backend.SSH:
        from engine.launch.ssh import SshBackend

        return SshBackend(bundle_dir, run_dir, options)
    if which is Backend.SKYPILOT:
        from engine.launch.skypilot import SkyPilotBackend

        return SkyPilotBackend(bundle_dir, run_dir, options)
    from engine.launch.slurm import SlurmBackend

    return SlurmBackend(bundle_dir, run_dir, options, sbatch_args=sbatch_args)

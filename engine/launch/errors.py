"""The one error every launch step raises (:class:`LaunchError`), importable without the rest."""

from __future__ import annotations

from engine.errors import DtrainError


class LaunchError(DtrainError):
    """A launch could not start or went wrong; the message names node and host."""

"""Atomic file writes: write a temp file in the same directory, fsync, then rename over the
target, so a crash or a full disk never leaves a half-written file where a good one was."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write_text(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` atomically, with permission bits ``mode``."""
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_bytes(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically, with permission bits ``mode``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def unused_path(path: Path, tag: str, ext: str = "") -> Path:
    """``NAME<tag><ext>`` beside ``path``, or ``NAME<tag>-<n><ext>`` when that is taken, so a
    backup never replaces an earlier one (``ds_config.json.bak-<time>``, ``p.toml.v1.bak``)."""
    candidate = path.with_name(f"{path.name}{tag}{ext}")
    n = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}{tag}-{n}{ext}")
        n += 1
    return candidate

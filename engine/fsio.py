"""Atomic file writes: write a temp file in the same directory, fsync, then rename over the
target, so a crash or a full disk never leaves a half-written file where a good one was."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path


def atomic_write_text(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` atomically, with permission bits ``mode``."""
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_bytes(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically, with permission bits ``mode``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The writer's pid is in the name: a writer killed outright (SIGKILL) leaves its temp file
    # behind, and :func:`sweep_stale_temps` can tell it from one still being written.
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.{os.getpid()}{_PID_END}", suffix=".tmp", dir=path.parent
    )
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


_PID_END = "-"
_TEMP_RE = re.compile(r"^\..+\.(\d+)-[^/]*\.tmp$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def sweep_stale_temps(directory: Path) -> list[Path]:
    """Remove the temp files of :func:`atomic_write_bytes` in ``directory`` whose writer is gone
    (killed before it could clean up); returns what was removed. Files of live writers, other
    names and symlinks are left alone."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        m = _TEMP_RE.match(entry.name)
        if m is None or not entry.is_file(follow_symlinks=False) or _alive(int(m.group(1))):
            continue
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


def unused_path(path: Path, tag: str, ext: str = "") -> Path:
    """``NAME<tag><ext>`` beside ``path``, or ``NAME<tag>-<n><ext>`` when that is taken, so a
    backup never replaces an earlier one (``ds_config.json.bak-<time>``, ``p.toml.v1.bak``)."""
    candidate = path.with_name(f"{path.name}{tag}{ext}")
    n = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}{tag}-{n}{ext}")
        n += 1
    return candidate

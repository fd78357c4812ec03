"""A real small file system for tests of what happens when the disk fills: a tmpfs of a given
size mounted on a temporary directory (tests run as root), unmounted afterwards."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """``path`` as a tmpfs of ``size`` (``64k``, ``1m``); skips the test where mounting is not
    permitted (not root, no mount namespace)."""
    path.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("mount is not available")
    if mounted.returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], capture_output=True, timeout=30)


def fill(mnt: Path, leave_pages: int) -> int:
    """Fill ``mnt`` so that only ``leave_pages`` blocks stay free; returns the bytes free."""
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    (mnt / "filler").write_bytes(b"\0" * max(0, free - leave_pages * st.f_frsize))
    st = os.statvfs(mnt)
    return st.f_bavail * st.f_frsize


def snapshot(root: Path) -> dict[str, tuple[int, bytes | str]]:
    """Every entry under ``root`` by relative path: its mode and its bytes (a symlink: its
    target)."""
    out: dict[str, tuple[int, bytes | str]] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = (st.st_mode, str(p.readlink()))
        elif p.is_file():
            out[rel] = (st.st_mode, p.read_bytes())
        else:
            out[rel] = (st.st_mode, "")
    return out

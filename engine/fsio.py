"""Atomic file writes: write a temp file in the same directory, fsync, then rename over the
target, so a crash or a full disk never leaves a half-written file where a good one was. And
bounded reads of files that are not trusted (:func:`read_regular_bytes`): only a regular file,
never a device, FIFO, socket or a symlink, and never more than a cap per kind of file."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
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


# ---- bounded reads of files that are not trusted -----------------------------------------

MiB = 1 << 20
JSON_LIMIT = 8 * MiB
"""run.json, bundle.json, plan.json, a spec or model config, a profile: a few KiB when honest."""
DUMP_LIMIT = 256 * MiB
"""A Flight Recorder dump holds a trace per collective: far bigger than a config, still bounded."""


def read_regular_bytes(
    path: Path | str,
    limit: int,
    *,
    within: Path | str | None = None,
    label: str = "",
    follow: bool = False,
) -> bytes:
    """The bytes of ``path`` when it is a regular file of at most ``limit`` bytes, else a one-line
    :class:`engine.errors.DtrainError` naming it (``label``, or the path) and why.

    Opened with ``O_NONBLOCK`` (a FIFO never blocks) and ``O_NOFOLLOW`` (its last component is
    never a symlink; ``follow=True`` for a path a person typed, whose symlink is theirs: its
    target is still checked); the opened fd is what is checked (``fstat``: no window between a check
    and the open), and at most ``limit + 1`` bytes are read (``/dev/zero`` ends at once). With
    ``within``, ``path`` must also resolve inside that directory (no symlinked parent leads out
    of a run directory). A missing file is :class:`FileNotFoundError`, as from ``open``; other
    OS errors are OSError."""
    from engine.errors import DtrainError

    name = label or str(path)
    fd = open_regular(path, within=within, label=label, follow=follow)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise DtrainError(f"{name}: {size} bytes, more than the {_human(limit)} allowed")
        chunks: list[bytes] = []
        got = 0
        while got <= limit:
            chunk = os.read(fd, min(limit + 1 - got, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:  # grew while read
            raise DtrainError(f"{name}: more than the {_human(limit)} allowed")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_regular_text(
    path: Path | str,
    limit: int,
    *,
    within: Path | str | None = None,
    label: str = "",
    follow: bool = False,
) -> str:
    """:func:`read_regular_bytes` as UTF-8 text (a bad byte is UnicodeDecodeError, as from
    ``read_text``)."""
    data = read_regular_bytes(path, limit, within=within, label=label, follow=follow)
    return data.decode("utf-8")


def open_regular(
    path: Path | str,
    *,
    within: Path | str | None = None,
    label: str = "",
    follow: bool = False,
) -> int:
    """An fd open for reading on ``path``, a regular file (see :func:`read_regular_bytes`); the
    caller closes it. Reads on it block as a plain file's do (``O_NONBLOCK`` is cleared)."""
    from engine.errors import DtrainError

    name = label or str(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise DtrainError(f"{name}: is a symlink; not read") from None
        if e.errno == errno.EISDIR:
            raise DtrainError(f"{name}: not a regular file (a directory)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DtrainError(f"{name}: not a regular file ({_kind(st.st_mode)})")
        if within is not None and not _inside(fd, path, within):
            raise DtrainError(f"{name}: leads out of {within} (through a symlink); not read")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _inside(fd: int, path: Path | str, within: Path | str) -> bool:
    """Whether the file open on ``fd`` lies under directory ``within``: asked of the fd itself
    (``/proc/self/fd``, so a parent swapped for a symlink after the open is still seen), or of
    the resolved path where there is no /proc."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = os.path.realpath(path)
    base = os.path.realpath(within)
    return os.path.commonpath([real, base]) == base


def _kind(mode: int) -> str:
    for test, what in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return what
    return "not a plain file"


def _human(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n} bytes"

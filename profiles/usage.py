"""When each profile was last used: a user profile keeps it in its own ``[profile].last_used``
(its comments untouched); a built-in preset, whose file is read-only package data, in
``<profiles dir>/.state.toml``. Used by :class:`profiles.store.ProfileStore`; best effort
throughout: a broken or unwritable file is left as it is.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import tomlkit
from tomlkit.exceptions import TOMLKitError

from engine.errors import DtrainError
from engine.fsio import JSON_LIMIT, atomic_write_text, read_regular_text
from profiles.schema import SCHEMA_VERSION, file_version
from profiles.tomldoc import (
    FILE_MODE,
    read_doc,
    set_profile_keys,
    unwrap,
    usage_doc,
    validate,
    where,
)

STATE_FILE = ".state.toml"
"""Last-use times of built-in presets (their files are read-only package data)."""


def builtin_usage(profiles_dir: Path) -> dict[str, datetime]:
    """Last use of each built-in preset; an unreadable state file reads as none."""
    try:
        text = read_regular_text(profiles_dir / STATE_FILE, JSON_LIMIT, follow=True)
        data = tomlkit.parse(text).unwrap()
    except (OSError, UnicodeDecodeError, TOMLKitError, DtrainError):  # DtrainError: no plain file
        return {}
    used = data.get("last_used", {})
    if not isinstance(used, dict):
        return {}
    return {k: v for k, v in used.items() if isinstance(v, datetime)}


def mark_user_profile(path: Path, name: str, when: datetime) -> None:
    """Set ``[profile].last_used`` in the user's file; a file of another schema version or one
    that does not validate is never touched. Raises ProfileError / OSError for the caller to
    ignore."""
    doc = read_doc(path)
    if file_version(doc, where(path)) != SCHEMA_VERSION:
        return
    validate(unwrap(doc), path, name)  # never touch a broken file
    set_profile_keys(doc, {"last_used": when})
    atomic_write_text(path, doc.as_string(), mode=FILE_MODE)


def mark_builtin(profiles_dir: Path, name: str, when: datetime) -> None:
    """Record the built-in ``name`` as used at ``when`` in the state file (the directory must
    exist). Raises OSError for the caller to ignore."""
    used = builtin_usage(profiles_dir)
    used[name] = when
    atomic_write_text(profiles_dir / STATE_FILE, usage_doc(used).as_string(), mode=FILE_MODE)

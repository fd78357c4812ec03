"""A profile file as a TOML document: read with one-line errors, validated, and edited in place
so a person's comments and layout survive a save (tomlkit). Used by :mod:`profiles.store`
(which decides *which* file) and :mod:`profiles.usage`; knows nothing of the store's directory.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator, Mapping, MutableMapping
from datetime import datetime
from pathlib import Path
from typing import Any

import tomlkit
from pydantic import ValidationError
from tomlkit.exceptions import TOMLKitError
from tomlkit.toml_document import TOMLDocument

from engine.errors import DtrainError, validation_messages
from engine.fsio import JSON_LIMIT, read_regular_bytes
from profiles.schema import SCHEMA_VERSION, SPEC_SECTIONS, Profile, ProfileError, check_secrets

FILE_MODE = 0o600

_HEADER = (
    "dtrain-tui profile. Edit freely: comments and layout are kept when dtrain-tui saves a change.",
    "Sections and keys are those of `dtrain-tui plan --help`; check with `dtrain-tui profiles show NAME`.",
    "Never put a password, a private key or a token here: name key files by path.",
)


def where(path: Path) -> str:
    return str(path)


@contextlib.contextmanager
def fs_errors(path: Path) -> Iterator[None]:
    """File-system failures (permissions, a full disk) as one ProfileError line."""
    try:
        yield
    except OSError as e:
        reason = e.strerror or type(e).__name__
        failed = e.filename or path
        raise ProfileError(f"cannot write {failed}: {reason}", field=where(path)) from None


def read_doc(path: Path) -> TOMLDocument:
    """Parse a profile file into a tomlkit document; every failure is one ProfileError line."""
    try:
        raw = read_regular_bytes(path, JSON_LIMIT, label="file", follow=True)
    except FileNotFoundError:
        raise ProfileError("file not found", field=where(path)) from None
    except DtrainError as e:  # a device, FIFO, directory, or too big
        raise ProfileError(e.message, field=where(path)) from None
    except OSError as e:
        raise ProfileError(f"cannot read: {e.strerror}", field=where(path)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProfileError(
            f"not UTF-8 text (byte {e.start} is {raw[e.start : e.start + 1]!r}); the file is "
            "corrupted: fix it or delete it",
            field=where(path),
        ) from None
    if not text.strip():
        raise ProfileError("the file is empty (truncated?); fix it or delete it", field=where(path))
    try:
        return tomlkit.parse(text)
    except TOMLKitError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ProfileError(
            f"not valid TOML ({first}); the file may be truncated: fix it or delete it",
            field=where(path),
        ) from None


def validate(data: Mapping[str, Any], path: Path, name: str) -> Profile:
    """Secret guard, then the Spec's own validation; errors name the file and dotted keys."""
    check_secrets(data, where=where(path))
    try:
        prof = Profile.model_validate(dict(data))
    except ValidationError as e:
        msgs = "; ".join(validation_messages(e))
        raise ProfileError(msgs, field=where(path)) from None
    except ProfileError:
        raise
    except (ValueError, TypeError) as e:  # a validator outside pydantic's wrapping
        raise ProfileError(str(e).splitlines()[0], field=where(path)) from None
    prof.profile.name = name
    return prof


def _plain(item: Any) -> Any:
    unwrap = getattr(item, "unwrap", None)
    return unwrap() if callable(unwrap) else item


def _set_table(container: MutableMapping[str, Any], key: str, data: Mapping[str, Any]) -> None:
    tbl = tomlkit.table()
    for k, v in data.items():
        if isinstance(v, Mapping):
            _set_table(tbl, k, v)
        else:
            tbl[k] = v
    container[key] = tbl


def _merge(
    container: MutableMapping[str, Any], new: Mapping[str, Any], old: Mapping[str, Any]
) -> None:
    """Make ``container`` (a tomlkit table) hold ``new``, touching only keys whose value changed
    (``old`` is what the file meant before), so untouched lines keep their text and comments."""
    for k in [k for k in container if k not in new]:
        del container[k]
    for k, v in new.items():
        if k in container and k in old and old[k] == v:
            continue
        cur = container.get(k)
        if isinstance(v, Mapping):
            if isinstance(cur, MutableMapping):
                prev = old.get(k)
                _merge(cur, v, prev if isinstance(prev, Mapping) else {})
            else:
                _set_table(container, k, v)
        elif k in container and _plain(cur) == v:
            continue
        else:
            container[k] = v


def _section_data(prof: Profile, section: str, present: Mapping[str, Any] | None) -> dict[str, Any]:
    """Keys to write for ``section``: those that differ from the default, plus those the file
    already spells out (kept even at their default, so a hand-written line is not dropped)."""
    sub = getattr(prof, section)
    full: dict[str, Any] = sub.model_dump(mode="json", exclude_none=True)
    nondefault = sub.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    return {k: v for k, v in full.items() if k in nondefault or (present and k in present)}


def apply(doc: TOMLDocument, prof: Profile, old: Profile | None) -> None:
    """Write ``prof`` into ``doc`` in place."""
    if _plain(doc.get("schema_version")) != SCHEMA_VERSION:
        if "schema_version" in doc:
            doc["schema_version"] = SCHEMA_VERSION
        else:
            doc.add("schema_version", SCHEMA_VERSION)  # tomlkit puts it before the tables
    cur_meta = doc.get("profile")
    meta_new = {
        k: v
        for k, v in prof.profile.model_dump(exclude_none=True).items()
        if k == "name" or v != "" or (isinstance(cur_meta, Mapping) and k in cur_meta)
    }
    meta_old = old.profile.model_dump(exclude_none=True) if old else {}
    if isinstance(cur_meta, MutableMapping):
        _merge(cur_meta, meta_new, meta_old)
    else:
        _set_table(doc, "profile", meta_new)
    for section in SPEC_SECTIONS:
        cur = doc.get(section)
        present = cur if isinstance(cur, MutableMapping) else None
        data = _section_data(prof, section, present)
        if present is None:
            if data:
                _set_table(doc, section, data)
            continue
        prev = getattr(old, section).model_dump(mode="json", exclude_none=True) if old else {}
        _merge(present, data, prev)


def render(doc: TOMLDocument, prof: Profile, old: Profile | None, path: Path, name: str) -> str:
    """``prof`` written into ``doc`` (edited in place), as text that is checked to read back as
    the same profile: a file we could not load is never written."""
    apply(doc, prof, old)
    text = doc.as_string()
    check = validate(unwrap(tomlkit.parse(text)), path, name)
    if check.model_dump(include=set(SPEC_SECTIONS)) != prof.model_dump(include=set(SPEC_SECTIONS)):
        raise ProfileError("internal: the saved file would not read back the same", field=name)
    return text


def new_doc() -> TOMLDocument:
    doc = tomlkit.document()
    for line in _HEADER:
        doc.add(tomlkit.comment(line))
    doc.add("schema_version", SCHEMA_VERSION)
    return doc


def unwrap(doc: TOMLDocument) -> dict[str, Any]:
    data: dict[str, Any] = doc.unwrap()
    return data


def set_profile_keys(
    doc: TOMLDocument, keys: Mapping[str, Any], *, only_present: bool = False
) -> None:
    """Set keys of the document's ``[profile]`` table in place (``only_present``: only those the
    table already spells out), creating the table when there is none and ``only_present`` is
    false."""
    meta = doc.get("profile")
    if isinstance(meta, MutableMapping):
        for k, v in keys.items():
            if not only_present or k in meta:
                meta[k] = v
    elif not only_present:
        _set_table(doc, "profile", dict(keys))


def declared_name(doc: TOMLDocument) -> str | None:
    """The ``[profile].name`` a file declares, if any."""
    meta = doc.get("profile")
    name = _plain(meta.get("name")) if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) and name else None


def usage_doc(used: Mapping[str, datetime]) -> TOMLDocument:
    """The ``.state.toml`` document recording when each built-in preset was last used."""
    doc = tomlkit.document()
    doc.add(tomlkit.comment("When each built-in preset was last used (dtrain-tui)."))
    _set_table(doc, "last_used", dict(sorted(used.items())))
    return doc


def backup(path: Path, tag: int | str) -> Path:
    """Copy ``path`` to a new ``NAME.toml.v1.bak`` (or ``.broken.bak``), numbered if one is
    already there, 0600. The backup is created with O_EXCL | O_NOFOLLOW: a name taken by
    anything, a planted symlink included, is skipped, never written or chmodded through."""
    label = f"v{tag}" if isinstance(tag, int) else tag
    with path.open("rb") as src:
        data = src.read()
        st = os.fstat(src.fileno())
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for n in itertools.count():
        backup = path.with_name(f"{path.name}.{label}{f'-{n}' if n else ''}.bak")
        try:
            fd = os.open(backup, flags, FILE_MODE)
        except FileExistsError:
            continue
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), FILE_MODE)
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
                os.utime(f.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(backup)
            raise
        return backup
    raise AssertionError("unreachable")

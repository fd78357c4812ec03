"""Where profiles live and how they are read and written.

``ProfileStore(config_dir)`` is used by the CLI (``--profile NAME`` on plan/write/launch via
``cli.spec_options``, and ``dtrain-tui profiles ...``) and by the wizard's profile screen.
It promises:

* One file per profile at ``<config dir>/profiles/NAME.toml``; the config dir is the
  ``config_dir`` argument, else ``$DTRAIN_CONFIG_DIR``, else platformdirs' user config dir.
* Built-in presets (``profiles/presets/*.toml``) are listed alongside the user's own; a user
  profile of the same name shadows the built-in.
* Writes are atomic (temp file + rename), files 0600 and the directory 0700, and a rewrite
  edits the TOML document in place (tomlkit), so the user's comments and layout survive.
* An older schema is migrated on load; the original bytes are kept as ``NAME.toml.v<N>.bak``.
  A newer, corrupted, truncated or wrong-typed file raises one :class:`ProfileError` line naming
  the file and the problem, and the file is left untouched; listing still shows the others.
* Nothing holding a password, a private key or a token is ever written or loaded.
"""

from __future__ import annotations

import contextlib
import difflib
import itertools
import os
import stat
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import tomlkit
from pydantic import ValidationError
from tomlkit.exceptions import TOMLKitError
from tomlkit.toml_document import TOMLDocument

from engine.errors import validation_messages
from engine.fsio import atomic_write_text, sweep_stale_temps
from engine.plan.specs import Spec
from profiles.schema import (
    SCHEMA_VERSION,
    SPEC_SECTIONS,
    Profile,
    ProfileError,
    check_name,
    check_secrets,
    file_version,
    migrate,
    now_utc,
)

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
ENV_CONFIG_DIR = "DTRAIN_CONFIG_DIR"
FILE_MODE = 0o600
DIR_MODE = 0o700
STATE_FILE = ".state.toml"
"""Last-use times of built-in presets (their files are read-only package data)."""

_HEADER = (
    "dtrain-tui profile. Edit freely: comments and layout are kept when dtrain-tui saves a change.",
    "Sections and keys are those of `dtrain-tui plan --help`; check with `dtrain-tui profiles show NAME`.",
    "Never put a password, a private key or a token here: name key files by path.",
)


def default_config_dir() -> Path:
    """``$DTRAIN_CONFIG_DIR`` if set, else the platform's user config dir for dtrain-tui."""
    env = os.environ.get(ENV_CONFIG_DIR)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_config_dir

    return Path(user_config_dir("dtrain-tui", appauthor=False))


@dataclass(frozen=True)
class ProfileEntry:
    """One row of :meth:`ProfileStore.list`: a usable profile, or a broken file and why."""

    name: str
    source: Literal["user", "builtin"]
    path: Path
    profile: Profile | None
    error: str | None = None
    shadows_builtin: bool = False
    needs_migration: bool = False

    @property
    def ok(self) -> bool:
        return self.profile is not None

    @property
    def last_used(self) -> datetime | None:
        return self.profile.profile.last_used if self.profile else None

    @property
    def description(self) -> str:
        return self.profile.profile.description if self.profile else ""


def _where(path: Path) -> str:
    return str(path)


@contextlib.contextmanager
def _fs(path: Path) -> Iterator[None]:
    """File-system failures (permissions, a full disk) as one ProfileError line."""
    try:
        yield
    except OSError as e:
        reason = e.strerror or type(e).__name__
        where = e.filename or path
        raise ProfileError(f"cannot write {where}: {reason}", field=_where(path)) from None


def _read_doc(path: Path) -> TOMLDocument:
    """Parse a profile file into a tomlkit document; every failure is one ProfileError line."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ProfileError("file not found", field=_where(path)) from None
    except OSError as e:
        raise ProfileError(f"cannot read: {e.strerror}", field=_where(path)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProfileError(
            f"not UTF-8 text (byte {e.start} is {raw[e.start : e.start + 1]!r}); the file is "
            "corrupted: fix it or delete it",
            field=_where(path),
        ) from None
    if not text.strip():
        raise ProfileError(
            "the file is empty (truncated?); fix it or delete it", field=_where(path)
        )
    try:
        return tomlkit.parse(text)
    except TOMLKitError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ProfileError(
            f"not valid TOML ({first}); the file may be truncated: fix it or delete it",
            field=_where(path),
        ) from None


def _validate(data: Mapping[str, Any], path: Path, name: str) -> Profile:
    """Secret guard, then the Spec's own validation; errors name the file and dotted keys."""
    check_secrets(data, where=_where(path))
    try:
        prof = Profile.model_validate(dict(data))
    except ValidationError as e:
        msgs = "; ".join(validation_messages(e))
        raise ProfileError(msgs, field=_where(path)) from None
    except ProfileError:
        raise
    except (ValueError, TypeError) as e:  # a validator outside pydantic's wrapping
        raise ProfileError(str(e).splitlines()[0], field=_where(path)) from None
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


def _apply(doc: TOMLDocument, prof: Profile, old: Profile | None) -> None:
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


def _new_doc() -> TOMLDocument:
    doc = tomlkit.document()
    for line in _HEADER:
        doc.add(tomlkit.comment(line))
    doc.add("schema_version", SCHEMA_VERSION)
    return doc


def _unwrap(doc: TOMLDocument) -> dict[str, Any]:
    data: dict[str, Any] = doc.unwrap()
    return data


class ProfileStore:
    """The user's profiles plus the built-in presets. See the module docstring for promises."""

    def __init__(self, config_dir: Path | None = None, *, presets_dir: Path | None = None) -> None:
        self.config_dir = Path(config_dir).expanduser() if config_dir else default_config_dir()
        self.presets_dir = presets_dir or PRESETS_DIR

    # ------------------------------------------------------------------ paths and names

    @property
    def profiles_dir(self) -> Path:
        return self.config_dir / "profiles"

    def user_path(self, name: str) -> Path:
        return self.profiles_dir / f"{check_name(name)}.toml"

    def builtin_path(self, name: str) -> Path:
        return self.presets_dir / f"{check_name(name)}.toml"

    def _user_names(self) -> list[str]:
        if not self.profiles_dir.is_dir():
            return []
        return sorted(
            p.stem
            for p in self.profiles_dir.glob("*.toml")
            if not p.name.startswith(".") and _valid_name(p.stem)
        )

    def builtin_names(self) -> list[str]:
        if not self.presets_dir.is_dir():
            return []
        return sorted(p.stem for p in self.presets_dir.glob("*.toml") if _valid_name(p.stem))

    def names(self) -> list[str]:
        """Every loadable name: the user's, then built-ins not shadowed."""
        user = self._user_names()
        return user + [n for n in self.builtin_names() if n not in user]

    def is_user(self, name: str) -> bool:
        return self.user_path(name).is_file()

    def is_builtin(self, name: str) -> bool:
        return self.builtin_path(name).is_file()

    def exists(self, name: str) -> bool:
        return self.is_user(name) or self.is_builtin(name)

    def path_of(self, name: str) -> Path:
        """The file ``load(name)`` reads (the user's, else the built-in)."""
        if self.is_user(name):
            return self.user_path(name)
        if self.is_builtin(name):
            return self.builtin_path(name)
        raise self._not_found(name)

    def _not_found(self, name: str) -> ProfileError:
        names = self.names()
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return ProfileError(
            f"no profile named {name!r}; {hint}`dtrain-tui profiles list` shows them "
            f"(in {self.profiles_dir} and the built-ins)",
            field="--profile",
        )

    # ------------------------------------------------------------------ reading

    def _read(self, path: Path, name: str) -> tuple[Profile, int]:
        """Parse and validate ``path`` without touching it; returns (profile, file version)."""
        doc = _read_doc(path)
        version = migrate(doc, _where(path))
        return _validate(_unwrap(doc), path, name), version

    def list(self) -> list[ProfileEntry]:
        """Every profile, the user's first, each a usable profile or a broken file marked with
        its one-line error. Read-only: nothing is migrated or rewritten."""
        entries: list[ProfileEntry] = []
        builtins = set(self.builtin_names())
        user = self._user_names()
        state = self._state()
        for name in user:
            path = self.user_path(name)
            try:
                prof, version = self._read(path, name)
            except ProfileError as e:
                entries.append(ProfileEntry(name, "user", path, None, str(e), name in builtins))
                continue
            entries.append(
                ProfileEntry(
                    name, "user", path, prof, None, name in builtins, version < SCHEMA_VERSION
                )
            )
        for name in sorted(builtins - set(user)):
            path = self.builtin_path(name)
            try:
                prof, _ = self._read(path, name)
            except ProfileError as e:
                entries.append(ProfileEntry(name, "builtin", path, None, str(e)))
                continue
            if name in state:
                prof.profile.last_used = state[name]
            entries.append(ProfileEntry(name, "builtin", path, prof))
        return entries

    def load(self, name: str) -> Profile:
        """The profile called ``name`` (the user's, else the built-in). An older user file is
        migrated: the original is kept as ``NAME.toml.v<N>.bak`` and the file rewritten."""
        check_name(name)
        if self.is_user(name):
            return self._load_user(name)
        if self.is_builtin(name):
            prof, _ = self._read(self.builtin_path(name), name)
            used = self._state().get(name)
            if used:
                prof.profile.last_used = used
            return prof
        raise self._not_found(name)

    def _load_user(self, name: str) -> Profile:
        path = self.user_path(name)
        doc = _read_doc(path)
        version = file_version(doc, _where(path))
        if version == SCHEMA_VERSION:
            return _validate(_unwrap(doc), path, name)
        migrate(doc, _where(path))
        prof = _validate(_unwrap(doc), path, name)  # a broken old file stays untouched
        try:
            _backup(path, version)
            atomic_write_text(path, doc.as_string(), mode=FILE_MODE)
        except OSError:
            # A read-only config dir: use the migrated profile in memory, leave the file be.
            pass
        return prof

    def text(self, name: str) -> str:
        """The file's text as stored (for ``profiles show`` and export)."""
        path = self.path_of(name)
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ProfileError(f"cannot read: {e}", field=_where(path)) from None

    # ------------------------------------------------------------------ writing

    def _ensure_dir(self) -> None:
        """Create the profiles dir (0700); tighten an existing one of ours to 0700. Never
        through a symlink: a profiles dir linked to a shared directory keeps that directory's
        mode (the files in it are 0600 all the same)."""
        self.profiles_dir.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        try:
            fd = os.open(self.profiles_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return  # a symlink (ELOOP) or unreadable: leave its mode alone
        try:
            st = os.fstat(fd)
            if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != DIR_MODE:
                os.fchmod(fd, DIR_MODE)
        finally:
            os.close(fd)

    def save(self, profile: Profile, *, name: str | None = None, overwrite: bool = True) -> Path:
        """Write ``profile`` as ``<profiles dir>/NAME.toml`` (NAME: ``name`` or the profile's).
        An existing file is edited in place so its comments survive; a new profile that shadows
        a built-in starts from the built-in's file (and its comments). Returns the path."""
        name = check_name(name or profile.profile.name)
        path = self.user_path(name)
        prof = profile.model_copy(deep=True)
        prof.profile.name = name
        if prof.profile.created is None:
            prof.profile.created = now_utc()
        check_secrets(prof.model_dump(mode="json", exclude_none=True), where=f"profile {name!r}")
        # Temp files of a save that was killed outright (SIGKILL) are no one's: clear them.
        sweep_stale_temps(self.profiles_dir)
        # Whole-model validation (model_copy skips it): catches a spec assembled field by field.
        try:
            prof = Profile.model_validate(prof.model_dump())
        except ValidationError as e:
            raise ProfileError(
                "; ".join(validation_messages(e)), field=f"profile {name!r}"
            ) from None
        doc: TOMLDocument | None = None
        old: Profile | None = None
        if path.exists():
            if not overwrite:
                raise ProfileError(
                    f"profile {name!r} already exists ({path}); choose another name or overwrite it",
                    field="profile name",
                )
            try:
                doc = _read_doc(path)
                start = migrate(doc, _where(path))
                if start < SCHEMA_VERSION:  # keep the original, as load does
                    with _fs(path):
                        _backup(path, start)
                old = _validate(_unwrap(doc), path, name)
            except ProfileError:
                # The file is broken: keep it beside the new one rather than lose it.
                with _fs(path):
                    _backup(path, "broken")
                doc, old = None, None
        elif self.is_builtin(name):
            try:
                doc = _read_doc(self.builtin_path(name))
                migrate(doc, name)
                old = _validate(_unwrap(doc), self.builtin_path(name), name)
            except ProfileError:
                doc, old = None, None
        if doc is None:
            doc = _new_doc()
        if old is not None and old.profile.created is not None and profile.profile.created is None:
            prof.profile.created = old.profile.created
        _apply(doc, prof, old)
        text = doc.as_string()
        # What is written must read back as the same profile: never write a file we can't load.
        check = _validate(_unwrap(tomlkit.parse(text)), path, name)
        if check.model_dump(include=set(SPEC_SECTIONS)) != prof.model_dump(
            include=set(SPEC_SECTIONS)
        ):
            raise ProfileError("internal: the saved file would not read back the same", field=name)
        with _fs(path):
            self._ensure_dir()
            atomic_write_text(path, text, mode=FILE_MODE)
        return path

    def save_spec(
        self,
        name: str,
        spec: Spec,
        *,
        description: str | None = None,
        overwrite: bool = True,
    ) -> Path:
        """Save ``spec`` as profile ``name`` (what the wizard's save and save-as call). An
        existing profile of that name keeps its description, creation time and last use."""
        check_name(name)
        base: Profile | None = None
        if self.is_user(name) and overwrite:
            try:
                base = self.load(name)
            except ProfileError:
                base = None
        if base is not None:
            prof = base.model_copy(
                update={s: getattr(spec, s).model_copy(deep=True) for s in SPEC_SECTIONS}
            )
            if description is not None:
                prof.profile.description = description
        else:
            prof = Profile.from_spec(name, spec, description=description or "")
        return self.save(prof, name=name, overwrite=overwrite)

    def delete(self, name: str) -> Path:
        """Delete the user's profile ``name`` (a broken one too). Built-ins cannot be deleted."""
        path = self.user_path(name)
        if not path.exists():
            if self.is_builtin(name):
                raise ProfileError(
                    f"{name!r} is a built-in preset and cannot be deleted; it is only listed",
                    field="profile name",
                )
            raise self._not_found(name)
        with _fs(path):
            path.unlink()
        return path

    def rename(self, old: str, new: str, *, overwrite: bool = False) -> Path:
        """Rename the user's profile ``old`` to ``new``, keeping the file's text and comments."""
        src = self.user_path(old)
        dst = self.user_path(new)
        if not src.exists():
            if self.is_builtin(old):
                raise ProfileError(
                    f"{old!r} is a built-in preset; save it under a new name instead "
                    f"(`dtrain-tui profiles import`) or load it and use save as",
                    field="profile name",
                )
            raise self._not_found(old)
        if dst.exists() and not overwrite and src != dst:
            raise ProfileError(
                f"profile {new!r} already exists ({dst}); delete it first or pick another name",
                field="profile name",
            )
        doc = _read_doc(src)
        meta = doc.get("profile")
        if isinstance(meta, MutableMapping):
            if "name" in meta:
                meta["name"] = new
        else:
            _set_table(doc, "profile", {"name": new})
        with _fs(dst):
            self._ensure_dir()
            atomic_write_text(dst, doc.as_string(), mode=FILE_MODE)
            if src != dst:
                src.unlink()
        return dst

    def export(self, name: str, dest: Path | None = None, *, overwrite: bool = False) -> str:
        """The profile's file text, checked loadable (nothing is migrated or rewritten);
        written to ``dest`` (0600) when given. An existing ``dest`` is kept unless
        ``overwrite``."""
        self._read(self.path_of(name), name)
        text = self.text(name)
        if dest is not None:
            dest = Path(dest)
            if dest.exists() and not overwrite:
                raise ProfileError(
                    f"{dest} already exists; pass another file or --force to replace it",
                    field="--output",
                )
            with _fs(dest):
                atomic_write_text(dest, text, mode=FILE_MODE)
        return text

    def import_file(
        self, src: Path, *, name: str | None = None, overwrite: bool = False
    ) -> tuple[str, Path]:
        """Copy a profile file into the store under ``name`` (default: its ``[profile].name``,
        else its file stem), migrated to the current schema and checked first. Returns
        (name, path)."""
        src = Path(src)
        doc = _read_doc(src)
        migrate(doc, _where(src))
        meta = doc.get("profile")
        declared = _plain(meta.get("name")) if isinstance(meta, Mapping) else None
        target = name or (declared if isinstance(declared, str) and declared else src.stem)
        check_name(target)
        _validate(_unwrap(doc), src, target)
        dst = self.user_path(target)
        if dst.exists() and not overwrite:
            raise ProfileError(
                f"profile {target!r} already exists ({dst}); pass --name NEW or --force",
                field="profile name",
            )
        if isinstance(meta, MutableMapping):
            if "name" in meta:
                meta["name"] = target
        with _fs(dst):
            self._ensure_dir()
            atomic_write_text(dst, doc.as_string(), mode=FILE_MODE)
        return target, dst

    # ------------------------------------------------------------------ last use

    def _state_path(self) -> Path:
        return self.profiles_dir / STATE_FILE

    def _state(self) -> dict[str, datetime]:
        path = self._state_path()
        try:
            data = tomlkit.parse(path.read_text(encoding="utf-8")).unwrap()
        except (OSError, UnicodeDecodeError, TOMLKitError):
            return {}
        used = data.get("last_used", {})
        if not isinstance(used, dict):
            return {}
        return {k: v for k, v in used.items() if isinstance(v, datetime)}

    def mark_used(self, name: str, when: datetime | None = None) -> None:
        """Record that ``name`` was loaded or launched now. A user profile keeps it in its own
        ``[profile].last_used`` (comments untouched); a built-in in ``profiles/.state.toml``.
        Best effort: a broken or unwritable file is left as it is."""
        when = when or now_utc()
        try:
            if self.is_user(name):
                path = self.user_path(name)
                doc = _read_doc(path)
                if file_version(doc, _where(path)) != SCHEMA_VERSION:
                    return
                _validate(_unwrap(doc), path, name)  # never touch a broken file
                meta = doc.get("profile")
                if isinstance(meta, MutableMapping):
                    meta["last_used"] = when
                else:
                    _set_table(doc, "profile", {"last_used": when})
                atomic_write_text(path, doc.as_string(), mode=FILE_MODE)
            elif self.is_builtin(name):
                state = self._state()
                state[name] = when
                doc = tomlkit.document()
                doc.add(tomlkit.comment("When each built-in preset was last used (dtrain-tui)."))
                _set_table(doc, "last_used", dict(sorted(state.items())))
                self._ensure_dir()
                atomic_write_text(self._state_path(), doc.as_string(), mode=FILE_MODE)
        except (ProfileError, OSError):
            return


def _valid_name(stem: str) -> bool:
    try:
        check_name(stem)
    except ProfileError:
        return False
    return True


def _backup(path: Path, tag: int | str) -> Path:
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

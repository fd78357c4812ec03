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

import difflib
import os
import stat
from collections.abc import MutableMapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import ValidationError
from tomlkit.toml_document import TOMLDocument

from engine.errors import DtrainError, validation_messages
from engine.fsio import JSON_LIMIT, atomic_write_text, read_regular_text, sweep_stale_temps
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
from profiles.tomldoc import (
    FILE_MODE,
    backup,
    declared_name,
    fs_errors,
    new_doc,
    read_doc,
    render,
    set_profile_keys,
    unwrap,
    validate,
    where,
)
from profiles.usage import builtin_usage, mark_builtin, mark_user_profile

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
ENV_CONFIG_DIR = "DTRAIN_CONFIG_DIR"
DIR_MODE = 0o700


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
        doc = read_doc(path)
        version = migrate(doc, where(path))
        return validate(unwrap(doc), path, name), version

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
        doc = read_doc(path)
        version = file_version(doc, where(path))
        if version == SCHEMA_VERSION:
            return validate(unwrap(doc), path, name)
        migrate(doc, where(path))
        prof = validate(unwrap(doc), path, name)  # a broken old file stays untouched
        try:
            backup(path, version)
            atomic_write_text(path, doc.as_string(), mode=FILE_MODE)
        except OSError:
            # A read-only config dir: use the migrated profile in memory, leave the file be.
            pass
        return prof

    def text(self, name: str) -> str:
        """The file's text as stored (for ``profiles show`` and export)."""
        path = self.path_of(name)
        try:
            return read_regular_text(path, JSON_LIMIT, label="file", follow=True)
        except DtrainError as e:
            raise ProfileError(e.message, field=where(path)) from None
        except (OSError, UnicodeDecodeError) as e:
            raise ProfileError(f"cannot read: {e}", field=where(path)) from None

    # ------------------------------------------------------------------ writing

    def _ensure_dir(self) -> None:
        _ensure_private_dir(self.profiles_dir)

    def save(self, profile: Profile, *, name: str | None = None, overwrite: bool = True) -> Path:
        """Write ``profile`` as ``<profiles dir>/NAME.toml`` (NAME: ``name`` or the profile's).
        An existing file is edited in place so its comments survive; a new profile that shadows
        a built-in starts from the built-in's file (and its comments). Returns the path."""
        name = check_name(name or profile.profile.name)
        path = self.user_path(name)
        prof = _named_copy(profile, name)
        # Temp files of a save that was killed outright (SIGKILL) are no one's: clear them.
        sweep_stale_temps(self.profiles_dir)
        prof = _validated_whole(prof, name)
        builtin = self.builtin_path(name) if self.is_builtin(name) else None
        doc, old = _doc_to_edit(path, builtin, name, overwrite=overwrite)
        if old is not None and old.profile.created is not None and profile.profile.created is None:
            prof.profile.created = old.profile.created
        text = render(doc, prof, old, path, name)
        with fs_errors(path):
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
        with fs_errors(path):
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
        doc = read_doc(src)
        meta = doc.get("profile")
        set_profile_keys(doc, {"name": new}, only_present=isinstance(meta, MutableMapping))
        with fs_errors(dst):
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
            with fs_errors(dest):
                atomic_write_text(dest, text, mode=FILE_MODE)
        return text

    def import_file(
        self, src: Path, *, name: str | None = None, overwrite: bool = False
    ) -> tuple[str, Path]:
        """Copy a profile file into the store under ``name`` (default: its ``[profile].name``,
        else its file stem), migrated to the current schema and checked first. Returns
        (name, path)."""
        src = Path(src)
        doc = read_doc(src)
        migrate(doc, where(src))
        target = name or declared_name(doc) or src.stem
        check_name(target)
        validate(unwrap(doc), src, target)
        dst = self.user_path(target)
        if dst.exists() and not overwrite:
            raise ProfileError(
                f"profile {target!r} already exists ({dst}); pass --name NEW or --force",
                field="profile name",
            )
        set_profile_keys(doc, {"name": target}, only_present=True)
        with fs_errors(dst):
            self._ensure_dir()
            atomic_write_text(dst, doc.as_string(), mode=FILE_MODE)
        return target, dst

    # ------------------------------------------------------------------ last use

    def _state(self) -> dict[str, datetime]:
        return builtin_usage(self.profiles_dir)

    def mark_used(self, name: str, when: datetime | None = None) -> None:
        """Record that ``name`` was loaded or launched now (:mod:`profiles.usage`). Best
        effort: a broken or unwritable file is left as it is."""
        when = when or now_utc()
        try:
            if self.is_user(name):
                mark_user_profile(self.user_path(name), name, when)
            elif self.is_builtin(name):
                self._ensure_dir()
                mark_builtin(self.profiles_dir, name, when)
        except (ProfileError, OSError):
            return


def _named_copy(profile: Profile, name: str) -> Profile:
    """A copy of ``profile`` named ``name``, created now unless it says when; refused when it
    holds a secret."""
    prof = profile.model_copy(deep=True)
    prof.profile.name = name
    if prof.profile.created is None:
        prof.profile.created = now_utc()
    check_secrets(prof.model_dump(mode="json", exclude_none=True), where=f"profile {name!r}")
    return prof


def _validated_whole(prof: Profile, name: str) -> Profile:
    """``prof`` validated as a whole (model_copy skips it): catches a spec assembled field by
    field."""
    try:
        return Profile.model_validate(prof.model_dump())
    except ValidationError as e:
        raise ProfileError("; ".join(validation_messages(e)), field=f"profile {name!r}") from None


def _valid_name(stem: str) -> bool:
    try:
        check_name(stem)
    except ProfileError:
        return False
    return True


def _ensure_private_dir(path: Path) -> None:
    """Create the profiles dir (0700); tighten an existing one of ours to 0700. Never
    through a symlink: a profiles dir linked to a shared directory keeps that directory's
    mode (the files in it are 0600 all the same)."""
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return  # a symlink (ELOOP) or unreadable: leave its mode alone
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != DIR_MODE:
            os.fchmod(fd, DIR_MODE)
    finally:
        os.close(fd)


def _doc_to_edit(
    path: Path, builtin: Path | None, name: str, *, overwrite: bool
) -> tuple[TOMLDocument, Profile | None]:
    """The document a save of ``name`` edits in place, and the profile it meant before: the
    user's existing file (migrated, its original kept as a backup), else the built-in it
    shadows (``builtin``), else a new document. A broken existing file is kept as
    ``NAME.toml.broken.bak`` and a new document started."""
    if path.exists():
        if not overwrite:
            raise ProfileError(
                f"profile {name!r} already exists ({path}); choose another name or overwrite it",
                field="profile name",
            )
        try:
            doc = read_doc(path)
            start = migrate(doc, where(path))
            if start < SCHEMA_VERSION:  # keep the original, as load does
                with fs_errors(path):
                    backup(path, start)
            return doc, validate(unwrap(doc), path, name)
        except ProfileError:
            # The file is broken: keep it beside the new one rather than lose it.
            with fs_errors(path):
                backup(path, "broken")
    elif builtin is not None:
        try:
            doc = read_doc(builtin)
            migrate(doc, name)
            return doc, validate(unwrap(doc), builtin, name)
        except ProfileError:
            pass
    return new_doc(), None

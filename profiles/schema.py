"""The profile document: a named, versioned TOML file holding a whole :class:`~engine.plan.specs.Spec`
(model, hardware, network, training, forced layout, launch) plus a ``[profile]`` metadata table.

Used by :mod:`profiles.store` (which reads and writes the files) and by every surface that saves
or loads a set-up. A file on disk looks like::

    schema_version = 2

    [profile]
    name = "my-cluster"
    description = "4 nodes, 8xH100 each, InfiniBand"
    created = 2026-01-01T12:00:00Z
    last_used = 2026-01-02T09:30:00Z

    [model]
    preset = "llama-3-8b"

    [hardware]
    gpu = "h100-sxm"
    ...

The spec sections are exactly the Spec's, validated by the Spec's own models (unknown keys are
refused by name). This module also holds the schema migrations and the secret guard: a profile
never holds a password, a private key or a token, whatever key it hides under (the scanner is
:mod:`profiles.secrets`), nor a string over :data:`MAX_FIELD_BYTES`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, MutableMapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.errors import DtrainError
from engine.plan.specs import Spec
from profiles.secrets import find_secret as find_secret  # re-exported: the guard's callers
from profiles.secrets import is_secret_name as is_secret_name

SCHEMA_VERSION = 2
"""The version this dtrain-tui writes. 1: the 0.0.x pre-release layout (metadata at top level,
``launch.ssh_key``, ``network.ifname``); 2: metadata in ``[profile]``, keys named as in Spec."""

SPEC_SECTIONS = ("model", "hardware", "network", "training", "layout", "launch")

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class ProfileError(DtrainError):
    """A profile file or name is unusable; the message names the file (or name) and the fix."""


class SecretError(ProfileError):
    """A profile would hold a password, a private key or a token."""


def check_name(name: str) -> str:
    """Return ``name`` if it can be a profile file name, else raise :class:`ProfileError`."""
    if not isinstance(name, str) or not NAME_RE.match(name) or name.endswith((".toml", ".bak")):
        raise ProfileError(
            f"{name!r} is not a profile name; use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (no '/' or spaces)",
            field="profile name",
        )
    return name


def now_utc() -> datetime:
    """The timestamp profiles record: UTC, whole seconds (TOML keeps it exactly)."""
    return datetime.now(UTC).replace(microsecond=0)


class ProfileMeta(BaseModel):
    """The ``[profile]`` table: who this profile is, not what it plans."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: str = ""
    """Display name; the file name (``NAME.toml``) is authoritative when they differ."""
    description: str = ""
    """One line shown in the profile list."""
    created: datetime | None = None
    """When the profile was first saved (UTC)."""
    last_used: datetime | None = None
    """When the profile was last loaded into the wizard or launched (UTC)."""
    calibration: str = ""
    """Name of a saved calibration (``<config dir>/calibrations/NAME.json``, written by
    ``dtrain-tui calibrate --profile``) that plans from this profile use; empty: none."""

    @field_validator("description")
    @classmethod
    def _one_line(cls, v: str) -> str:
        return " ".join(v.split())


class Profile(Spec):
    """A saved set-up: the Spec's six sections plus ``schema_version`` and ``[profile]``."""

    schema_version: int = Field(default=SCHEMA_VERSION, ge=1)
    """Version of the file layout; older files are migrated on load, newer ones refused."""
    profile: ProfileMeta = Field(default_factory=ProfileMeta)

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def spec(self) -> Spec:
        """The plain Spec (what the planner, writers and launch take)."""
        return Spec.model_validate(self.model_dump(include=set(SPEC_SECTIONS)))

    @classmethod
    def from_spec(cls, name: str, spec: Spec, *, description: str = "") -> Profile:
        """A new profile holding ``spec``; raises :class:`SecretError` if the spec holds one."""
        check_name(name)
        check_secrets(spec.model_dump(mode="json", exclude_none=True), where=f"profile {name!r}")
        data = spec.model_dump(include=set(SPEC_SECTIONS))
        return cls.model_validate(
            {**data, "profile": {"name": name, "description": description, "created": now_utc()}}
        )

    def model_summary(self) -> str:
        """Short text for the list's model column."""
        m = self.model
        if m.config_path:
            return m.config_path.name if m.config_path.name != "config.json" else str(m.config_path)
        if m.preset:
            return m.preset
        if m.layers and m.hidden:
            return f"custom {m.layers}L×{m.hidden}"
        if m.params:
            return f"{m.params / 1e9:g}B params"
        return "— (any model)"

    def cluster_summary(self) -> str:
        """Short text for the list's cluster column, e.g. ``4×8 h100-sxm · ib · ssh``."""
        h = self.hardware
        parts = [f"{h.nodes}×{h.gpus_per_node} {h.gpu}"]
        if h.nodes > 1:
            parts.append(self.network.tier.value)
        parts.append(self.launch.backend.value)
        return " · ".join(parts)


# --------------------------------------------------------------------------- migrations


def _migrate_1_to_2(doc: MutableMapping[str, Any]) -> None:
    """v1 kept metadata at top level and used ``launch.ssh_key`` / ``network.ifname``."""
    import tomlkit

    meta_keys = [k for k in ("name", "description", "created", "last_used") if k in doc]
    if meta_keys:
        meta = doc.get("profile")
        if meta is None:
            meta = tomlkit.table()
        for k in meta_keys:
            meta[k] = doc.pop(k)
        doc["profile"] = meta
    renames = (("launch", "ssh_key", "identity_file"), ("network", "ifname", "socket_ifname"))
    for section, old, new in renames:
        tbl = doc.get(section)
        if isinstance(tbl, MutableMapping) and old in tbl:
            tbl[new] = tbl.pop(old)


MIGRATIONS: dict[int, Callable[[MutableMapping[str, Any]], None]] = {1: _migrate_1_to_2}
"""from-version -> in-place migration of the TOML document to from-version + 1."""


def file_version(doc: Mapping[str, Any], where: str) -> int:
    """The document's schema version (a file without one is taken as current: hand-written)."""
    v = doc.get("schema_version", SCHEMA_VERSION)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ProfileError(
            f"schema_version must be a whole number such as {SCHEMA_VERSION}, got {v!r}",
            field=where,
        )
    if v > SCHEMA_VERSION:
        raise ProfileError(
            f"schema_version {v} was written by a newer dtrain-tui (this one reads up to "
            f"{SCHEMA_VERSION}); upgrade dtrain-tui to use it",
            field=where,
        )
    return v


def migrate(doc: MutableMapping[str, Any], where: str) -> int:
    """Bring ``doc`` (a tomlkit document, edited in place so comments survive) to the current
    schema. Returns the version it was at before."""
    start = file_version(doc, where)
    v = start
    while v < SCHEMA_VERSION:
        MIGRATIONS[v](doc)
        v += 1
    if start != SCHEMA_VERSION:
        doc["schema_version"] = SCHEMA_VERSION
    return start


# --------------------------------------------------------------------------- secrets

MAX_FIELD_BYTES = 64 * 1024
"""The most one string in a profile may hold (64 KiB of UTF-8; keys too). Profiles are small
set-ups: the longest real field, a ``launch.remote_setup`` script, is a few KB; anything longer
belongs in a file on the nodes that ``remote_setup`` sources."""

_FIX = (
    "a profile never stores passwords, private keys or tokens: remove it and set it on the "
    "nodes instead (e.g. a file sourced by launch.remote_setup); name key files by path "
    "(launch.identity_file)"
)


def _oversized(data: Any, path: str) -> tuple[str, int] | None:
    """The first (dotted path, bytes) of a key or string in ``data`` over MAX_FIELD_BYTES."""
    if isinstance(data, Mapping):
        for k, v in data.items():
            sub = f"{path}.{k}" if path else str(k)
            if isinstance(k, str) and len(k) * 4 > MAX_FIELD_BYTES:
                size = len(k.encode("utf-8", "surrogatepass"))
                if size > MAX_FIELD_BYTES:
                    return f"{path or 'the top level'} (a key)", size
            found = _oversized(v, sub)
            if found:
                return found
        return None
    if isinstance(data, list | tuple):
        for i, v in enumerate(data):
            found = _oversized(v, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(data, str) and len(data) * 4 > MAX_FIELD_BYTES:
        size = len(data.encode("utf-8", "surrogatepass"))
        if size > MAX_FIELD_BYTES:
            return path, size
    return None


def check_secrets(data: Mapping[str, Any], *, where: str) -> None:
    """Raise :class:`ProfileError` naming the field if a string in ``data`` is over
    :data:`MAX_FIELD_BYTES`, and :class:`SecretError` naming it if ``data`` holds a secret."""
    big = _oversized(data, "")
    if big:
        path, size = big
        raise ProfileError(
            f"{where}: {path} is {size:,} bytes; a profile field holds at most "
            f"{MAX_FIELD_BYTES:,} bytes ({MAX_FIELD_BYTES // 1024} KiB): keep long text in a file "
            "on the nodes (a script launch.remote_setup runs) and shorten the field",
            field="",
        )
    found = find_secret(data)
    if found:
        path, what = found
        raise SecretError(f"{where}: {path} looks like {what}; {_FIX}", field="")

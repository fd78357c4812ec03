"""The profile document: a named, versioned TOML file holding a whole :class:`~engine.specs.Spec`
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
never holds a password, a private key or a token, whatever key it hides under.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.errors import DtrainError
from engine.specs import Spec

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

# Key (or flag) words that name a secret. Matched against whole words of a key split on
# '_', '-' and '.', so ``training.tokens`` (a token budget) and ``NCCL_IB_PKEY`` are fine.
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "pwd",
        "token",
        "secret",
        "secrets",
        "apikey",
        "credential",
        "credentials",
        "privatekey",
    }
)
_SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key"), ("auth", "key")})
# An environment variable *naming* a key file is fine: SSH_KEY_PATH, GOOGLE_..._FILE.
_PATH_SUFFIXES = ("path", "file", "dir", "filename")

_VALUE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----"), "private key material"),
    (re.compile(r"PuTTY-User-Key-File"), "private key material"),
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"), "a Hugging Face token"),
    (
        re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})\b"),
        "a GitHub token",
    ),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{20,}\b"), "an API key"),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "an AWS access key"),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b"), "a Slack token"),
    (re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@"), "a password inside a URL"),
)
# ``export HF_TOKEN=abc`` or ``WANDB_API_KEY=...`` inside a shell command (remote_setup).
_ASSIGN_RE = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(['\"]?)([^\s'\"]+)")

_FIX = (
    "a profile never stores passwords, private keys or tokens: remove it and set it on the "
    "nodes instead (e.g. a file sourced by launch.remote_setup); name key files by path "
    "(launch.identity_file)"
)


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[_\-.\s]+", name.lower()) if w]


def is_secret_name(name: str, *, env: bool = False) -> bool:
    """True when a key, flag or environment variable name says it holds a secret.
    For environment names, a bare ``KEY`` word counts too (``WANDB_API_KEY``, ``SSH_KEY``) unless
    the name says it is a path (``SSH_KEY_PATH``)."""
    words = _words(name.lstrip("-"))
    if not words:
        return False
    if words[-1] in _PATH_SUFFIXES:
        return False
    if any(w in _SECRET_WORDS for w in words):
        return True
    if any(pair in _SECRET_PAIRS for pair in zip(words, words[1:], strict=False)):
        return True
    return env and "key" in words


def _is_reference(value: str) -> bool:
    """``$HF_TOKEN``, ``${X}`` or ``$(cat file)``: the value is looked up on the node."""
    return value.startswith("$")


def _walk(data: Any, path: str) -> Iterator[tuple[str, str | None, Any]]:
    """Yield (dotted path, key or None, value) for every leaf and key in ``data``."""
    if isinstance(data, Mapping):
        for k, v in data.items():
            sub = f"{path}.{k}" if path else str(k)
            yield sub, str(k), v
            yield from _walk(v, sub)
    elif isinstance(data, list | tuple):
        for i, v in enumerate(data):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, None, data


def find_secret(data: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first (dotted path, what) in ``data`` that looks like a secret, or None."""
    launch = data.get("launch")
    args = launch.get("script_args") if isinstance(launch, Mapping) else None
    if isinstance(args, list):
        for i, arg in enumerate(args):
            if not isinstance(arg, str) or not arg.startswith("-"):
                continue
            flag, eq, val = arg.partition("=")
            has_value = bool(eq and val) or (
                i + 1 < len(args) and not str(args[i + 1]).startswith("-")
            )
            value = val if eq else (str(args[i + 1]) if i + 1 < len(args) else "")
            if is_secret_name(flag) and has_value and not _is_reference(value):
                return f"launch.script_args[{i}]", f"a secret passed as {flag}"
    for path, key, value in _walk(data, ""):
        if key is not None:
            in_env = path.startswith("launch.env.")
            if in_env and is_secret_name(key, env=True):
                if isinstance(value, str) and value and not _is_reference(value):
                    return path, "a secret-named environment variable with a value"
            elif not in_env and is_secret_name(key):
                return path, "a secret-named key"
            continue
        if not isinstance(value, str):
            continue
        for pattern, what in _VALUE_PATTERNS:
            if pattern.search(value):
                return path, what
        for m in _ASSIGN_RE.finditer(value):
            if is_secret_name(m.group(1), env=True) and not _is_reference(m.group(3)):
                return path, f"a secret assigned to {m.group(1)}"
    return None


def check_secrets(data: Mapping[str, Any], *, where: str) -> None:
    """Raise :class:`SecretError` naming the field if ``data`` holds a secret."""
    found = find_secret(data)
    if found:
        path, what = found
        raise SecretError(f"{where}: {path} looks like {what}; {_FIX}", field="")

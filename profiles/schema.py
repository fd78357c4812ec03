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
never holds a password, a private key or a token, whatever key it hides under.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.errors import DtrainError
from engine.plan.specs import Spec

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
#
# Three nets: names (a key, flag or environment variable that says it holds a secret), value
# shapes (a token format, key material, a password in a URL, whatever the name) and shell text
# (flags and assignments inside ``launch.remote_setup``). A value that is a path or a reference
# (``$VAR``) is never a secret: a profile names key files, it just never holds what is in them.

# Whole words of a name (split on '_', '-', '.', spaces and camelCase) that say "secret".
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "pass",
        "pwd",
        "pw",
        "pat",
        "token",
        "secret",
        "secrets",
        "apikey",
        "credential",
        "credentials",
        "privatekey",
        "accesstoken",
        "authtoken",
        "accesskey",
        "secretkey",
    }
)
# Inside a word too: PGPASSWORD, MYSQLPASSWD, NGROK_AUTHTOKEN, AZURECLIENTSECRET.
_SECRET_PARTS = ("password", "passwd", "passphrase", "secret", "apikey", "authtoken", "accesstoken")
_SECRET_PAIRS = frozenset(
    {("api", "key"), ("private", "key"), ("access", "key"), ("auth", "key"), ("secret", "key")}
)
# A name that says it holds where the secret is, or how much of something, is fine:
# SSH_KEY_PATH, GOOGLE_..._FILE, --password-stdin, --secret-name, --token-budget, --max-tokens.
_PATH_SUFFIXES = ("path", "file", "dir", "filename", "stdin", "name", "id", "arn", "url", "env")
_QUANTITY_WORDS = frozenset(
    {
        "budget",
        "count",
        "limit",
        "len",
        "length",
        "size",
        "num",
        "max",
        "min",
        "rate",
        "per",
        "ids",
        "type",
        "through",
        "level",
        "parallelism",
    }
)
# A flag ending in "key" (--wandb-key, --license-key) holds a secret when its value looks like
# one: long and made of token characters (--sort-key loss does not).
_CREDENTIAL_SHAPE = re.compile(r"^[A-Za-z0-9_\-+/=.~]{16,}$")
_PATH_SHAPE = re.compile(
    r"^(?:~|\.{1,2}/|/)\S*$"  # /abs, ~/x, ./x, ../x
    r"|^[\w.\-/]*/[\w.\-]+\.(?:json|pem|key|crt|p12|pfx|gpg|asc|txt|env|toml|ya?ml|ini|cfg)$"
)

_VALUE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----"), "private key material"),
    (re.compile(r"PuTTY-User-Key-File"), "private key material"),
    # The body of a key without its header: openssh-key-v1, or DER (PKCS#1/#8) in base64.
    (re.compile(r"b3BlbnNzaC1rZXktdjE"), "private key material"),
    (re.compile(r"\bMII[A-Za-z0-9+/]{40,}"), "private key material"),
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"), "a Hugging Face token"),
    (
        re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})\b"),
        "a GitHub token",
    ),
    (re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"), "a GitLab token"),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{30,}"), "a Google API key"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"), "a JWT"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{20,}\b"), "an API key"),
    (re.compile(r"\b[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"), "a Stripe key"),
    (re.compile(r"\bnpm_[A-Za-z0-9]{36}\b"), "an npm token"),
    (re.compile(r"\bpypi-AgE[A-Za-z0-9_-]{40,}"), "a PyPI token"),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "an AWS access key"),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b"), "a Slack token"),
    (re.compile(r"hooks\.slack\.com/services/[A-Za-z0-9/]+"), "a Slack webhook"),
    (re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@"), "a password inside a URL"),
    (
        re.compile(r"(?i)\bauthorization:\s*(?:bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{8,}"),
        "an Authorization header",
    ),
    (re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/-]{16,}"), "a bearer token"),
    (re.compile(r"(?i)\bmachine\s+\S+\s+login\s+\S+\s+password\s+\S+"), "a .netrc password"),
)
# ``export HF_TOKEN=abc``, ``WANDB_API_KEY=...`` or ``?access_token=...`` inside text.
_ASSIGN_RE = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(['\"]?)([^\s'\"&;|]+)")
# Commands whose ``-p`` is a password (``sshpass -p X``, ``mysql -pX``, ``docker login -p X``).
_P_IS_PASSWORD = frozenset({"sshpass", "mysql", "mysqldump", "mysqladmin", "docker", "podman"})
# Commands that take a secret as their argument (``wandb login KEY``).
_LOGIN_COMMANDS = frozenset({"wandb"})
_SHELL_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", "\n"})
# ``curl -u user:password``.
_CURL_USER = re.compile(r"\bcurl\b[^;&|\n]*\s(?:-u|--user)[\s=]+['\"]?[^\s:'\"]+:[^\s'\"$]+")

_FIX = (
    "a profile never stores passwords, private keys or tokens: remove it and set it on the "
    "nodes instead (e.g. a file sourced by launch.remote_setup); name key files by path "
    "(launch.identity_file)"
)


def _words(name: str) -> list[str]:
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)  # accessToken -> access_Token
    return [w for w in re.split(r"[_\-.\s]+", name.lower()) if w]


def is_secret_name(name: str, *, env: bool = False) -> bool:
    """True when a key, flag or environment variable name says it holds a secret.
    For environment names, a bare ``KEY`` word counts too (``WANDB_API_KEY``, ``SSH_KEY``) unless
    the name says it is a path (``SSH_KEY_PATH``) or a quantity (``--token-budget``)."""
    words = _words(name.lstrip("-"))
    if not words:
        return False
    if words[-1] in _PATH_SUFFIXES or any(w in _QUANTITY_WORDS for w in words):
        return False
    if any(w in _SECRET_WORDS for w in words):
        return True
    if any(part in w for w in words for part in _SECRET_PARTS):
        return True
    if any(pair in _SECRET_PAIRS for pair in zip(words, words[1:], strict=False)):
        return True
    return env and "key" in words


def _is_reference(value: str) -> bool:
    """``$HF_TOKEN``, ``${X}`` or ``$(cat file)``: the value is looked up on the node."""
    return value.startswith("$")


def _is_path(value: str) -> bool:
    """``/abs``, ``~/x``, ``./x`` or ``dir/name.json``: where a secret lives, not the secret."""
    return _PATH_SHAPE.match(value) is not None


def _flag_holds_secret(flag: str, value: str, *, shell_command: str = "") -> bool:
    """Whether ``flag`` given ``value`` passes a secret. ``shell_command``: the command the flag
    belongs to, in shell text (decides what ``-p`` means)."""
    if not value or _is_reference(value) or _is_path(value):
        return False
    if is_secret_name(flag):
        return True
    words = _words(flag.lstrip("-"))
    if words and words[-1] == "key" and _CREDENTIAL_SHAPE.match(value):
        return True
    if flag == "-p":  # mysql / sshpass / docker style; a port (-p 8080) is a number
        return shell_command in _P_IS_PASSWORD if shell_command else not value.isdigit()
    return False


def _args_secret(args: list[str], *, shell: bool = False) -> tuple[int, str] | None:
    """The first (index, flag) in ``args`` that passes a secret."""
    command = ""
    command_args = 0
    for i, arg in enumerate(args):
        if shell and arg in _SHELL_SEPARATORS:
            command, command_args = "", 0
            continue
        if shell and not command and not _ASSIGN_RE.match(arg):
            command = arg.rsplit("/", 1)[-1]
            command_args = 0
            continue
        command_args += 1
        if not arg.startswith("-") or arg == "-":
            if (
                shell
                and command in _LOGIN_COMMANDS
                and i > 0
                and args[i - 1] == "login"
                and not _is_reference(arg)
            ):
                return i, f"{command} login"
            continue
        if shell and command in _P_IS_PASSWORD and arg.startswith("-p") and len(arg) > 2:
            if not arg.startswith("--") and not _is_reference(arg[2:]):
                return i, "-p"  # mysql -pSECRET
        flag, eq, val = arg.partition("=")
        if not eq:
            nxt = args[i + 1] if i + 1 < len(args) else ""
            val = "" if nxt.startswith("-") or (shell and nxt in _SHELL_SEPARATORS) else nxt
        if _flag_holds_secret(flag, val, shell_command=command if shell else ""):
            return i, flag
    return None


def _shell_words(text: str) -> list[str]:
    """``text`` split as a shell would (quotes, ``;``, ``&&``, ``|``); a text no shell could
    parse is split on white space."""
    import shlex

    lex = shlex.shlex(text, posix=True, punctuation_chars=";&|()\n")
    lex.whitespace_split = True
    lex.whitespace = " \t\r"
    lex.commenters = ""
    try:
        return list(lex)
    except ValueError:
        return text.split()


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


def _text_secret(value: str, *, shell: bool) -> str | None:
    """What secret ``value`` holds (a known shape, an assignment, a flag in shell text)."""
    for pattern, what in _VALUE_PATTERNS:
        if pattern.search(value):
            return what
    for m in _ASSIGN_RE.finditer(value):
        if is_secret_name(m.group(1), env=True) and not (
            _is_reference(m.group(3)) or _is_path(m.group(3))
        ):
            return f"a secret assigned to {m.group(1)}"
    if shell:
        if _CURL_USER.search(value):
            return "a password passed to curl -u"
        found = _args_secret(_shell_words(value), shell=True)
        if found:
            return f"a secret passed as {found[1]}"
    return None


def find_secret(data: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first (dotted path, what) in ``data`` that looks like a secret, or None."""
    launch = data.get("launch")
    args = launch.get("script_args") if isinstance(launch, Mapping) else None
    if isinstance(args, list):
        found = _args_secret([str(a) for a in args])
        if found:
            return f"launch.script_args[{found[0]}]", f"a secret passed as {found[1]}"
    for path, key, value in _walk(data, ""):
        if key is not None:
            in_env = path.startswith("launch.env.")
            if in_env and is_secret_name(key, env=True):
                if (
                    isinstance(value, str)
                    and value
                    and not _is_reference(value)
                    and not _is_path(value)
                ):
                    return path, "a secret-named environment variable with a value"
            elif not in_env and is_secret_name(key):
                return path, "a secret-named key"
            continue
        if not isinstance(value, str):
            continue
        what = _text_secret(value, shell=path == "launch.remote_setup")
        if what:
            return path, what
    return None


def check_secrets(data: Mapping[str, Any], *, where: str) -> None:
    """Raise :class:`SecretError` naming the field if ``data`` holds a secret."""
    found = find_secret(data)
    if found:
        path, what = found
        raise SecretError(f"{where}: {path} looks like {what}; {_FIX}", field="")

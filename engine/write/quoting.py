"""The one way each written format carries a value: a shell word, an environment variable name,
a YAML scalar, a JSON document, and the text of a comment. Every writer (and the SSH wrapper's
export line) goes through these, so what a spec, a profile or a model's ``config.json`` holds
reaches bash, PyYAML / SkyPilot and JSON readers as exactly the value meant, never as code or
as another key.

Each rule is an explicit character set matched whole (``fullmatch``): ``$`` in a ``match`` also
matches before a final newline, which is how ``"reboot\\n"`` once passed as a variable name.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

import yaml

from engine.errors import DtrainError
from engine.plan.specs import ENV_NAME_RE, is_env_name

__all__ = [
    "ENV_NAME_RE",
    "comment_text",
    "env_line",
    "env_name",
    "is_env_name",
    "json_text",
    "plain_word",
    "shell_line",
    "shell_word",
    "yaml_plain_safe",
    "yaml_scalar",
]

SHELL_LINE_BREAKS = ("\n", "\r", "\0")
"""What a one-line shell value may not hold: bash ends a line at ``\\n``, a ``\\r`` hides what
follows on a terminal, and no argument or environment value can carry a NUL."""

_PLAIN_WORD_RE = re.compile(r"[A-Za-z0-9_.@:\[\]\-]+")


def shell_word(value: object) -> str:
    """``value`` as one bash word that reaches the program literally (single-quoted where
    needed: inside ``'...'`` bash expands nothing, and every character but NUL is itself)."""
    text = str(value)
    if "\0" in text:
        raise DtrainError(f"{text!r} contains a NUL, which no shell word can carry", field="shell")
    return shlex.quote(text)


def shell_line(value: str, field: str) -> str:
    """``value`` when it fits on one line of a script (no newline, carriage return or NUL),
    else a one-line error naming ``field``. For what is then quoted with :func:`shell_word`, and
    for ``remote_setup``, a command by design, written verbatim."""
    if any(c in value for c in SHELL_LINE_BREAKS):
        raise DtrainError(
            f"{value!r} contains a newline, carriage return or NUL; pass a single-line value",
            field=field,
        )
    return value


def env_name(name: str, field: str = "launch.env") -> str:
    """``name`` when it is an environment variable name (:data:`ENV_NAME_RE`: ASCII letters,
    digits and ``_``, not starting with a digit), else a one-line error naming ``field``."""
    if not is_env_name(name):
        raise DtrainError(
            f"{name!r} is not an environment variable name; use A-Z, a-z, 0-9 and _ "
            "(not starting with a digit)",
            field=field,
        )
    return name


def env_line(name: str, value: str, field: str = "launch.env") -> str:
    """``NAME='value'``: one assignment a sourcing shell reads as exactly that variable."""
    return f"{env_name(name, field)}={shell_word(value)}"


def comment_text(text: str) -> str:
    """``text`` safe inside a ``#`` comment of bash or YAML (and on one line of Markdown): every
    character that is not printable (controls; ``\\x85``, U+2028 and U+2029, which YAML reads
    as line breaks; format characters such as U+FEFF) becomes a space. Same length as ``text``."""
    return "".join(c if c.isprintable() else " " for c in text)


def plain_word(value: str, field: str) -> str:
    """``value`` when it is a plain word for a line-based file (a hostfile's host name):
    ASCII letters, digits and ``_ . @ : [ ] -``, not starting with ``-``."""
    if not _PLAIN_WORD_RE.fullmatch(value) or value.startswith("-"):
        raise DtrainError(
            f"{value!r}: use letters, digits and _ . @ : [ ] - only (not starting with -)",
            field=field,
        )
    return value


def yaml_plain_safe(text: str) -> bool:
    """True when every character of ``text`` is printable or ``\\n``: what PyYAML may write
    plainly, single-quoted or as a ``|`` block and read back unchanged. Others (``\\r``, ``\\x85``,
    U+2028, U+2029, controls) are written double-quoted, where PyYAML escapes them."""
    return all(c.isprintable() or c == "\n" for c in text)


def yaml_scalar(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    """The YAML node for a string: a literal block (``run: |``) for a multi-line value, the
    plain style PyYAML picks for an ordinary one, double-quoted (escaped) for anything else."""
    if not yaml_plain_safe(value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


def json_text(data: Any, *, allow_nan: bool = True) -> str:
    """``data`` as indented JSON (ASCII only: every other character escaped), newline-ended."""
    return json.dumps(data, indent=2, ensure_ascii=True, allow_nan=allow_nan) + "\n"

"""Errors a person can act on. Every surface (CLI, wizard, profiles) prints these as one line:
``<field>: <what is wrong>; <what to pass instead>`` — never a traceback."""

from __future__ import annotations

from pydantic import ValidationError


class DtrainError(Exception):
    """A user-facing error. ``field`` names the spec field or file concerned (may be empty)."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field
        self.message = message

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class SpecError(DtrainError):
    """The spec is invalid or inconsistent (bad value, unknown key, impossible layout)."""


def validation_messages(exc: ValidationError, prefix: str = "") -> list[str]:
    """Turn a pydantic error into one line per problem, each naming the dotted field path."""
    out: list[str] = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__")
        if prefix:
            loc = f"{prefix}.{loc}" if loc else prefix
        msg = str(err.get("msg", "invalid"))
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if err.get("type") == "finite_number":
            msg = "must be a finite number (not nan or inf)"
        if err.get("type") == "extra_forbidden":
            msg = "unknown key (check its spelling; `dtrain-tui plan --help` lists the keys)"
        # A model-level validator already names its field: don't repeat the section.
        if loc and not msg.startswith(loc.split(".")[0] + "."):
            out.append(f"{loc}: {msg}")
        else:
            out.append(msg)
    return out


def one_line(exc: BaseException, prefix: str = "") -> str:
    """The single line a CLI prints for ``exc``: its message, else (one raised without a
    message, such as a bare ``KeyError()``) the name of its type, so the line is never empty."""
    if isinstance(exc, ValidationError):
        text = "; ".join(validation_messages(exc, prefix))
    else:
        text = str(exc)
    return text or type(exc).__name__

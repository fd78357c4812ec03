"""Number formatting shared by the wizard's widgets (plain functions, no Textual)."""

from __future__ import annotations

import re

GIB = 1024**3


def gb(n_bytes: float) -> str:
    """Bytes as GB with one decimal (binary GiB, as nvidia-smi and torch report memory)."""
    return f"{n_bytes / GIB:.1f} GB"


def count(n: float) -> str:
    """A parameter or token count: 8.03 B, 350 M, 12.5 K."""
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n:.0f}"


def seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.0f} ms"
    if s < 120:
        return f"{s:.2f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def money(x: float | None) -> str:
    if x is None:
        return "—"
    if x >= 1e6:
        return f"${x / 1e6:.2f} M"
    if x >= 1e4:
        return f"${x / 1e3:.1f} K"
    return f"${x:,.2f}"


def hours(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{count(x)} h" if x >= 1e3 else f"{x:.1f} h"


_CLI_BATCH = re.compile(
    r"; pass --global-batch \d+, or --global-batch-nearest to train the nearest$"
)


def wizard_words(message: str) -> str:
    """An engine refusal as the wizard says it: the command line's advice (``pass
    --global-batch 8, or --global-batch-nearest ...``) becomes where to pick it in the wizard."""
    return _CLI_BATCH.sub("; pick one at Global batch in the Training step", message)

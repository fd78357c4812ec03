"""Number formatting shared by the wizard's widgets (plain functions, no Textual)."""

from __future__ import annotations

import re

GIB = 1024**3
MIB = 1024**2


def gb(n_bytes: float) -> str:
    """Bytes as GB with one decimal (binary GiB, as nvidia-smi and torch report memory)."""
    return f"{n_bytes / GIB:.1f} GB"


def size(n_bytes: float) -> str:
    """Bytes in GiB with one decimal, or in MiB below 1 GiB, so a small model's memory reads
    ``79.0 MiB``, never ``0.0 GiB`` (binary units, as nvidia-smi and torch count memory)."""
    if abs(n_bytes) >= GIB:
        return f"{n_bytes / GIB:.1f} GiB"
    return f"{n_bytes / MIB:.1f} MiB"


def step_time(s: float) -> str:
    """A step time, one rule everywhere: ``84 ms/step`` below a second, ``57.1 s/step`` (three
    significant digits) below 100 s, ``2.0 min/step`` above."""
    return f"{duration(s)}/step"


def duration(s: float) -> str:
    """A short time as :func:`step_time` writes it, without ``/step``."""
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    if s < 100:
        return f"{s:.3g} s"
    return f"{s / 60:.1f} min"


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``1 line``, ``3 lines``, ``2 matches``: a count with its noun agreed (thousands
    separated)."""
    if n == 1:
        return f"1 {noun}"
    if many is None:
        many = noun + "es" if noun.endswith(("s", "x", "ch", "sh")) else noun + "s"
    return f"{n:,} {many}"


def count(n: float) -> str:
    """A parameter or token count: 8.03 B, 350 M, 12.5 K."""
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n:.0f}"


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

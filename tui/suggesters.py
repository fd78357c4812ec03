"""Input completions: file-system paths (for ``config.json``) and fixed word lists (GPU keys).
Accept a suggestion with → or End, as in a shell."""

from __future__ import annotations

import os
from pathlib import Path

from textual.suggester import Suggester


class PathSuggester(Suggester):
    """Completes the last path component from the directory listing; directories end in ``/``."""

    def __init__(self) -> None:
        super().__init__(use_cache=False, case_sensitive=True)

    async def get_suggestion(self, value: str) -> str | None:
        return complete_path(value)


def complete_path(value: str) -> str | None:
    if not value or "\0" in value or len(value) > 1024:
        return None
    expanded = os.path.expanduser(value)
    head, _, tail = expanded.rpartition("/")
    directory = Path(head or ("/" if expanded.startswith("/") else "."))
    try:
        names = sorted(os.listdir(directory))
    except (OSError, ValueError):
        return None
    for name in names:
        if (
            name.startswith(tail)
            and name != tail
            and (tail.startswith(".") or not name.startswith("."))
        ):
            suffix = name[len(tail) :]
            if (directory / name).is_dir():
                suffix += "/"
            return value + suffix
    if tail and (directory / tail).is_dir() and not value.endswith("/"):
        return value + "/"
    return None


class WordSuggester(Suggester):
    """Completes from a fixed list, case-insensitively."""

    def __init__(self, words: list[str]) -> None:
        super().__init__(use_cache=True, case_sensitive=False)
        self.words = words

    async def get_suggestion(self, value: str) -> str | None:
        low = value.lower()
        for w in self.words:
            if low and w.lower().startswith(low) and w.lower() != low:
                return value + w[len(value) :]
        return None

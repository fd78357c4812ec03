"""Help text from a module docstring: the docstring is written for Python readers (``code``,
:func:`x`), ``--help`` is read in a terminal. :func:`plain` drops the markup; used by the
subcommands whose description is their module's docstring. Standard library only (``--help``
starts fast)."""

from __future__ import annotations

import re
import textwrap

WIDTH = 79
"""Paragraphs are refilled to this width: dropping markup leaves the docstring's lines ragged."""

_ROLE_ALONE = re.compile(r"\s*\(:[a-z]+:`[^`]+`\)")
"""A parenthesis holding only a reference to code (``(:func:`a.b`)``): nothing for a user."""
_ROLE = re.compile(r":[a-z]+:`~?(?:[\w.]*\.)?([^`.]+)`")
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)


def plain(doc: str | None) -> str:
    """``doc`` without reStructuredText markup, its paragraphs refilled to :data:`WIDTH`."""
    text = _ROLE_ALONE.sub("", doc or "")
    text = _ROLE.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip())]
    return "\n\n".join(textwrap.fill(p, WIDTH) for p in paragraphs if p)

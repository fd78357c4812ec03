"""Make untrusted text safe to put on a terminal: what ranks print, and what ``run.json`` says.

A rank's output can hold any bytes: colours, title changes, clear-screen, OSC 52 clipboard
writes, cursor moves. The log files on disk keep them byte for byte; every path from those
files to a screen (``monitor --follow``, ``launch``'s printing, the monitor's panes) passes the
text through :func:`safe_text` or :func:`safe_lines`, which remove every escape sequence (CSI,
OSC, DCS, SOS, PM, APC, any other ESC sequence, and their 8-bit C1 forms) and every C0/C1
control character except tab (and newline in :func:`safe_text`).

Fast on the common case: a batch is joined and checked in one pass at C speed (its bytes through
``bytes.translate``, about 35 ns a line; a regular expression search costs some 200); a batch
without a control character comes back as it was (the same object). Only a dirty batch pays for
the substitution.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# C0 controls but tab and newline, DEL, C1 controls.
_CONTROL = "\x00-\x08\x0b-\x1f\x7f-\x9f"

# A string-type sequence (OSC, DCS, SOS, PM, APC) runs to its terminator (BEL, ST as ESC \ or
# the 8-bit ST) or, cut or malicious, to the end of the line: never past a newline, so a batch
# joined with newlines keeps its line count.
_STRING_BODY = r"[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"
_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI (colours, cursor moves, clear screen)
    rf"|\x1b[\]PX^_]{_STRING_BODY}"  # OSC (title, clipboard, hyperlinks), DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]?"  # any other ESC sequence (charset, reset), or a lone ESC
    r"|\x9b[0-?]*[ -/]*[@-~]?"  # 8-bit CSI
    rf"|[\x90\x98\x9d\x9e\x9f]{_STRING_BODY}"  # 8-bit DCS, SOS, OSC, PM, APC
    f"|[{_CONTROL}]"  # any other control character
)


_ASCII_OK = bytes(range(0x20, 0x7F)) + b"\t\n"
"""Bytes deleted by the precheck: what is left of an ASCII text is its control characters."""
_UTF8_OK = _ASCII_OK + bytes(range(0x80, 0x100))
_C1_UTF8 = re.compile(rb"\xc2[\x80-\x9f]")
"""A C1 control (U+0080-U+009F) in UTF-8; its literal lead byte makes the search fast."""


def has_control(text: str) -> bool:
    """Whether ``text`` holds a control character other than tab and newline."""
    if text.isascii():
        return bool(text.encode("ascii").translate(None, _ASCII_OK))
    data = text.encode("utf-8", "surrogatepass")
    if data.translate(None, _UTF8_OK):
        return True  # a C0 control or DEL
    return _C1_UTF8.search(data) is not None


def safe_text(text: str) -> str:
    """``text`` without escape sequences or control characters (tab and newline are kept).
    Returns ``text`` itself when there is nothing to remove."""
    if not has_control(text):
        return text
    return _SEQUENCE.sub("", text)


def safe_line(text: str) -> str:
    """One line for a screen: :func:`safe_text`, and a newline becomes a space."""
    text = safe_text(text)
    return text.replace("\n", " ") if "\n" in text else text


def safe_lines(lines: Sequence[str]) -> Sequence[str]:
    """Every line of a batch made safe; the batch itself (same object) when all are clean.
    One search over the joined batch decides, so a clean batch costs one pass over its bytes."""
    if not lines:
        return lines
    joined = "\n".join(lines)
    if not has_control(joined):
        return lines
    out = _SEQUENCE.sub("", joined).split("\n")
    if len(out) != len(lines):  # a line held a newline of its own: keep one row per line
        return [safe_line(x) for x in lines]
    return out

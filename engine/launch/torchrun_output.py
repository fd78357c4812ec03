"""What torchrun prints, parsed: which rank a line is from, and how the ranks of a node ended.

Called by the launch backends' stream readers (:mod:`engine.launch.pump`) and by the SkyPilot
backend, whose lines carry SkyPilot's node prefix before torchrun's. Pure functions and one small
parser per node; no I/O, no threads.

torchrun ``--tee 3`` puts ``[default<local_rank>]:`` before each line of a rank; lines without it
are the node's own (launcher chatter). When a node's torchrun exits non-zero it prints its
``ChildFailedError`` table on stderr (``rank : R (local_rank: L)`` / ``exitcode : C``, negative
for a signal); its ``Root Cause`` entry names the rank that failed first.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

TEE_RE = re.compile(rb"^\[default(\d+)\]:")
"""torchrun's tee prefix on a raw line; group 1 is the local rank."""
_TEE_STR_RE = re.compile(r"\[default(\d+)\]:")
# Where lines without a tee prefix end: before the next line that has one.
_NEXT_TAGGED_RE = re.compile(r"\n(?=\[default\d+\]:)")

Key = tuple[int, int | None]
"""(node, global rank or None for the node's own lines)."""
Groups = dict[Key, list[str]]
# Per local rank "L": (search for the end of a run of "[defaultL]:" lines, "\n[defaultL]:",
# len("[defaultL]:"), L). Built once per local rank and kept: the hot path reuses them.
_RunOf = tuple[Callable[[str, int], "re.Match[str] | None"], str, int, int]
_RUNS: dict[str, _RunOf] = {}

_TABLE_RANK_RE = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_TABLE_EXIT_RE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


def _run_of(local: str) -> _RunOf:
    prefix = f"[default{local}]:"
    run = (
        re.compile(r"\n(?!" + re.escape(prefix) + ")").search,
        "\n" + prefix,
        len(prefix),
        int(local),
    )
    _RUNS[local] = run
    return run


def split_tee(node: int, gpus_per_node: int, raw: bytes) -> tuple[int, int | None, bytes]:
    """(node, global rank or None, line without its tee prefix) for one raw line of ``node``;
    prefixes inside the line (partial lines torchrun spliced) are left for
    :func:`close_pieces`."""
    mt = TEE_RE.match(raw)
    if mt:
        return node, node * gpus_per_node + int(mt.group(1)), raw[mt.end() :]
    return node, None, raw


def group_runs(
    text: str,
    node: int,
    gpus_per_node: int,
    untagged: Callable[[str], list[str]],
    partial: dict[int, str] | None = None,
) -> Groups:
    """{(node, rank): [lines without prefixes, in order]} for ``text`` (whole lines, each ending
    in a newline) of one node, split by the tee prefixes. ``untagged`` gets each stretch of
    lines without a prefix (as text) and returns the lines to keep for the node itself.

    torchrun's tail of each rank writes what ``readline`` returned, prefixed, to one shared
    stdout; a line a rank had written only in part (``print`` writes the text and its newline
    apart) comes out as ``[default1]:text``, its end later as ``[default1]:\n``, and another
    rank's whole line can land between the two: ``[default1]:text[default0]:line`` then
    ``[default1]:``. Each prefix inside a line therefore ends the partial line before it, which
    waits in ``partial`` (local rank -> text; the caller keeps one per node and stream, across
    calls) for its rank's next piece. Seen under load on two CPU ranks: rank 0's step line had
    been filed as rank 1's.

    Works per run of consecutive lines of one rank, not per line: a run's end is found with one
    regex search (the first line without the run's prefix) and its lines come out of one
    ``str.split`` on "newline + prefix", prefixes already gone."""
    base = node * gpus_per_node
    groups: Groups = {}
    pending: dict[int, str] = {} if partial is None else partial
    tee, next_tagged, runs = _TEE_STR_RE.match, _NEXT_TAGGED_RE.search, _RUNS
    pos, end_all = 0, len(text)
    while pos < end_all:
        m = tee(text, pos)
        if m is None:  # lines with no rank prefix, up to the next line that has one
            nm = next_tagged(text, pos)
            end = nm.end() if nm is not None else end_all
            kept = untagged(text[pos:end])
            if kept:
                groups.setdefault((node, None), []).extend(kept)
            pos = end
            continue
        g = m.group(1)
        run = runs.get(g)
        if run is None:
            run = _run_of(g)
        run_end, sep, plen, local = run
        em = run_end(text, pos)
        end = em.end() if em is not None else end_all
        # Every line up to ``end`` starts with this run's prefix: split on "\n" + prefix.
        chunk = text[pos + plen : end - 1]
        lines = chunk.split(sep)
        pos = end
        if chunk.count("[default") >= len(lines):  # one C-speed scan of the run
            # More prefixes than the lines' own: one inside a line.
            _spliced(lines, local, node, gpus_per_node, pending, groups)
            continue
        if pending and local in pending:
            lines[0] = pending.pop(local) + lines[0]
        key = (node, base + local)
        lst = groups.get(key)
        if lst is None:
            groups[key] = lines
        else:
            lst += lines
    return groups


def _spliced(
    lines: list[str], local: int, node: int, gpn: int, pending: dict[int, str], groups: Groups
) -> None:
    """File a run's lines of which some hold tee prefixes inside (see :func:`group_runs`)."""
    base = node * gpn
    for line in lines:
        owner, whole = close_pieces(line, local, pending, gpn)
        groups.setdefault((node, base + owner), []).append(whole)


def close_pieces(
    line: str, local: int, pending: dict[int, str], gpus_per_node: int | None = None
) -> tuple[int, str]:
    """(local rank, whole line) that ``line`` (of local rank ``local``, its prefix gone) ends:
    the text before each tee prefix inside it is a partial line of the rank it belongs to and
    waits in ``pending``; the last piece ends its rank's line.

    A rank's own text that looks like a prefix stays with it where torchrun could not have
    written it: right after another prefix (torchrun's tail writes a prefix only before a
    non-empty ``readline``, so a splice always follows some text: ``[default0]:[default1]:x``
    is rank 0 printing ``[default1]:x``), and one naming a local rank the node does not have
    (``gpus_per_node``). A prefix after text inside one line stays ambiguous on a merged stream
    (torchrun's own per-rank log files are the only unforgeable record)."""
    parts = _TEE_STR_RE.split(line)  # [text, local, text, local, text, ...]
    owner, piece = local, parts[0]
    for i in range(1, len(parts), 2):
        other, after = int(parts[i]), parts[i + 1]
        if piece and (gpus_per_node is None or other < gpus_per_node):
            pending[owner] = pending.get(owner, "") + piece  # a partial line, spliced
            owner, piece = other, after
        else:  # the rank's own text
            piece += f"[default{parts[i]}]:{after}"
    return owner, pending.pop(owner, "") + piece


def shown(line: str) -> str:
    """A line as shown: bytes that are not UTF-8 (kept by ``surrogateescape``) become U+FFFD."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return line


MAX_SHOWN_LINE = 16 << 10
"""Characters of one line shown (terminal, events); the rest is cut, marked with how many bytes
were cut. The rank's log in the run directory keeps the whole line."""


def cut_long(lines: list[str], limit: int = MAX_SHOWN_LINE) -> list[str]:
    """``lines`` with each line over ``limit`` characters cut there and marked
    ``… [N bytes cut]``; the list itself when none is that long."""
    if not any(len(x) > limit for x in lines):
        return lines
    out = []
    for x in lines:
        if len(x) > limit:
            cut = len(x[limit:].encode("utf-8", "surrogateescape"))
            x = f"{x[:limit]}… [{cut} bytes cut]"
        out.append(x)
    return out


def describe_exit(code: int | None) -> str:
    """``exit code 1``, ``signal 9 (SIGKILL)`` or ``unknown exit``."""
    if code is None:
        return "unknown exit"
    if code < 0:
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


TERMINATED_CODES = frozenset({-15, 143})
"""A rank's exit code when it was sent SIGTERM (torchrun's table: -15; a shell's 128 + 15)."""


@dataclass
class FailureTable:
    """One node's torchrun failure table, read line by line from the node's own lines."""

    rank_exits: dict[int, int] = field(default_factory=dict)
    """Exit code of each rank the table lists."""
    root_rank: int | None = None
    """The rank of the ``Root Cause`` entry: the one that failed first."""
    _rank: int | None = None
    _in_root: bool = False

    def scan(self, body: bytes) -> None:
        """Follow the table through one line (cheap for the lines that are not part of it)."""
        if (
            b"rank" not in body
            and b"exitcode" not in body
            and b"Root Cause" not in body
            and b"Failures:" not in body
        ):
            return
        text = body.decode("utf-8", "replace")
        if "Root Cause" in text:
            self._in_root = True
            return
        if text.startswith("Failures:"):
            self._in_root = False
            return
        mr = _TABLE_RANK_RE.match(text)
        if mr:
            self._rank = int(mr.group(1))
            if self._in_root:
                self.root_rank = self._rank
            return
        me = _TABLE_EXIT_RE.match(text)
        if me and self._rank is not None:
            self.rank_exits[self._rank] = int(me.group(1))
            self._rank = None

    def blame_order(self) -> int:
        """How surely the rank this table blames is a run's first failure, when several nodes
        end together (a scheduler's job ends all at once) and each table names a rank of its
        own: 0, killed by a signal other than SIGTERM/SIGINT (the OOM killer, a crash, a
        kill -9): nothing else ends a rank that way; 1, an exit code, what a peer's loss also
        gives (a collective's "connection closed"); 2, terminated, most likely by whoever
        stopped the run after the first failure (srun's --kill-on-bad-exit, a peer's torchrun);
        3, no rank named."""
        root = self.first_failed()
        if root is None:
            return 3
        code = self.rank_exits.get(root, 1)
        if code in TERMINATED_CODES or code == -2:
            return 2
        return 0 if code < 0 else 1

    def first_failed(self) -> int | None:
        """The rank to blame: the root cause, else the lowest rank listed with a non-zero code."""
        if self.root_rank is not None:
            return self.root_rank
        nonzero = [r for r, c in sorted(self.rank_exits.items()) if c != 0]
        return nonzero[0] if nonzero else None

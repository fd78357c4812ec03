"""``logs/order.idx``: :meth:`RunDir.append` records the order chunks were written in, and a
reopened run (:class:`RunDirSource`) replays them in that order, ranks and streams interleaved;
without an index, or past its end, files come as before (whole, in :func:`replay_order`); an
index that lies is checked, never followed out of the logs, and loses no line."""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from pathlib import Path

import pytest

from engine.monitor.tail import NOTE, RunDirSource, replay_order
from engine.rundir.events import per_line
from engine.rundir.files import ORDER_INDEX, RunDir
from engine.rundir.launcher import launcher_record

Line = tuple[int | None, str, str]
"""(rank, stream, text) of one line read back."""

WRITES: list[tuple[int | None, str, list[str]]] = [
    (None, "stdout", ["launcher: node 0 up"]),
    (0, "stdout", ["[dtrain] step=1/20 loss=2.9"]),
    (1, "stdout", ["[dtrain] step=1/20 loss=2.91"]),
    (0, "stderr", ["warning: slow allreduce"]),
    (0, "stdout", ["[dtrain] step=2/20 loss=2.8", "[dtrain] step=3/20 loss=2.7"]),
    (1, "stdout", ["[dtrain] step=2/20 loss=2.81"]),
    (0, "stderr", ["Traceback (most recent call last):", "ZeroDivisionError: division by zero"]),
    (1, "stderr", ["rank 1: peer gone"]),
    (None, "stdout", ["ChildFailedError:"]),
]
IN_ORDER: list[Line] = [(r, s, x) for r, s, lines in WRITES for x in lines]


def run_dir(tmp_path: Path, writes: list[tuple[int | None, str, list[str]]] = WRITES) -> Path:
    """A finished run's directory, its logs written through a real :meth:`RunDir.append`."""
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    rd = RunDir(run)
    for rank, stream, lines in writes:
        rd.append(0, rank, stream, "".join(x + "\n" for x in lines).encode())
    rd.close()
    ranks = [{"rank": r, "node_rank": 0, "local_rank": r, "exit_code": 1 - r} for r in (0, 1)]
    info = {"state": "failed", "world_size": 2, "ranks": ranks, "failed_rank": 0, "reason": "x"}
    (run / "run.json").write_text(json.dumps(info))
    return run


def read_back(run: Path, **kw: int) -> list[Line]:
    source = RunDirSource(run, **kw)
    source.start()
    events = []
    for _ in range(10_000):
        if source.done:
            break
        events += source.poll(0.05)
    assert source.done, "the source never finished"
    return [(ev.rank, ev.stream, ev.line) for ev in per_line(events) if hasattr(ev, "line")]


def by_file(run: Path) -> list[Line]:
    """Every line of every log, file after file in :func:`replay_order` (the old replay)."""
    logs = run / "logs"
    out: list[Line] = []
    names = [n for n in os.listdir(logs) if n.endswith(".log")]
    for name in replay_order(logs, names):
        parts = name.split(".")
        rank = int(parts[0][4:]) if name.startswith("rank") else None
        stream = parts[1] if rank is not None else "stdout"
        out += [(rank, stream, x) for x in (logs / name).read_text().splitlines()]
    return out


def dated(run: Path) -> None:
    """Mtimes that put the files in an order unlike the writes' (node log first)."""
    t0 = 1_700_000_000_000_000_000
    names = ["node0.log", "rank1.stderr.log", "rank1.stdout.log", "rank0.stderr.log"]
    for i, name in enumerate([*names, "rank0.stdout.log"]):
        os.utime(run / "logs" / name, ns=(t0 + i * 10**9, t0 + i * 10**9))


def test_chunks_come_back_in_the_order_they_were_written(tmp_path: Path) -> None:
    run = run_dir(tmp_path)
    dated(run)
    assert read_back(run) == IN_ORDER


def test_small_polls_split_chunks_and_keep_the_order(tmp_path: Path) -> None:
    run = run_dir(tmp_path)
    assert read_back(run, chunk_bytes=5, poll_bytes=70) == IN_ORDER


def test_the_index_lists_each_append_and_is_owner_only(tmp_path: Path) -> None:
    run = run_dir(tmp_path)
    index = run / "logs" / ORDER_INDEX
    records = index.read_text().splitlines()
    assert len(records) == len(WRITES)
    assert records[0] == f"node0.log 0 {len('launcher: node 0 up') + 1}"
    assert records[4].startswith("rank0.stdout.log 28 ")
    assert stat.S_IMODE(index.stat().st_mode) == 0o600


def test_an_old_run_without_an_index_reads_as_before(tmp_path: Path) -> None:
    run = run_dir(tmp_path)
    (run / "logs" / ORDER_INDEX).unlink()
    dated(run)
    lines = read_back(run)
    assert lines == by_file(run)
    assert lines != IN_ORDER


def test_past_a_truncated_index_the_rest_comes_file_by_file(tmp_path: Path) -> None:
    run = run_dir(tmp_path)
    dated(run)
    index = run / "logs" / ORDER_INDEX
    records = index.read_text().splitlines(keepends=True)
    index.write_text("".join(records[:4]) + records[4][:9])  # a crash mid-record
    lines = read_back(run)
    head = IN_ORDER[:4]
    assert lines[:4] == head
    rest = by_file(run)
    for x in head:
        rest.remove(x)
    assert lines[4:] == rest
    assert not any(x.startswith(NOTE) for _, _, x in lines)


def _hostile(run: Path, kind: str) -> None:
    logs = run / "logs"
    index = logs / ORDER_INDEX
    good = index.read_text().splitlines(keepends=True)
    size = (logs / "rank0.stdout.log").stat().st_size
    secret = run / "secret.log"
    secret.write_text("SECRET\n")
    bad = {
        "garbage": "\x00\xff not a record at all\n",
        "past the end": f"rank0.stdout.log {size} 1000\n",
        "huge count": "rank0.stdout.log 0 9999999999999999999\n",
        "outside logs": f"../secret.log 0 7\n{os.path.abspath(secret)} 0 7\n",
        "repeats": good[1] * 5,
        "negative": "rank0.stdout.log -1 5\n",
        "long line": "rank0.stdout.log " + "1" * 100_000,
    }
    if kind == "symlinked log":
        os.symlink(secret, logs / "rank7.stdout.log")
        index.write_text("".join(good[:2]) + "rank7.stdout.log 0 7\n" + "".join(good[2:]))
    elif kind == "symlinked index":
        index.unlink()
        forged = run / "forged.idx"
        forged.write_text("".join(good[:1] * 3))
        os.symlink(forged, index)
    else:
        index.write_text("".join(good[:2]) + bad[kind] + "".join(good[2:]))


HOSTILE = [
    "garbage",
    "past the end",
    "huge count",
    "outside logs",
    "repeats",
    "negative",
    "long line",
    "symlinked log",
    "symlinked index",
]


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_lying_index_loses_no_line_and_reads_nothing_else(tmp_path: Path, kind: str) -> None:
    run = run_dir(tmp_path)
    dated(run)
    _hostile(run, kind)
    lines = read_back(run, chunk_bytes=64, poll_bytes=256)
    notes = [x for x in lines if x[2].startswith(NOTE)]
    shown = [x for x in lines if not x[2].startswith(NOTE)]
    assert Counter(shown) == Counter(IN_ORDER)  # every line once, nothing from elsewhere
    for key in {(r, s) for r, s, _ in IN_ORDER}:  # each file's lines in its own order
        assert [x for x in shown if x[:2] == key] == [x for x in IN_ORDER if x[:2] == key]
    assert len(notes) >= 1 and all("SECRET" not in x for _, _, x in lines)
    if kind != "symlinked index":
        assert shown[:2] == IN_ORDER[:2]  # the records before the lie are replayed in order


@pytest.mark.parametrize("how", ["disk full", "symlink"])
def test_a_failing_index_loses_no_log_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The index cannot be written (no space for it; a symlink in its place, not written
    through): appends go on, the logs hold every line, the index is not tried again, and the
    run reads back file by file."""
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    tries: list[int] = []
    if how == "symlink":
        os.symlink(tmp_path / "elsewhere", run / "logs" / ORDER_INDEX)
    else:
        real = os.write

        def full(fd: int, data: bytes) -> int:
            if fd == rd._index:
                tries.append(fd)
                raise OSError(28, "No space left on device")
            return real(fd, data)

        monkeypatch.setattr(os, "write", full)
    rd = RunDir(run)
    for rank, stream, lines in WRITES:
        rd.append(0, rank, stream, "".join(x + "\n" for x in lines).encode())
    monkeypatch.undo()
    assert rd._index == -1 and len(tries) == (1 if how == "disk full" else 0)
    rd.close()
    assert not (tmp_path / "elsewhere").exists()
    assert (run / "logs" / "rank0.stdout.log").read_text().count("step=") == 3
    ranks = [{"rank": r, "node_rank": 0, "local_rank": r, "exit_code": 0} for r in (0, 1)]
    (run / "run.json").write_text(json.dumps({"state": "succeeded", "ranks": ranks}))
    shown = [x for x in read_back(run) if not x[2].startswith(NOTE)]
    assert Counter(shown) == Counter(IN_ORDER)


def test_a_live_run_reopened_replays_then_follows(tmp_path: Path) -> None:
    """The index is replayed to its end at the opening; lines written after that come as the
    followed files give them."""
    run = run_dir(tmp_path, WRITES[:5])
    info = json.loads((run / "run.json").read_text())
    info.update(state="running", launcher=launcher_record())
    (run / "run.json").write_text(json.dumps(info))
    source = RunDirSource(run)
    source.start()
    events = source.poll(0.05)
    rd = RunDir(run)
    for rank, stream, lines in WRITES[5:]:
        rd.append(0, rank, stream, "".join(x + "\n" for x in lines).encode())
    rd.close()
    for _ in range(200):
        got = [(ev.rank, ev.stream, ev.line) for ev in per_line(events) if hasattr(ev, "line")]
        if len(got) >= len(IN_ORDER):
            break
        events += source.poll(0.05)
    source.stop()
    assert got[:6] == IN_ORDER[:6]  # what was there: in write order
    assert Counter(got[6:]) == Counter(IN_ORDER[6:])  # then followed as the files grow

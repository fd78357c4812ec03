"""A rank line torchrun's tail split in two: under ``PYTHONUNBUFFERED`` (every launch sets it)
``print(msg, file=sys.stderr)`` writes ``msg`` and ``"\\n"`` apart; torchrun's ``tail_logfile``
can read between them and prefix both halves, so the launcher receives
``[default1]:msg[default1]:``. Seen in the stuck-rank example of the README (the trainer's
``test hook: ... and stalls`` line came out as ``... stalls[default1]:``). Another rank's whole
line can land between the halves (``[default1]:msg[default0]:line`` then ``[default1]:``): seen in
CI, two CPU ranks under load, rank 0's step line filed as rank 1's."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.launch.torchrun_output import close_pieces, group_runs, split_tee


def _untagged(run: str) -> list[str]:
    return [ln for ln in run.split("\n") if ln]


def test_group_runs_joins_a_line_torchrun_spliced() -> None:
    text = (
        "[default1]:[dtrain] test hook: rank 1 skips the all-reduce of step 3 and stalls"
        "[default1]:\n"
        "[default1]:[dtrain] step=1/2 loss=[default1]:7.1\n"
        "[default1]:next\n"
        "[default0]:rank zero\n"
    )
    g = group_runs(text, 0, 2, _untagged)
    assert g[(0, 1)] == [
        "[dtrain] test hook: rank 1 skips the all-reduce of step 3 and stalls",
        "[dtrain] step=1/2 loss=7.1",
        "next",
    ]
    assert g[(0, 0)] == ["rank zero"]


def test_group_runs_leaves_whole_lines_alone() -> None:
    text = "[default0]:a\n[default0]:b [x]: quoted\n[default1]:c\n"
    g = group_runs(text, 1, 2, _untagged)
    assert g[(1, 2)] == ["a", "b [x]: quoted"]
    assert g[(1, 3)] == ["c"]


# What two CPU ranks gave under load (CI, both cores busy): rank 1's step line was tailed before
# its newline, rank 0's whole step line landed between, then rank 1's newline. Rank 0's line had
# been filed (and logged) as rank 1's, and rank 0 seemed to skip step 2.
_RANK1 = "[dtrain] step=2/3 loss=5.7731 tokens_per_s=1123.4 step_time_s=0.0570 mem_gb=0.423"
_RANK0 = "[dtrain] step=2/3 loss=5.8196 tokens_per_s=1504.3 step_time_s=0.0425 mem_gb=0.423"


def test_another_ranks_line_inside_a_partial_one_goes_to_its_rank() -> None:
    text = f"[default1]:{_RANK1}[default0]:{_RANK0}\n[default1]:\n[default0]:next\n"
    g = group_runs(text, 0, 2, _untagged, {})
    assert g[(0, 0)] == [_RANK0, "next"]
    assert g[(0, 1)] == [_RANK1]


def test_a_partial_line_waits_across_reads_for_its_end() -> None:
    partial: dict[int, str] = {}
    first = group_runs(f"[default1]:{_RANK1[:20]}[default0]:{_RANK0}\n", 0, 2, _untagged, partial)
    assert first == {(0, 0): [_RANK0]}
    assert partial == {1: _RANK1[:20]}
    second = group_runs(f"[default1]:{_RANK1[20:]}\n[default1]:after\n", 0, 2, _untagged, partial)
    assert second == {(0, 1): [_RANK1, "after"]}
    assert partial == {}
    # Left waiting when its stream ends: the reader delivers it as it is (the last test).
    group_runs(f"[default0]:{_RANK0}[default1]:last words\n", 0, 2, _untagged, partial)
    assert partial == {0: _RANK0}


def test_split_tee_leaves_inner_prefixes_to_close_pieces() -> None:
    # The per-line path (SkyPilot's prefixed lines): split_tee strips the line's own prefix,
    # close_pieces files what is inside.
    assert split_tee(0, 2, b"[default1]:plain") == (0, 1, b"plain")
    node, rank, body = split_tee(1, 2, b"[default1]:stalls[default1]:")
    assert (node, rank) == (1, 3)
    pending: dict[int, str] = {}
    assert close_pieces(body.decode(), 1, pending) == (1, "stalls")
    assert close_pieces(f"{_RANK1}[default0]:{_RANK0}", 1, pending) == (0, _RANK0)
    assert close_pieces("", 1, pending) == (1, _RANK1)
    assert pending == {}


def _prefixed_split(node: int, raw: bytes) -> tuple[int, int | None, bytes]:
    """The ``split`` of a driver whose lines carry a prefix of their own before torchrun's, as
    SkyPilot's do: the reader's per-line path."""
    assert raw.startswith(b"(n0) "), raw
    return split_tee(0, 2, raw[5:])


@pytest.mark.parametrize("prefixed", [False, True], ids=["tee-runs", "per-line"])
def test_a_runs_logs_and_events_file_each_spliced_line_under_its_rank(
    tmp_path: Path, prefixed: bool
) -> None:
    # The launch backends' stream reader end to end, fed in 37-byte reads: a rank's partial
    # line with another rank's line inside, its end in a later read, and one left open when
    # the stream ends (the rank died mid-line).
    import threading

    from engine.launch.policy import NodeState
    from engine.launch.pump import OutputPump
    from engine.rundir.events import per_line
    from engine.rundir.files import RunDir
    from tests.e2e.launch_util import write_bundle

    lines_in = [
        f"[default1]:{_RANK1}[default0]:{_RANK0}",
        "[default1]:",
        "[default0]:next",
        "[default0]:cut off[default1]:last",
    ]
    stream = "".join(("(n0) " if prefixed else "") + ln + "\n" for ln in lines_in).encode()
    chunks = [stream[i : i + 37] for i in range(0, len(stream), 37)] + [b""]
    bundle = write_bundle(tmp_path / "b")
    run = RunDir(tmp_path / "run")
    run.create(bundle)
    errors: list[OSError] = []
    split = _prefixed_split if prefixed else None
    nodes = [NodeState(node=0, host="localhost")]
    pump = OutputPump(
        run, nodes, 2, ended=threading.Event(), split=split, on_dir_error=errors.append
    )
    pump.add_stream(0, "stdout", lambda: chunks.pop(0))
    pump.join(30)
    assert pump.open_streams(0) == 0
    lines: dict[int | None, list[str]] = {0: [], 1: []}
    for e in per_line(pump.take(0)):
        lines[e.rank].append(e.line)
    expected = {0: [_RANK0, "next", "cut off"], 1: [_RANK1, "last"]}
    assert lines == expected
    run.close()
    assert errors == []
    for rank, want in expected.items():
        log = tmp_path / "run" / "logs" / f"rank{rank}.stdout.log"
        assert log.read_text().splitlines() == want

"""What a rank prints, as the launch backends' stream reader files and shows it: a rank's own text
that looks like torchrun's tee prefix stays with the rank that printed it, and a huge line is
shown cut (terminal, events) while the rank's log keeps it whole."""

from __future__ import annotations

from pathlib import Path

from engine.launch.torchrun_output import MAX_SHOWN_LINE, close_pieces, cut_long, group_runs


def _untagged(run: str) -> list[str]:
    return [ln for ln in run.split("\n") if ln]


def test_a_rank_printing_another_ranks_prefix_keeps_its_line() -> None:
    text = (
        "[default0]:[default1]:forged by rank 0\n"
        "[default0]:step 1\n"
        "[default1]:[default1]:rank 1's own\n"
        "[default1]:real\n"
    )
    g = group_runs(text, 0, 2, _untagged)
    assert g[(0, 0)] == ["[default1]:forged by rank 0", "step 1"]
    assert g[(0, 1)] == ["[default1]:rank 1's own", "real"]


def test_a_prefix_naming_a_rank_the_node_does_not_have_is_text() -> None:
    g = group_runs("[default0]:see [default7]:x\n[default0]:next\n", 1, 2, _untagged)
    assert g == {(1, 2): ["see [default7]:x", "next"]}


def test_a_real_splice_after_a_forged_prefix_still_joins() -> None:
    # Rank 1's partial line, rank 0's whole line (its own text starts with a prefix) inside it.
    pending: dict[int, str] = {}
    assert close_pieces("half[default0]:[default1]:mine", 1, pending, 2) == (0, "[default1]:mine")
    assert close_pieces(" done", 1, pending, 2) == (1, "half done")


def test_cut_long_marks_what_it_cut() -> None:
    line = "é" * (MAX_SHOWN_LINE + 10)
    (got,) = cut_long([line])
    assert got == "é" * MAX_SHOWN_LINE + "… [20 bytes cut]"
    short = ["a", "b"]
    assert cut_long(short) is short


def test_a_10_mb_line_is_shown_cut_and_logged_whole(tmp_path: Path) -> None:
    import threading

    from engine.launch.policy import NodeState
    from engine.launch.pump import OutputPump
    from engine.rundir.events import per_line
    from engine.rundir.files import RunDir
    from tests.e2e.launch_util import make_bundle

    big = "x" * (10 << 20)
    stream = f"[default1]:{big}\n[default0]:small\n".encode()
    chunks = [stream[i : i + (256 << 10)] for i in range(0, len(stream), 256 << 10)] + [b""]
    bundle = make_bundle(tmp_path / "b")
    run = RunDir(tmp_path / "run")
    run.create(bundle)
    pump = OutputPump(run, [NodeState(node=0, host="localhost")], 2, ended=threading.Event())
    pump.add_stream(0, "stdout", lambda: chunks.pop(0))
    pump.join(60)
    assert pump.open_streams(0) == 0
    shown = {e.rank: e.line for e in per_line(pump.take(0))}
    assert shown[1] == "x" * MAX_SHOWN_LINE + f"… [{len(big) - MAX_SHOWN_LINE} bytes cut]"
    assert shown[0] == "small"
    run.close()
    assert (tmp_path / "run" / "logs" / "rank1.stdout.log").read_text() == big + "\n"

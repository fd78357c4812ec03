"""A rank line torchrun's tail split in two: under ``PYTHONUNBUFFERED`` (every launch sets it)
``print(msg, file=sys.stderr)`` writes ``msg`` and ``"\\n"`` apart; torchrun's ``tail_logfile``
can read between them and prefix both halves, so the launcher receives
``[default1]:msg[default1]:``. Seen in the stuck-rank example of the README (the trainer's
``test hook: ... and stalls`` line came out as ``... stalls[default1]:``)."""

from __future__ import annotations

from engine.launch.torchrun_output import group_runs, split_tee


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
    text = "[default0]:a\n[default0]:b [default1]: quoted\n[default1]:c\n"
    g = group_runs(text, 1, 2, _untagged)
    assert g[(1, 2)] == ["a", "b [default1]: quoted"]
    assert g[(1, 3)] == ["c"]


def test_split_tee_joins_a_spliced_line() -> None:
    assert split_tee(0, 2, b"[default1]:stalls[default1]:") == (0, 1, b"stalls")
    assert split_tee(0, 2, b"[default1]:plain") == (0, 1, b"plain")

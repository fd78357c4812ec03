"""run.json's ``attempts`` (the restart policy's, engine/launch/restart.py): written only when
there are any (so every other run.json stays byte for byte as it was), read back typed, and a
file from elsewhere with wrong types reads with defaults instead of failing."""

from __future__ import annotations

import json

from engine.rundir.record import AttemptRecord, RunRecord, RunState


def test_no_attempts_key_without_attempts() -> None:
    assert "attempts" not in RunRecord(name="x").to_dict()


def test_attempts_round_trip() -> None:
    rec = RunRecord(
        name="x",
        attempts=[
            AttemptRecord(attempt=1, run_dir="attempts/1", state=RunState.FAILED, cause="rank 1"),
            AttemptRecord(
                attempt=2, run_dir="attempts/2", resumed_from_step=4, steps_redone=1, lost_s=0.5
            ),
        ],
    )
    back = RunRecord.from_untrusted(json.loads(rec.to_json()))
    assert back.attempts == rec.attempts


def test_attempts_of_the_wrong_type_read_with_defaults() -> None:
    data = {
        "attempts": [
            "junk",
            {"attempt": "2", "state": "exploded", "lost_s": -3, "hosts": ["a", 1], "cause": 7},
            {"resumed_from_step": 6, "steps_redone": 2},
        ]
    }
    a, b = RunRecord.from_untrusted(data).attempts
    assert (a.attempt, a.state, a.lost_s, a.hosts, a.cause) == (1, RunState.FAILED, 0.0, ["a"], "")
    assert (b.attempt, b.resumed_from_step, b.steps_redone) == (2, 6, 2)
    assert RunRecord.from_untrusted({"attempts": {"x": 1}}).attempts == []

"""The restart policy's choices that need no run: the back-off doubles up to its cap, and a node
whose failure repeats is left out for a spare host (SSH), said in one line; one failure, or two
on different nodes, or no spare left, changes nothing."""

from __future__ import annotations

from pathlib import Path

from engine.launch.options import LaunchOptions
from engine.launch.restart import RestartingRun, RestartPolicy
from engine.plan.specs import Host
from engine.rundir.record import AttemptRecord, RunState


def _run(tmp_path: Path, spares: tuple[str, ...]) -> RestartingRun:
    opts = LaunchOptions(hosts=[Host.parse("a"), Host.parse("b")])
    policy = RestartPolicy(max_restarts=3, spare_hosts=tuple(Host.parse(h) for h in spares))

    def make(d: Path, o: LaunchOptions) -> object:
        raise AssertionError("no backend is made here")

    return RestartingRun(make, opts, policy, tmp_path)  # type: ignore[arg-type]


def _failed(n: int, node: int | None) -> AttemptRecord:
    return AttemptRecord(
        attempt=n, state=RunState.FAILED, failed_node=node, hosts=["a", "b"], cause="rank 2 died"
    )


def test_backoff_doubles_up_to_its_cap() -> None:
    p = RestartPolicy(backoff_s=1.0, max_backoff_s=5.0)
    assert [p.delay(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]


def test_a_node_failing_twice_is_replaced_by_a_spare(tmp_path: Path) -> None:
    run = _run(tmp_path, ("c",))
    run.attempts = [_failed(1, 1), _failed(2, 1)]
    opts, why = run._exclusion(run.options)
    assert [str(h) for h in opts.hosts] == ["a", "c"]
    assert (
        why
        == "node 1 (b) left out: it failed twice in a row (rank 2 died); spare c takes its place"
    )
    opts2, why2 = run._exclusion(opts)  # no spare left
    assert why2 == "" and opts2 is opts


def test_one_failure_or_different_nodes_change_nothing(tmp_path: Path) -> None:
    run = _run(tmp_path, ("c",))
    run.attempts = [_failed(1, 1)]
    assert run._exclusion(run.options)[1] == ""
    run.attempts = [_failed(1, 0), _failed(2, 1)]
    assert run._exclusion(run.options)[1] == ""

"""``launch --allow-shrink`` without a run: a 2-node bundle re-planned for the node left, keeping
the global batch by more gradient accumulation, written into the next attempt's directory; the
refusals (DeepSpeed, a forced layout that no longer fits the world, one node only, no flag) each
one line; and the flag reaching the options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli import main
from engine.errors import DtrainError
from engine.launch.options import LaunchOptions
from engine.launch.restart import RestartingRun, RestartPolicy, shrunk_plan
from engine.rundir.record import AttemptRecord, RunState
from engine.write.manifest import read_manifest

TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--gpu", "cpu"]


def _bundle(out: Path, *args: str, nodes: int = 2) -> Path:
    argv = ["write", *TINY, "--gpus-per-node", "1", "--nodes", str(nodes), "--seq-len", "32"]
    argv += ["--global-batch", "8", "--steps", "4", "--out", str(out), *args]
    assert main(argv) == 0
    return out


def _failed(n: int, node: int) -> AttemptRecord:
    hosts = ["localhost", "localhost"]
    return AttemptRecord(attempt=n, state=RunState.FAILED, failed_node=node, hosts=hosts)


def _run(tmp_path: Path, bundle: Path, *, allow: bool = True) -> RestartingRun:
    def make(d: Path, o: LaunchOptions) -> object:
        raise AssertionError("no backend is made here")

    opts = LaunchOptions(allow_shrink=allow)
    run = RestartingRun(make, opts, RestartPolicy(max_restarts=3), tmp_path / "run")  # type: ignore[arg-type]
    run.bundle_dir = bundle
    return run


def test_two_nodes_shrink_to_one_keeping_the_global_batch(tmp_path: Path) -> None:
    b = _bundle(tmp_path / "b")
    before = json.loads((b / "plan.json").read_text())["recommended"]
    assert (before["micro_batch"], before["grad_accum"], before["dp"]) == (4, 1, 2)
    p, change = shrunk_plan(b, 1, [])
    assert p.nodes == 1 and p.recommended.dp == 1
    assert (p.recommended.micro_batch, p.recommended.grad_accum) == (4, 2)
    assert change == "global batch 8 kept: grad-accum 1 -> 2"


def test_the_shrunk_bundle_is_written_into_the_next_attempt(tmp_path: Path) -> None:
    b = _bundle(tmp_path / "b")
    run = _run(tmp_path, b)
    run.attempts = [_failed(1, 1), _failed(2, 1)]
    opts, why, was = run._next_nodes(run.options, 3)
    assert was == 2
    assert why == (
        "node 1 left out: its failure repeated; no spare; continuing on 1 node, "
        "global batch 8 kept: grad-accum 1 -> 2"
    )
    out = run.path / "attempts" / "3" / "bundle"
    assert run.bundle_dir == out
    m = read_manifest(out)
    assert m.nodes == 1 and m.node_scripts == ["launch_node0.sh"]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["recommended"]["grad_accum"] == 2
    assert plan["spec"]["training"]["global_batch"] == 8
    assert [p.name for p in out.parent.iterdir()] == ["bundle"]  # no staging left behind


def test_no_shrink_on_one_failure_or_different_nodes(tmp_path: Path) -> None:
    b = _bundle(tmp_path / "b")
    run = _run(tmp_path, b)
    run.attempts = [_failed(1, 1)]
    assert run._next_nodes(run.options, 2) == (run.options, "", None)
    run.attempts = [_failed(1, 0), _failed(2, 1)]
    assert run._next_nodes(run.options, 3) == (run.options, "", None)
    assert not (run.path / "attempts").exists()


def test_deepspeed_is_refused_in_one_line(tmp_path: Path) -> None:
    b = _bundle(tmp_path / "b", "--framework", "deepspeed")
    with pytest.raises(DtrainError) as e:
        shrunk_plan(b, 1, [])
    assert e.value.message.startswith(
        "DeepSpeed checkpoints do not reshard without a universal conversion: "
    )
    assert "\n" not in e.value.message


def test_a_forced_layout_that_cannot_be_kept_is_refused(tmp_path: Path) -> None:
    b = _bundle(tmp_path / "b", "--dp", "2")
    with pytest.raises(DtrainError) as e:
        shrunk_plan(b, 1, [])
    assert e.value.message.startswith("cannot continue on 1 node(s) keeping the global batch: ")
    assert e.value.message.endswith("; not shrinking") and "\n" not in e.value.message


def test_one_node_has_nothing_to_shrink_to(tmp_path: Path) -> None:
    b = _bundle(tmp_path / "b", nodes=1)
    with pytest.raises(DtrainError, match="no node left"):
        shrunk_plan(b, 0, [])


def test_allow_shrink_needs_max_restarts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = _bundle(tmp_path / "b")
    code = main(["launch", str(b), "--allow-shrink", "--run-dir", str(tmp_path / "r")])
    assert code != 0
    err = capsys.readouterr().err
    assert "--allow-shrink needs --max-restarts N" in err
    assert not (tmp_path / "r").exists()

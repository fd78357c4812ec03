"""What ``launch`` (and ``write``) refuse, or fail on, with one line before anything half-made is
left (security issue, point 9): a run directory inside the bundle it would copy, a full disk
while the bundle is copied into the run directory, a ``bundle.json`` whose ``node_scripts`` do
not match its nodes, and a training script torchrun would read as one of its own options."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from cli import main
from engine.errors import DtrainError
from engine.rundir.files import RunDir
from engine.write import render_bundle, torchrun_argv
from tests.engine.fullfs import fill, small_tmpfs, snapshot
from tests.engine.writers_fixtures import make_plan

TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--gpu", "cpu"]
TINY += ["--gpus-per-node", "2", "--seq-len", "32", "--steps", "3", "--global-batch", "4"]


def _cli(argv: list[str]) -> tuple[int | str | None, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code: int | str | None = main(argv)
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


@pytest.fixture
def bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("DTRAIN_CONFIG_DIR", str(tmp_path / "config"))
    out = tmp_path / "b"
    assert _cli(["write", *TINY, "--out", str(out)]) == (0, "")
    return out


def _no_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.launch

    def no_backend(*args: object, **kwargs: object) -> None:
        raise AssertionError("a refused launch reached the launch backend")

    monkeypatch.setattr(engine.launch, "make_backend", no_backend)


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if "error" in ln]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("inside", ["run", "deep/er/run", "."])
def test_a_run_dir_inside_the_bundle_is_refused_before_anything_is_copied(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, inside: str
) -> None:
    before = snapshot(bundle)
    _no_backend(monkeypatch)
    code, err = _cli(["launch", str(bundle), "--run-dir", str(bundle / inside)])
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    line = _one_error_line(err)
    assert "--run-dir" in line and "inside the bundle" in line, line
    assert snapshot(bundle) == before
    # The run directory's own guard, for every caller (the wizard's launch).
    with pytest.raises(DtrainError, match="inside the bundle") as e:
        RunDir(bundle / inside).create(bundle)
    assert e.value.field == "--run-dir"
    assert snapshot(bundle) == before


@pytest.mark.parametrize(
    "flag,args",
    [
        ("--script", ["--script", "/abs/train.py"]),
        ("--script-arg", ["--script-arg=--epochs", "--script-arg=3"]),
        ("--hf-integration", ["--hf-integration"]),
        ("--master-addr", ["--master-addr", "10.0.0.9"]),
    ],
)
@pytest.mark.parametrize("command", ["launch", "drill"])
def test_options_written_into_a_bundle_are_refused_with_a_bundle_dir(
    bundle: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    flag: str,
    args: list[str],
) -> None:
    """``launch BUNDLE --script train.py`` ran the example trainer: the script is in the bundle's
    node scripts, so the flag was silently ignored. It is refused, naming where it belongs."""
    _no_backend(monkeypatch)
    code, err = _cli([command, str(bundle), *args, "--run-dir", str(tmp_path / "r")])
    assert code == 2, err
    line = _one_error_line(err)
    assert flag in line and "dtrain-tui write" in line and "--profile/--spec" in line, line
    assert not (tmp_path / "r").exists()


def test_a_full_disk_while_copying_the_bundle_is_one_line_and_leaves_no_run_dir(
    bundle: Path,
) -> None:
    with small_tmpfs(bundle.parent / "small", "1m") as mnt:
        fill(mnt, leave_pages=4)  # the bundle takes some 30 blocks
        for run, existed in ((mnt / "run", False), (mnt / "given", True)):
            if existed:
                run.mkdir()
            code, err = _cli(["launch", str(bundle), "--run-dir", str(run)])
            assert code == 2, err
            line = _one_error_line(err)
            assert f"no space left on device copying the bundle into {run}" in line, line
            assert "[(" not in line and "Errno" not in line, line
            # Nothing half-made: a run directory made for the launch is gone, a given one is
            # as empty as it was.
            assert run.exists() == existed
            assert not existed or not list(run.iterdir())
        assert sorted(p.name for p in mnt.iterdir()) == ["filler", "given"]


@pytest.mark.parametrize("scripts", [[], ["launch_node0.sh", "launch_node1.sh"]])
def test_node_scripts_that_do_not_match_the_nodes_are_one_line(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, scripts: list[str]
) -> None:
    path = bundle / "bundle.json"
    data = json.loads(path.read_text())
    data["node_scripts"] = scripts
    path.write_text(json.dumps(data))
    _no_backend(monkeypatch)
    code, err = _cli(["launch", str(bundle)])
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    line = _one_error_line(err)
    assert "node_scripts" in line and "bundle.json" in line, line
    assert "IndexError" not in line and "internal error" not in line


def test_the_training_script_is_the_script_for_torchruns_own_parser() -> None:
    from torch.distributed.run import get_args_parser

    # Arguments after the script are the script's, even where they look like torchrun's own.
    args = ["--rdzv-endpoint=evil:1", "--nnodes", "9", "-x"]
    for nodes, script in ((1, "my train.py"), (2, "/abs/-odd.py")):
        plan = make_plan(nodes=nodes, launch={"script": script, "script_args": args})
        argv = [w.replace("$MASTER_PORT", "29500") for w in torchrun_argv(plan, 0)]
        argv = [w.replace("$MASTER_ADDR", "10.0.0.1") for w in argv]
        a = get_args_parser().parse_args(argv)
        assert a.training_script == "dtrain_agent.py"  # the rank agent, which runs the script
        assert a.training_script_args == [script, *args]
        assert a.nnodes == str(nodes)
    # A script that begins with "-" would be one of torchrun's options: refused, one line.
    for script in ("--rdzv-endpoint=evil:1", "-m", "-"):
        plan = make_plan(launch={"script": script})
        with pytest.raises(DtrainError, match="starts with '-'") as e:
            render_bundle(plan)
        assert e.value.field == "launch.script"


def test_write_refuses_a_script_torchrun_would_take_for_an_option(tmp_path: Path) -> None:
    out = tmp_path / "b"
    code, err = _cli(["write", *TINY, "--out", str(out), "--script=--rdzv-endpoint=evil:1"])
    assert code == 2, err
    line = _one_error_line(err)
    assert "launch.script" in line and "'-'" in line, line
    assert not out.exists()

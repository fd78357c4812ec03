"""The example trainer's checkpoint bookkeeping, as pure functions: which complete checkpoints a
save prunes (the newest K and every milestone kept, never the only complete one), which step
directories count as complete (the marker, written last), and where the settings come from
(command line over DTRAIN_* environment over plan.json's ``checkpoint`` section)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

TRAIN = Path(__file__).resolve().parents[2] / "engine" / "trainer" / "train.py"


@pytest.fixture(scope="module")
def train() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dtrain_train_ckpt", TRAIN)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_newest_k_and_the_milestones_are_kept(train: ModuleType) -> None:
    steps = [10, 20, 30, 40, 50, 60, 70]
    assert train.ckpt_to_prune(steps, 3, 0) == [10, 20, 30, 40]
    assert train.ckpt_to_prune(steps, 3, 30) == [10, 20, 40]
    assert train.ckpt_to_prune(steps, 10, 0) == []
    assert train.ckpt_to_prune([70, 10, 40], 2, 0) == [10]  # order of discovery is irrelevant


def test_the_only_complete_checkpoint_is_never_deleted(train: ModuleType) -> None:
    assert train.ckpt_to_prune([5], 1, 0) == []
    assert train.ckpt_to_prune([5], 0, 0) == []  # keep below 1 still keeps the newest
    assert train.ckpt_to_prune([5, 6], 0, 5) == []  # the newest, and a milestone
    assert train.ckpt_to_prune([], 3, 2) == []


def test_a_step_directory_counts_once_its_marker_is_there(
    train: ModuleType, tmp_path: Path
) -> None:
    for step, marked in ((2, True), (4, False), (6, True)):
        d = tmp_path / f"step_{step:08d}"
        d.mkdir()
        (d / "__0_0.distcp").write_bytes(b"x")
        if marked:
            (d / train.CKPT_MARKER).write_text(json.dumps({"step": step}))
    (tmp_path / "step_notanumber").mkdir()
    (tmp_path / "notes.txt").write_text("a user's file")
    complete, broken = train.ckpt_scan(tmp_path)
    assert complete == [2, 6]
    assert [p.name for p in broken] == ["step_00000004"]
    assert train.ckpt_scan(tmp_path / "missing") == ([], [])


def _config(
    train: ModuleType, bundle: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch, **env: str
) -> object:
    for key in ("DTRAIN_CKPT_DIR", "DTRAIN_CKPT_EVERY", "DTRAIN_RESUME"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return train.Config(train.parse_args(["--bundle", str(bundle), *argv]))


def test_command_line_over_environment_over_plan(
    train: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    section = {"dir": "ck", "every": 50, "keep": 5, "milestone_every": 1000}
    (tmp_path / "plan.json").write_text(json.dumps({"checkpoint": section}))
    c = _config(train, tmp_path, [], monkeypatch)
    assert (c.ckpt_dir, c.ckpt_every, c.ckpt_keep, c.ckpt_milestone_every, c.resume) == (
        tmp_path / "ck",
        50,
        5,
        1000,
        "auto",
    )
    c = _config(
        train, tmp_path, [], monkeypatch,
        DTRAIN_CKPT_DIR="/elsewhere", DTRAIN_CKPT_EVERY="7", DTRAIN_RESUME="never",
    )  # fmt: skip
    assert (c.ckpt_dir, c.ckpt_every, c.resume) == (Path("/elsewhere"), 7, "never")
    c = _config(
        train, tmp_path, ["--ckpt-dir", "mine", "--ckpt-every", "3", "--ckpt-keep", "1"],
        monkeypatch, DTRAIN_CKPT_DIR="/elsewhere", DTRAIN_CKPT_EVERY="7",
    )  # fmt: skip
    assert (c.ckpt_dir, c.ckpt_every, c.ckpt_keep) == (tmp_path / "mine", 3, 1)
    c = _config(train, tmp_path, ["--no-resume"], monkeypatch, DTRAIN_RESUME="auto")
    assert c.resume == "never"


def test_no_plan_section_means_no_saves_into_the_bundle_dir(
    train: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = _config(train, tmp_path, [], monkeypatch)
    assert (c.ckpt_dir, c.ckpt_every, c.ckpt_keep) == (tmp_path / "checkpoints", 0, 3)


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        ([], {"DTRAIN_CKPT_EVERY": "often"}, "DTRAIN_CKPT_EVERY"),
        (["--ckpt-keep", "0"], {}, "keep"),
        (["--ckpt-every", "-1"], {}, "every"),
    ],
)
def test_bad_settings_are_one_line_naming_the_field(
    train: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    env: dict[str, str],
    names: str,
) -> None:
    with pytest.raises(SystemExit) as exc:
        _config(train, tmp_path, argv, monkeypatch, **env)
    message = str(exc.value)
    assert message.startswith("[dtrain] error: ") and "\n" not in message
    assert names in message


def _complete(root: Path, step: int, marker: str) -> None:
    d = root / f"step_{step:08d}"
    d.mkdir(parents=True)
    (d / marker).write_text(json.dumps({"step": step}))


def test_a_fresh_run_never_saves_beside_an_earlier_runs_checkpoints(
    train: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _complete(tmp_path / "checkpoints", 20, train.CKPT_MARKER)
    c = _config(train, tmp_path, ["--no-resume", "--ckpt-every", "2"], monkeypatch)
    ckpt = train.Checkpointer(c, 0, 1, train.torch.device("cpu"), {})
    with pytest.raises(SystemExit) as exc:
        ckpt.resume()
    message = str(exc.value)
    assert "\n" not in message and "step=20" in message and "--ckpt-dir" in message
    assert (tmp_path / "checkpoints" / "step_00000020" / train.CKPT_MARKER).is_file()
    # Not saving (no --ckpt-every): nothing to mix, the run starts afresh.
    c = _config(train, tmp_path, ["--no-resume"], monkeypatch)
    assert train.Checkpointer(c, 0, 1, train.torch.device("cpu"), {}).resume() == 0


def test_a_resume_path_without_a_complete_checkpoint_is_one_line(
    train: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "empty").mkdir()
    c = _config(train, tmp_path, [], monkeypatch, DTRAIN_RESUME=str(tmp_path / "empty"))
    with pytest.raises(SystemExit) as exc:
        train.Checkpointer(c, 0, 1, train.torch.device("cpu"), {}).resume()
    message = str(exc.value)
    assert message.startswith("[dtrain] error: DTRAIN_RESUME=") and "\n" not in message

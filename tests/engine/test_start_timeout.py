"""``--start-timeout`` (``launch.start_timeout_s``): the ranks' own limit to start, before the
hang timeout runs. Checked like ``--hang-timeout`` (a bad value is one line naming the field),
carried from the spec and the command line into the launch options, kept by a profile."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from cli import main
from engine.launch.options import LaunchOptions
from engine.plan.specs import LaunchSpec, Spec
from profiles.store import ProfileStore

TINY = ["--layers", "2", "--hidden", "64", "--heads", "2", "--vocab", "9"]


def _cli(argv: list[str]) -> tuple[int | str | None, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code: int | str | None = main(argv)
        except SystemExit as e:  # argparse's own errors
            code = e.code
    return code, out.getvalue(), err.getvalue()


def test_the_default_is_600_s() -> None:
    assert LaunchSpec().start_timeout_s == 600.0
    assert LaunchOptions().start_timeout_s == 600.0


@pytest.mark.parametrize("value", [0.0, -5.0, float("nan"), float("inf")])
def test_a_bad_start_timeout_is_refused(value: float) -> None:
    with pytest.raises(ValidationError, match="start_timeout_s"):
        LaunchSpec(start_timeout_s=value)


def test_the_spec_value_reaches_the_launch_options() -> None:
    assert LaunchOptions.from_spec(LaunchSpec(start_timeout_s=42.5)).start_timeout_s == 42.5


def test_the_flag_sets_the_spec_field() -> None:
    argv = ["write", *TINY, "--gpu", "cpu", "--start-timeout", "42", "--print", "plan.json"]
    code, out, err = _cli(argv)
    assert code == 0, err
    assert json.loads(out)["spec"]["launch"]["start_timeout_s"] == 42.0


@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_launch_of_a_bundle_refuses_a_bad_start_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    import engine.launch

    def no_backend(*args: object, **kwargs: object) -> None:
        raise AssertionError("a refused launch reached the launch backend")

    monkeypatch.setattr(engine.launch, "make_backend", no_backend)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("DTRAIN_CONFIG_DIR", str(tmp_path / "config"))
    bundle = tmp_path / "b"
    code, _, err = _cli(["write", *TINY, "--gpu", "cpu", "--out", str(bundle)])
    assert code == 0, err
    code, _, err = _cli(["launch", str(bundle), f"--start-timeout={value}"])
    assert code == 2 and "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and "launch.start_timeout_s" in lines[0], err


def test_a_profile_keeps_the_start_timeout(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "config")
    spec = Spec.model_validate({"model": {"preset": "gpt2"}, "launch": {"start_timeout_s": 900}})
    store.save_spec("slow-start", spec)
    assert store.load("slow-start").spec.launch.start_timeout_s == 900.0

"""``dtrain-tui profiles ...`` end to end, in process (the real argparse entry point)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli import main
from engine.plan.specs import demo_spec
from profiles.store import ProfileStore
from tests.profiles.conftest import write_profile


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_shows_builtins_users_and_broken(
    capsys: pytest.CaptureFixture[str], store: ProfileStore
) -> None:
    store.save_spec("mine", demo_spec(), description="my demo")
    write_profile(store, "typo", "[training]\nseq_lenn = 64\n")
    cfg = str(store.config_dir)
    code, out, err = _run(capsys, "profiles", "list", "--config-dir", cfg)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "SOURCE", "MODEL", "CLUSTER", "LAST", "USED"]
    assert any(ln.startswith("mine ") and "custom 4L×256" in ln and "1×2 cpu" in ln for ln in lines)
    assert any(ln.startswith("4-node-h100-ib") and "built-in" in ln for ln in lines)
    assert any(ln.startswith("typo") and "BROKEN" in ln for ln in lines)
    assert "training.seq_lenn: unknown key" in err and len(err.splitlines()) == 1
    code, out, _ = _run(capsys, "profiles", "list", "--json", "--config-dir", cfg)
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["mine"]["description"] == "my demo" and rows["mine"]["source"] == "user"
    assert rows["typo"]["ok"] is False and "seq_lenn" in rows["typo"]["error"]
    assert rows["local-cpu-demo"]["source"] == "builtin"


def test_config_dir_from_environment(
    capsys: pytest.CaptureFixture[str], _isolated_config: Path
) -> None:
    code, out, _ = _run(capsys, "profiles", "path")
    assert code == 0 and out.strip() == str(_isolated_config / "profiles")
    # --config-dir wins, before or after the subcommand
    for argv in (
        ["--config-dir", "/x/a", "profiles", "path"],
        ["profiles", "path", "--config-dir", "/x/a"],
    ):
        code, out, _ = _run(capsys, *argv)
        assert out.strip() == "/x/a/profiles"


def test_save_show_rename_export_import_delete(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cfg = ["--config-dir", str(tmp_path / "c")]
    code, out, err = _run(
        capsys, "profiles", "save", "big", "--profile", "4-node-h100-ib",
        "--hosts", "h0,h1,h2,h3", "--description", "our 70B", *cfg,
    )  # fmt: skip
    assert code == 0, err
    store = ProfileStore(tmp_path / "c")
    prof = store.load("big")
    assert prof.launch.hosts == ["h0", "h1", "h2", "h3"] and prof.hardware.nodes == 4
    assert prof.profile.description == "our 70B"
    code, out, _ = _run(capsys, "profiles", "show", "big", *cfg)
    assert code == 0 and "# model: llama-2-70b" in out and 'hosts = ["h0", "h1", "h2", "h3"]' in out
    code, out, _ = _run(capsys, "profiles", "show", "big", "--json", *cfg)
    assert json.loads(out)["hardware"]["nodes"] == 4
    code, _, err = _run(capsys, "profiles", "save", "big", "--model", "gpt2", *cfg)
    assert code == 2 and "already exists" in err
    assert _run(capsys, "profiles", "rename", "big", "huge", *cfg)[0] == 0
    exported = tmp_path / "huge.toml"
    assert _run(capsys, "profiles", "export", "huge", "-o", str(exported), *cfg)[0] == 0
    code, out, _ = _run(capsys, "profiles", "export", "huge", *cfg)
    assert out == exported.read_text()
    code, out, _ = _run(capsys, "profiles", "import", str(exported), "--name", "huge2", *cfg)
    assert code == 0 and store.load("huge2").spec == store.load("huge").spec
    assert _run(capsys, "profiles", "delete", "huge", *cfg)[0] == 0
    assert not store.user_path("huge").exists()
    code, _, err = _run(capsys, "profiles", "delete", "local-cpu-demo", *cfg)
    assert code == 2 and "cannot be deleted" in err


@pytest.mark.parametrize(
    "content",
    [
        b"schema_version = 2\n[hardware]\nnodes = 'x'\n",
        b"[hardw",
        b"schema_version = 7\n",
        b"\xff\xfe",
    ],
)
def test_broken_profile_is_one_line_exit_2_and_untouched(
    capsys: pytest.CaptureFixture[str], store: ProfileStore, content: bytes
) -> None:
    store.profiles_dir.mkdir(parents=True)
    path = store.profiles_dir / "bad.toml"
    path.write_bytes(content)
    code, out, err = _run(capsys, "profiles", "show", "bad", "--config-dir", str(store.config_dir))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and str(path) in err
    assert "Traceback" not in err
    assert path.read_bytes() == content


def test_secret_on_the_command_line_is_refused(
    capsys: pytest.CaptureFixture[str], store: ProfileStore
) -> None:
    code, _, err = _run(
        capsys, "profiles", "save", "leak", "--model", "tiny-gpt",
        "--script-arg=--wandb-api-key", "--script-arg=0123abcd",
        "--config-dir", str(store.config_dir),
    )  # fmt: skip
    assert code == 2 and "never stores" in err and len(err.strip().splitlines()) == 1
    assert not store.user_path("leak").exists()


def test_profile_feeds_spec_from_args(store: ProfileStore) -> None:
    """The path plan/write/launch take for --profile: the profile's spec, then overlays."""
    import argparse

    from cli.spec_options import add_spec_options, spec_from_args

    spec = demo_spec()
    spec.training.steps = 3
    store.save_spec("mine", spec)
    parser = argparse.ArgumentParser()
    add_spec_options(parser, launch=True)
    args = parser.parse_args(["--profile", "mine", "--config-dir", str(store.config_dir)])
    assert spec_from_args(args) == spec
    args = parser.parse_args(
        ["--profile", "mine", "--config-dir", str(store.config_dir), "--nodes", "2"]
    )
    assert spec_from_args(args).hardware.nodes == 2

"""No text of a spec, a profile or a model's config.json can add a command to a written script
or a key to a written YAML file, and every value reaches its real consumer exactly.

The consumers are the real ones: bash sources ``nccl.env`` and runs a node script (its
``TORCHRUN`` records the argv and environment the trainer would get), PyYAML and SkyPilot's
``sky.Task.from_yaml`` load ``sky.yaml``, ``json.loads`` the JSON files. The inputs carry every
character that ends a line for one of them (``\\n \\r \\x0b \\x0c \\x1c \\x1d \\x1e \\x85 \\u2028
\\u2029``), other control characters, quotes, ``$()`` and backticks.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cli import main
from engine.errors import DtrainError
from engine.launch.ssh_remote import node_wrapper
from engine.plan.names import Strategy
from engine.plan.result import Plan
from engine.plan.specs import LaunchSpec, ModelSpec
from engine.write import render_bundle, write_bundle
from engine.write.naming import run_name
from engine.write.nccl_env import nccl_env
from engine.write.quoting import comment_text, env_name, is_env_name
from engine.write.sky import sky_yaml
from tests.engine.test_writers_deepspeed import DataParallelOnly, ds_comm  # noqa: F401 - fixture
from tests.engine.writers_fixtures import make_plan

sky = pytest.importorskip("sky")  # slow to import: once for the module

LINE_BREAKS = ["\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
NASTY = [
    *LINE_BREAKS,
    "\x00",
    "\x01",
    "\x1b",
    "\x7f",
    "\t",
    "\ufeff",
    "\xa0",
    "'",
    '"',
    "\\",
    "$(touch INJECTED)",
    "`touch INJECTED`",
    "${HOME}",
    ";",
    "&",
    "|",
    "#",
    ": ",
    "- ",
    "{a: b}",
    "file_mounts: {/p3: /etc}",
    "event_callback: touch /tmp/x",
    "é",
    " ",
]
nasty_text = st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=3)), max_size=6).map(
    "".join
)
PROPERTY = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _named(plan: Plan, name: str) -> Plan:
    """``plan`` with the model's name replaced (as a config.json's ``_name_or_path`` sets it)."""
    return plan.model_copy(update={"model": plan.model.model_copy(update={"name": name})})


def _with_env(plan: Plan, env: dict[str, str]) -> Plan:
    """``plan`` with ``launch.env`` set without the spec's validation: a writer must hold alone."""
    launch = plan.spec.launch.model_copy(update={"env": env})
    spec = plan.spec.model_copy(update={"launch": launch})
    return plan.model_copy(update={"spec": spec})


def _sourced_env(bundle: Path) -> dict[str, str]:
    """The environment after bash sources ``nccl.env`` as the node scripts do."""
    out = subprocess.run(
        ["bash", "-c", "set -a; . ./nccl.env; set +a; env -0"],
        cwd=bundle,
        capture_output=True,
        check=True,
        env={"PATH": os.environ["PATH"]},
    ).stdout
    pairs = (e.split(b"=", 1) for e in out.split(b"\0") if e)
    return {k.decode(): v.decode("utf-8", "surrogateescape") for k, v in pairs}


def _run_node_script(bundle: Path) -> tuple[list[str], dict[str, str]]:
    """Run launch_node0.sh with a TORCHRUN that records its argv and environment."""
    rec = bundle / "torchrun-rec.sh"
    rec.write_text('#!/usr/bin/env bash\nprintf "%s\\0" "$@" > argv.bin\nenv -0 > env.bin\n')
    rec.chmod(0o755)
    subprocess.run(
        ["bash", str(bundle / "launch_node0.sh")],
        cwd=bundle,
        check=True,
        capture_output=True,
        env={"PATH": os.environ["PATH"], "TORCHRUN": str(rec), "MASTER_PORT": "29999"},
    )
    argv = [
        a.decode("utf-8", "surrogateescape")
        for a in (bundle / "argv.bin").read_bytes().split(b"\0")[:-1]
    ]
    pairs = (e.split(b"=", 1) for e in (bundle / "env.bin").read_bytes().split(b"\0") if e)
    env = {k.decode(): v.decode("utf-8", "surrogateescape") for k, v in pairs}
    return argv, env


def _code_lines(text: str, run: str) -> list[str]:
    """A script's lines as bash splits them (at ``\\n`` only), comments blanked, the run name
    replaced: what must not change whatever a name in a comment holds."""
    return ["#" if ln.startswith("#") else ln.replace(run, "RUN") for ln in text.split("\n")]


# ---- finding 1: an env name ending in a newline ------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["reboot\n", "A\nreboot", "A\r", "A\x85", "A\u2028", "A B", "1A", "", "Ä", "A-B", "K\u212a"],
)
def test_the_spec_refuses_an_env_name_that_is_not_a_plain_ascii_word(name: str) -> None:
    with pytest.raises(ValidationError) as e:
        LaunchSpec(env={name: "now"})
    assert "environment variable name" in str(e.value)
    assert not is_env_name(name)


def test_every_writer_refuses_an_env_name_the_spec_would_refuse(tmp_path: Path) -> None:
    plan = _with_env(make_plan(), {"reboot\n": "now"})
    with pytest.raises(DtrainError) as e:
        nccl_env(plan)
    assert e.value.field == "launch.env" and "\n" not in str(e.value)
    with pytest.raises(DtrainError):
        sky_yaml(plan)
    with pytest.raises(DtrainError):
        render_bundle(plan)
    assert not (tmp_path / "b").exists()
    with pytest.raises(DtrainError):
        write_bundle(plan, tmp_path / "b")
    assert not (tmp_path / "b" / "nccl.env").exists()


def test_the_ssh_wrapper_refuses_an_env_name_with_a_newline() -> None:
    env = {"DTRAIN_RUN_ID": "r1", "reboot\n": "now"}
    with pytest.raises(DtrainError) as e:
        node_wrapper(env, 0, script="launch_node0.sh", setup=None, dir_expr="/tmp/x", tar_size=1)
    assert "reboot" in str(e.value) and "\n" not in str(e.value)


def test_the_ssh_wrapper_exports_values_exactly() -> None:
    value = "a'b $(touch INJECTED) `x` \\ \r\x85\u2028 ;"
    env = {"DTRAIN_RUN_ID": "r1", "HF_HOME": value}
    cmd = node_wrapper(env, 0, script="x.sh", setup=None, dir_expr="/tmp/x", tar_size=1)
    # The exports run inside the wrapper's bash -c script: run that export line alone.
    inner = subprocess.run(
        ["bash", "-c", f"printf %s {cmd.removeprefix('exec setsid -w bash -c ')}"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    exports = next(ln for ln in inner.split("\n") if ln.startswith("export "))
    got = subprocess.run(
        ["bash", "-c", f'{exports} printf %s "$HF_HOME"'], capture_output=True, check=True
    ).stdout.decode()
    assert got == value


def test_profiles_import_refuses_an_env_name_with_a_newline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "evil.toml"
    p.write_text('[model]\npreset = "gpt2"\n[launch.env]\n"reboot\\n" = "now"\n')
    code = main(["profiles", "--config-dir", str(tmp_path / "c"), "import", str(p)])
    _, err = capsys.readouterr()
    assert code == 2
    assert "launch.env" in err and len(err.strip().splitlines()) == 1
    assert not list((tmp_path / "c").rglob("*.toml"))


def test_a_spec_file_with_an_env_name_with_a_newline_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "evil.toml"
    p.write_text(
        '[model]\npreset = "gpt2"\n[hardware]\ngpu = "cpu"\ngpus_per_node = 2\n'
        '[launch.env]\n"reboot\\n" = "now"\n'
    )
    code = main(["write", "--spec", str(p), "--out", str(tmp_path / "out")])
    _, err = capsys.readouterr()
    assert code == 2 and "launch.env" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "nccl.env").exists()


# ---- finding 2: a line separator in a model's name ---------------------------------------

_INJECT = "x\u2028file_mounts: {/p3: /etc}\u2028event_callback: touch /tmp/x\u2028#"


def _hf_config(directory: Path, name: str | None) -> Path:
    directory.mkdir(parents=True)
    cfg: dict[str, Any] = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
    }
    if name is not None:
        cfg["_name_or_path"] = name
    (directory / "config.json").write_text(json.dumps(cfg))
    return directory / "config.json"


@pytest.mark.parametrize(
    "where", ["name_or_path", "directory", "bare-u2028", "bare-u0085", "bare-u2029"]
)
def test_a_line_separator_in_a_config_name_adds_no_key_to_sky_yaml(
    where: str, tmp_path: Path
) -> None:
    if where == "name_or_path":
        cfg = _hf_config(tmp_path / "m", _INJECT)
    elif where == "directory":
        cfg = _hf_config(tmp_path / _INJECT.replace("/", "|"), None)
    else:
        sep = {"bare-u2028": "\u2028", "bare-u0085": "\x85", "bare-u2029": "\u2029"}[where]
        cfg = _hf_config(tmp_path / "m", f"org/model{sep}")
    plan = make_plan(model=ModelSpec(config_path=cfg), nodes=2, gpu="h100-sxm", gpus_per_node=8)
    assert "\u2028" in plan.model.name or "\x85" in plan.model.name or "\u2029" in plan.model.name
    bundle = tmp_path / "bundle"
    write_bundle(plan, bundle)
    data = yaml.safe_load((bundle / "sky.yaml").read_text())
    assert list(data) == ["name", "num_nodes", "resources", "workdir", "envs", "setup", "run"]
    task = sky.Task.from_yaml(str(bundle / "sky.yaml"))
    assert not task.file_mounts
    assert task.event_callback is None
    for f in ("accelerate_config.yaml",):
        if (bundle / f).exists():
            yaml.safe_load((bundle / f).read_text())


# ---- the property: every writer, every separator ------------------------------------------


_PLANS = {
    "ddp": dict(),
    "zero2": dict(strategy=Strategy.ZERO2),
    "fsdp": dict(strategy=Strategy.FSDP_FULL),
    "3d": dict(strategy=Strategy.THREE_D, tp=2, gpus_per_node=4, nodes=2, gpu="h100-sxm"),
}


@PROPERTY
@given(name=nasty_text)
def test_a_model_name_only_ever_changes_comment_text(name: str, tmp_path_factory: Any) -> None:
    for kind, kw in _PLANS.items():
        base = make_plan(**kw)  # type: ignore[arg-type]
        ref, got = render_bundle(_named(base, "plain")), render_bundle(_named(base, name))
        r_ref, r_got = run_name(_named(base, "plain")), run_name(_named(base, name))
        for fname, f in got.items():
            text, want = f.text, ref[fname].text
            if fname.endswith((".sh", ".sbatch")) or fname in ("nccl.env", "hostfile"):
                assert _code_lines(text, r_got) == _code_lines(want, r_ref), (kind, fname)
            elif fname.endswith(".yaml"):
                assert yaml.safe_load(text.replace(r_got, "RUN")) == yaml.safe_load(
                    want.replace(r_ref, "RUN")
                ), (kind, fname)
            elif fname.endswith(".json"):
                json.loads(text)
        d = tmp_path_factory.mktemp("b")
        (d / "sky.yaml").write_text(got["sky.yaml"].text)
        task = sky.Task.from_yaml(str(d / "sky.yaml"))
        assert not task.file_mounts and task.event_callback is None
        for fname in got:
            if fname.endswith(".sh") or fname.endswith(".sbatch"):
                (d / fname).write_text(got[fname].text)
                subprocess.run(["bash", "-n", str(d / fname)], check=True)


def _drop(chars: str) -> Any:
    return nasty_text.map(lambda s: "".join(c for c in s if c not in chars))


@PROPERTY
@given(
    # Mostly what the spec and the writers take; now and then what they refuse.
    values=st.lists(st.one_of(_drop("\n\0"), _drop("\n\0"), nasty_text), min_size=1, max_size=3),
    args=st.lists(st.one_of(_drop("\n\r\0"), _drop("\n\r\0"), nasty_text), max_size=3),
)
def test_env_values_and_script_args_reach_the_trainer_exactly(
    values: list[str], args: list[str], tmp_path_factory: Any
) -> None:
    env = {f"USER_VAR_{i}": v for i, v in enumerate(values)}
    try:
        launch = LaunchSpec(env=env, script="my train.py", script_args=args)
    except ValidationError as e:
        # Only what no environment value can hold is refused: a newline or a NUL.
        assert any(c in v for v in values for c in "\n\0"), e
        return
    plan = make_plan(launch=launch.model_dump())
    bundle = tmp_path_factory.mktemp("b")
    if any(c in a for a in args for c in "\n\r\0"):  # not one line of a script
        with pytest.raises(DtrainError) as refused:
            write_bundle(plan, bundle)
        assert refused.value.field == "launch.script_args"
        assert not (bundle / "nccl.env").exists()
        return
    write_bundle(plan, bundle)
    sourced = _sourced_env(bundle)
    assert {k: sourced.get(k) for k in env} == env
    argv, run_env = _run_node_script(bundle)
    assert argv[argv.index("my train.py") + 1 :] == args
    assert {k: run_env.get(k) for k in env} == env
    data = yaml.safe_load((bundle / "sky.yaml").read_text())
    assert {k: data["envs"][k] for k in env} == env
    task = sky.Task.from_yaml(str(bundle / "sky.yaml"))
    assert {k: task.envs[k] for k in env} == env
    assert not task.file_mounts and task.event_callback is None
    for f in ("slurm.sbatch", "launch_node0.sh"):
        subprocess.run(["bash", "-n", str(bundle / f)], check=True)
    spec = json.loads((bundle / "plan.json").read_text())["spec"]
    assert spec["launch"]["env"] == env


# ---- the quoting functions themselves ------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_comment_text_never_holds_a_line_break_of_any_consumer(text: str) -> None:
    out = comment_text(text)
    assert len(out) == len(text)
    assert not any(c in out for c in LINE_BREAKS)
    assert len(yaml.safe_load(f"a: 1 # {out}\nb: 2\n")) == 2


def test_env_name_is_one_ascii_word() -> None:
    assert env_name("HF_HOME", "launch.env") == "HF_HOME"
    with pytest.raises(DtrainError) as e:
        env_name("reboot\n", "launch.env")
    assert e.value.field == "launch.env" and "\n" not in str(e.value)


# ---- the token item: files that carry launch.env values are owner-only ------------------


def test_files_carrying_launch_env_are_owner_only(tmp_path: Path) -> None:
    plan = make_plan(launch={"env": {"HF_TOKEN": "hf_secret"}})
    bundle = tmp_path / "bundle"
    write_bundle(plan, bundle)
    for f in sorted(bundle.iterdir()):
        if f.is_file() and "hf_secret" in f.read_text(errors="replace"):
            mode = stat.S_IMODE(f.stat().st_mode)
            assert mode & 0o077 == 0, f"{f.name} is {oct(mode)}"
    from engine.rundir.files import RunDir

    run = RunDir(tmp_path / "run")
    run.create(bundle)
    for f in sorted((tmp_path / "run").rglob("*")):
        if f.is_file() and "hf_secret" in f.read_text(errors="replace"):
            assert stat.S_IMODE(f.stat().st_mode) & 0o077 == 0, f
    run.write_command(0, "export HF_TOKEN=hf_secret; bash launch_node0.sh")
    cmd = tmp_path / "run" / "commands" / "node0.txt"
    assert stat.S_IMODE(cmd.stat().st_mode) & 0o077 == 0


@pytest.mark.slow
@pytest.mark.usefixtures("ds_comm")
def test_deepspeed_reads_the_ds_config_of_a_model_with_any_name() -> None:
    from deepspeed.runtime.config import DeepSpeedConfig

    base = make_plan(strategy=Strategy.ZERO2)
    name = "".join(NASTY)
    text = render_bundle(_named(base, name))["ds_config.json"].text
    assert text.isascii()
    cfg = json.loads(text)
    assert cfg == json.loads(render_bundle(_named(base, "plain"))["ds_config.json"].text)
    c = DeepSpeedConfig(cfg, mpu=DataParallelOnly(base.recommended.dp))
    assert c.train_batch_size == base.recommended.global_batch

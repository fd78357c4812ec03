"""Bundles checkpoint by default: plan.json's checkpoint section from the plan's interval, the
DTRAIN_CKPT_* variables every node script exports (run by real bash), the Megatron arguments'
--save/--load/--save-interval and distributed format, the README's section for a user's own
script, and the one-line refusal of a multi-node bundle whose checkpoints no node could share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import DtrainError
from engine.plan.names import Framework
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, Spec, TrainingSpec, demo_spec
from engine.write.bundle import render_bundle, write_bundle

ROOT = Path(__file__).parents[2]


def _cpu(nodes: int = 1, **training: object) -> Spec:
    return Spec(
        model=ModelSpec(layers=2, hidden=64, heads=4, vocab=128),
        hardware=HardwareSpec(gpu="cpu", gpus_per_node=2, nodes=nodes),
        training=TrainingSpec.model_validate({"seq_len": 32, "global_batch": 8, **training}),
    )


def _env_of_node_script(bundle: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """Run launch_node0.sh with bash, torchrun replaced by a script that prints DTRAIN_*."""
    fake = bundle.parent / "fake_torchrun.sh"
    fake.write_text("#!/usr/bin/env bash\nenv | grep '^DTRAIN_CKPT_\\|^DTRAIN_RESUME='\n")
    fake.chmod(0o755)
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_")}
    run_env.update({"TORCHRUN": str(fake), "MASTER_ADDR": "127.0.0.1", **(env or {})})
    out = subprocess.run(
        ["bash", str(bundle / "launch_node0.sh")],
        capture_output=True,
        text=True,
        env=run_env,
        timeout=60,
        check=True,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_a_bundle_checkpoints_at_the_plans_interval(tmp_path: Path) -> None:
    p = plan(demo_spec())
    assert p.resilience is not None
    out = tmp_path / "b"
    write_bundle(p, out)
    section = json.loads((out / "plan.json").read_text())["checkpoint"]
    assert section == {"dir": "checkpoints", "every": p.resilience.interval_steps}
    env = _env_of_node_script(out)
    assert env == {
        "DTRAIN_CKPT_DIR": str(out.resolve() / "checkpoints"),
        "DTRAIN_CKPT_EVERY": str(p.resilience.interval_steps),
        "DTRAIN_RESUME": "auto",
    }
    # What the launcher (a restart) or the user sets first wins.
    kept = _env_of_node_script(out, {"DTRAIN_RESUME": "never", "DTRAIN_CKPT_DIR": "/x y"})
    assert kept["DTRAIN_RESUME"] == "never" and kept["DTRAIN_CKPT_DIR"] == "/x y"
    readme = (out / "README.md").read_text()
    assert "## Checkpoints" in readme
    assert "--resume_from_checkpoint" in readme and "[checkpoint]" in readme
    assert '--load \\"$DTRAIN_CKPT_DIR\\"' not in readme and '--load "$DTRAIN_CKPT_DIR"' in readme


def test_ckpt_every_and_dir_override_the_plan(tmp_path: Path) -> None:
    p = plan(_cpu(ckpt_every=5, ckpt_dir="/data/ckpt run"))
    out = tmp_path / "b"
    write_bundle(p, out)
    section = json.loads((out / "plan.json").read_text())["checkpoint"]
    assert section == {"dir": "/data/ckpt run", "every": 5}
    env = _env_of_node_script(out)
    assert env["DTRAIN_CKPT_DIR"] == "/data/ckpt run" and env["DTRAIN_CKPT_EVERY"] == "5"


def test_multi_node_needs_a_dir_every_node_reaches() -> None:
    for training in ({"ckpt_every": 5}, {"ckpt_every": 5, "ckpt_dir": "ckpt"}):
        with pytest.raises(DtrainError) as e:
            render_bundle(plan(_cpu(nodes=2, **training)))
        assert e.value.field == "training.ckpt_dir"
        assert "--ckpt-dir" in str(e.value) and "\n" not in str(e.value)
    # Said shared, or absolute: written. Unasked, a multi-node bundle saves none (the plan
    # says how to turn them on) rather than refuse every multi-node bundle.
    assert render_bundle(plan(_cpu(nodes=2, ckpt_every=5, ckpt_shared=True)))
    files = render_bundle(plan(_cpu(nodes=2, ckpt_every=5, ckpt_dir="/shared/ckpt")))
    assert json.loads(files["plan.json"].text)["checkpoint"]["dir"] == "/shared/ckpt"
    unasked = json.loads(render_bundle(plan(_cpu(nodes=2)))["plan.json"].text)
    assert unasked["checkpoint"]["every"] == 0
    assert "--ckpt-dir" in unasked["resilience"]["note"]


def test_write_refuses_in_one_line(tmp_path: Path) -> None:
    args = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128"]
    args += ["--gpu", "cpu", "--gpus-per-node", "2", "--nodes", "2", "--ckpt-every", "5"]
    r = subprocess.run(
        [sys.executable, "-m", "cli", "write", *args, "--out", str(tmp_path / "b")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "--ckpt-dir" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "b").exists()


def _megatron(**training: object) -> Spec:
    return Spec(
        model=ModelSpec(preset="llama-3-8b"),
        hardware=HardwareSpec(gpu="h100", gpus_per_node=8, nodes=1),
        training=TrainingSpec.model_validate({"seq_len": 4096, "global_batch": 64, **training}),
        layout=LayoutSpec(framework=Framework.MEGATRON, tp=2),
    )


def test_megatron_arguments_save_and_resume(tmp_path: Path) -> None:
    p = plan(_megatron(ckpt_every=250))
    assert p.recommended.framework == Framework.MEGATRON and p.recommended.zero_stage < 3
    out = tmp_path / "b"
    write_bundle(p, out)
    args = (out / "megatron_args.txt").read_text().splitlines()
    assert "--save-interval 250" in args
    assert "--ckpt-format torch_dist" in args and "--async-save" in args
    script = (out / "pretrain_gpt.sh").read_text()
    assert 'CKPT_ARGS=(--save "$DTRAIN_CKPT_DIR" --load "$DTRAIN_CKPT_DIR")' in script
    subprocess.run(["bash", "-n", str(out / "pretrain_gpt.sh")], check=True, timeout=60)
    none = render_bundle(plan(_megatron(ckpt_every=0)))["megatron_args.txt"].text
    assert "--save-interval" not in none and "--async-save" not in none

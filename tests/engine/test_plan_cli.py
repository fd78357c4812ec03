"""``dtrain-tui plan`` as a user runs it: a real subprocess of ``python -m cli``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", "plan", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_plan_json_is_one_object_with_the_schema() -> None:
    r = _run(
        "--model",
        "llama-2-7b",
        "--gpu",
        "A100 80GB",
        "--gpus-per-node",
        "8",
        "--seq-len",
        "4096",
        "--global-batch",
        "256",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["model"]["params_total"] == 6738415616
    assert data["gpu"]["key"] == "a100-80gb"
    rec = data["recommended"]
    assert rec["strategy"] in ("zero1", "zero2", "fsdp-grad-op")
    assert rec["memory_per_gpu"]["total"] == sum(
        rec["memory_per_gpu"][k]
        for k in ("params", "grads", "optimizer", "activations", "buffers", "nccl")
    )
    assert data["path"] and all(set(s) == {"question", "answer", "reason"} for s in data["path"])
    assert all(a["rejected_because"] for a in data["alternatives"])


def test_plan_human_output_and_spec_file(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "model:\n  preset: llama-2-70b\nhardware:\n  gpu: h100-sxm\n  gpus_per_node: 8\n  nodes: 4\n"
        "network:\n  tier: ib-ndr\ntraining:\n  seq_len: 4096\n  global_batch: 512\n  tokens: 1e12\n"
    )
    r = _run("--spec", str(spec))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for needle in (
        "Model     llama-2-70b",
        "Decision path",
        "Memory per GPU (GiB)",
        "Alternatives",
        "GPU-hours",
        "Does it fit with full sharding",
    ):
        assert needle in out, needle
    # Forcing from the command line overlays the file.
    r = _run("--spec", str(spec), "--strategy", "zero3", "--json")
    data = json.loads(r.stdout)
    assert data["forced"] and data["recommended"]["strategy"] == "zero3"


def test_a_layout_that_does_not_fit_exits_1_after_printing() -> None:
    r = _run(
        "--model",
        "llama-2-7b",
        "--gpu",
        "a100-80gb",
        "--gpus-per-node",
        "8",
        "--strategy",
        "ddp",
        "--json",
    )
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert data["forced"] and not data["recommended"]["fits"]
    assert data["alternatives"][0]["fits"]


def _bad_config(tmp_path: Path) -> str:
    p = tmp_path / "config.json"
    p.write_text('{"model_type": "llama", "hidden_size": 4096,,}')
    return str(p)


def _typo_spec(tmp_path: Path) -> str:
    p = tmp_path / "typo.toml"
    p.write_text('[model]\npreset = "llama-2-7b"\n[training]\nseq_lenn = 4096\n')
    return str(p)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--model", "llama-2-7b", "--gpus-per-node", "-1"], "hardware.gpus_per_node"),
        (
            ["--model", "llama-2-7b", "--gpu", "h100", "--gpus-per-node", "6", "--tp", "3"],
            "layout.tp",
        ),
        (["--model", "llama-2-7b", "--gpu", "tpu-v9"], "hardware.gpu"),
        (["--model-config", "BAD_CONFIG"], "model.config_path"),
        (["--spec", "TYPO_SPEC"], "training.seq_lenn"),
        (
            [
                "--model",
                "llama-2-7b",
                "--gpu",
                "h100",
                "--gpus-per-node",
                "8",
                "--tp",
                "2",
                "--pp",
                "4",
                "--dp",
                "2",
            ],
            "layout",
        ),
        (["--model", "no-such-model"], "model.preset"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(
    tmp_path: Path, args: list[str], field: str
) -> None:
    args = [
        _bad_config(tmp_path)
        if a == "BAD_CONFIG"
        else _typo_spec(tmp_path)
        if a == "TYPO_SPEC"
        else a
        for a in args
    ]
    r = _run(*args, "--json")
    assert r.returncode != 0
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert field in lines[0], lines[0]

"""A written DeepSpeed bundle and a written FSDP bundle each run for real: ``dtrain-tui write``
produces the bundle, its ``launch_node0.sh`` starts torchrun with 2 ranks over gloo on CPU,
and the shipped example trainer trains a small model a few steps with the written config.
Both runs go at once (they use different free ports) to keep the test short."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cli import main
from engine.write.manifest import read_manifest

pytestmark = pytest.mark.slow

STEPS = 3
STEP_RE = re.compile(
    r"^\[default(?P<rank>\d)\]:\[dtrain\] step=(?P<n>\d+)/(?P<total>\d+) loss=(?P<loss>\S+) "
    r"tokens_per_s=\S+ step_time_s=\S+ mem_gb=\S+$"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write(out: Path, strategy: str) -> None:
    argv = [
        "write", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128",
        "--gpu", "cpu", "--gpus-per-node", "2", "--nodes", "1",
        "--seq-len", "32", "--global-batch", "8", "--micro-batch", "2",
        "--steps", str(STEPS), "--strategy", strategy, "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0


def test_written_deepspeed_and_fsdp_bundles_train(tmp_path: Path) -> None:
    bundles = {"zero2": tmp_path / "ds", "fsdp-full": tmp_path / "fsdp"}
    for strategy, out in bundles.items():
        write(out, strategy)
    assert (bundles["zero2"] / "ds_config.json").is_file()
    assert (bundles["fsdp-full"] / "fsdp.json").is_file()
    assert read_manifest(bundles["zero2"]).framework == "deepspeed"
    assert read_manifest(bundles["fsdp-full"]).framework == "fsdp"

    procs = {}
    for strategy, out in bundles.items():
        env = {
            **os.environ,
            "MASTER_PORT": str(free_port()),
            "TORCHRUN": f"{sys.executable} -m torch.distributed.run",
            "DS_ACCELERATOR": "cpu",
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("MASTER_ADDR", None)
        procs[strategy] = subprocess.Popen(
            [str(out / "launch_node0.sh")],  # the executable bit is set by the writer
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=tmp_path,
        )
    for strategy, proc in procs.items():
        try:
            output, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
            pytest.fail(f"{strategy} bundle did not finish:\n{output[-4000:]}")
        assert proc.returncode == 0, f"{strategy} bundle failed:\n{output[-4000:]}"
        steps = [m for line in output.splitlines() if (m := STEP_RE.match(line))]
        by_rank = {r: [m for m in steps if m["rank"] == r] for r in ("0", "1")}
        for rank, ms in by_rank.items():
            assert [int(m["n"]) for m in ms] == list(range(1, STEPS + 1)), (
                f"{strategy} rank {rank}:\n{output[-4000:]}"
            )
            assert all(int(m["total"]) == STEPS for m in ms)
            assert all(float(m["loss"]) > 0 for m in ms)
        assert f"[default0]:[dtrain] done steps={STEPS}" in output
        assert f"framework={'deepspeed' if strategy == 'zero2' else 'fsdp'}" in output

"""Helpers for the launch tests: tiny bundles (written by ``engine.write`` when it is there,
else by hand following the engine/write/manifest.py contract), free ports, process-table checks."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from engine.launch.local import pids_with_env
from engine.write.manifest import BundleManifest

REPO = Path(__file__).resolve().parents[2]
TRAINER = REPO / "engine" / "trainer" / "train.py"
AGENT = REPO / "engine" / "trainer" / "agent.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_bundle(
    out: Path,
    *,
    framework: str = "ddp",
    nodes: int = 1,
    gpus_per_node: int = 2,
    hosts: list[str] | None = None,
    steps: int = 4,
    script_args: list[str] | None = None,
    zero_stage: int = 2,
    name: str = "t",
    script: Path | None = None,
) -> Path:
    """A minimal bundle a real launch can run: tiny GPT, CPU, gloo, torchrun --tee 3, every rank
    through the rank agent (``dtrain_agent.py``) as the writers start them. ``script``: a user's
    own script copied in and run in place of the example trainer."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(TRAINER, out / "train.py")
    shutil.copy(AGENT, out / "dtrain_agent.py")
    entry = "train.py"
    if script is not None:
        entry = script.name
        shutil.copy(script, out / entry)
    plan: dict[str, Any] = {
        "model": {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 4, "vocab": 256, "ffn": 256},
        "recommended": {
            "framework": framework,
            "micro_batch": 2,
            "grad_accum": 1,
            "precision": "fp32",
            "zero_stage": zero_stage if framework == "deepspeed" else 0,
        },
        "spec": {"training": {"seq_len": 32, "steps": steps, "lr": 3e-3, "grad_clip": 1.0}},
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
    }
    (out / "plan.json").write_text(json.dumps(plan))
    if framework == "deepspeed":
        ds = {"zero_optimization": {"stage": zero_stage}, "gradient_clipping": 1.0}
        (out / "ds_config.json").write_text(json.dumps(ds))
    if framework == "fsdp":
        fs = {"fsdp_version": 2, "sharding_strategy": "FULL_SHARD", "mixed_precision": None}
        (out / "fsdp.json").write_text(json.dumps(fs))
    (out / "nccl.env").write_text("# gloo on CPU: no NCCL settings\nGLOO_SOCKET_IFNAME=lo\n")
    args = list(script_args or [])
    scripts = []
    for i in range(nodes):
        if nodes == 1:
            rdzv = '--rdzv-backend c10d --rdzv-endpoint "127.0.0.1:${MASTER_PORT}"'
        else:
            rdzv = '--master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT"'
        text = f"""#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "${{BASH_SOURCE[0]}}")"
set -a
source ./nccl.env
set +a
if [[ -z "${{MASTER_ADDR:-}}" ]]; then MASTER_ADDR=127.0.0.1; fi
if [[ -z "${{MASTER_PORT:-}}" ]]; then MASTER_PORT=29500; fi
export MASTER_ADDR MASTER_PORT
mkdir -p logs
exec ${{TORCHRUN:-torchrun}} --nnodes {nodes} --nproc-per-node {gpus_per_node} --node-rank {i} \\
  {rdzv} --max-restarts 0 --log-dir logs --tee 3 \\
  dtrain_agent.py {entry} {shlex.join(args)}
"""
        p = out / f"launch_node{i}.sh"
        p.write_text(text)
        p.chmod(0o755)
        scripts.append(p.name)
    m = BundleManifest(
        name=name,
        framework=framework,
        dist_backend="gloo",
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        hosts=hosts or [],
        node_scripts=scripts,
        script=entry,
        script_args=args,
        backend="local",
    )
    (out / "bundle.json").write_text(m.model_dump_json(indent=2))
    return out


def run_pids(run_id: str) -> list[int]:
    """Live processes (not zombies) tagged with this run's DTRAIN_RUN_ID."""
    alive = []
    for pid in pids_with_env("DTRAIN_RUN_ID", run_id):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def wait_no_pids(run_id: str, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    left = run_pids(run_id)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = run_pids(run_id)
    return left


def rank_pid(run_id: str, rank: int) -> int | None:
    """The pid of the training process of global ``rank`` in this run."""
    for pid in run_pids(run_id):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"TORCHELASTIC_RUN_ID" in b"\0".join(env):
            # torchrun's agent has no RANK; the rank process has RANK and LOCAL_RANK
            if any(e.startswith(b"LOCAL_RANK=") for e in env):
                return pid
    return None


def env_of(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        items = f.read().split(b"\0")
    return dict(i.decode(errors="replace").split("=", 1) for i in items if b"=" in i)


__all__ = ["free_port", "make_bundle", "os"]


TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--gpu", "cpu"]


def write_bundle(out: Path, *args: str, steps: int = 3, nodes: int = 1) -> Path:
    """A bundle written by dtrain-tui's own writers (``dtrain-tui write``) for a tiny CPU model."""
    from cli import main

    argv = [
        "write",
        *TINY,
        "--gpus-per-node",
        "2",
        "--nodes",
        str(nodes),
        "--seq-len",
        "32",
        "--global-batch",
        str(4 * nodes),
        "--steps",
        str(steps),
        "--out",
        str(out),
        *args,
    ]
    code = main(argv)
    assert code == 0, f"dtrain-tui write failed: {argv}"
    return out


def collect(backend: Any, timeout: float = 180.0) -> list[Any]:
    """Poll ``backend`` until done; every event, in order, line batches spelled out line by
    line (:func:`engine.rundir.events.per_line`)."""
    from engine.rundir.events import per_line

    events: list[Any] = []
    deadline = time.monotonic() + timeout
    while not backend.done:
        assert time.monotonic() < deadline, "run did not end in time"
        events.extend(per_line(backend.poll(0.2)))
    return events

"""The NCCL transport check end to end: a real local launch of a 2-node bundle whose plan assumes
InfiniBand, whose node scripts print what NCCL prints when it falls back to sockets; the launcher
writes run.json's ``transport`` entry and ``dtrain-tui monitor RUN --follow`` (a real
subprocess) tells the finding once. Plain bash node scripts: no torch, no GPU, a few seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from engine.launch import LaunchOptions
from engine.launch.local import LocalBackend
from engine.rundir.files import read_run
from tests.e2e.launch_util import REPO, collect, make_bundle, wait_no_pids


def socket_fallback_bundle(tmp_path: Path) -> Path:
    b = make_bundle(tmp_path / "b", nodes=2, gpus_per_node=1)
    data = json.loads((b / "plan.json").read_text())
    data["spec"]["network"] = {"tier": "ib"}
    data["gpu"] = {"dist_backend": "nccl"}
    (b / "plan.json").write_text(json.dumps(data))
    (b / "nccl.env").write_text("NCCL_DEBUG=INFO\nNCCL_IB_DISABLE=0\n")
    for node in (0, 1):
        head = f"[default0]:gpu-{node}:77:77 [0] NCCL INFO"
        body = "".join(
            f"echo '{head} {text}'\n"
            for text in (
                "NCCL version 2.21.5+cuda12.4",
                "NET/IB : No device found.",
                f"NET/Socket : Using [0]eth0:10.0.0.{node + 1}<0>",
                "Using network Socket",
                f"comm 0x1 rank {node} nranks 2 cudaDev 0 busId 1000 - Init COMPLETE",
            )
        )
        (b / f"launch_node{node}.sh").write_text(f"#!/usr/bin/env bash\nset -u\n{body}")
    return b


def test_launch_records_the_transport_and_follow_tells_it_once(tmp_path: Path) -> None:
    run = tmp_path / "run"
    backend = LocalBackend(socket_fallback_bundle(tmp_path), run, LaunchOptions(hang_timeout_s=60))
    backend.start()
    collect(backend, timeout=60)
    assert wait_no_pids(backend.run_id) == []
    info = read_run(run)
    assert info["state"] == "succeeded"
    entry = info["transport"]
    assert entry["verdict"] == "mismatch" and entry["chosen"] == ["Socket"]
    top = entry["findings"][0]
    assert top["title"] == "plan assumes InfiniBand, NCCL chose Socket"
    assert top["nodes"] == ["node 0 (localhost)", "node 1 (localhost)"]

    out = subprocess.run(
        [sys.executable, "-m", "cli", "monitor", str(run), "--follow"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    told = [x for x in out.stdout.splitlines() if x.startswith("[transport]")]
    assert told[0] == (
        "[transport] plan assumes InfiniBand, NCCL chose Socket"
        " — on node 0 (localhost), node 1 (localhost)"
    )
    assert told[1].startswith("[transport]   likely cause: `NET/IB : No device found` on node 0")
    assert told[-1].startswith("[transport]   fix: make the HCAs visible")
    assert sum("NCCL chose Socket" in x for x in out.stdout.splitlines()) == 1
    assert "[rank 1] gpu-1:77:77 [0] NCCL INFO Using network Socket" in out.stdout

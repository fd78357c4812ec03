"""``dtrain-tui preflight`` for real: the bundle's own node scripts start ``preflight.py`` under
torchrun over gloo, locally (one node, two ranks), on two sshd "nodes" on 127.0.0.1 and on the
local two-node Slurm. A rank or node is made slow with the documented test hook
(``DTRAIN_PREFLIGHT_SLOW``, a sleep before each timed collective and CPU work before each GEMM),
and the preflight must name it by host; no process of the preflight may be left behind.

Sizes are capped (``--max-mb 16``) so each run is torch's start-up plus about a second."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.rundir.files import read_run
from tests.e2e.launch_util import free_port, wait_no_pids, write_bundle
from tests.e2e.slurm_cluster import SlurmCluster, slurm_cluster
from tests.e2e.sshd import Sshd, sshd_path, start_many

pytestmark = pytest.mark.slow
__all__ = ["slurm_cluster"]  # the fixture, used by name

REPO = Path(__file__).resolve().parents[2]
SLOW_S = "0.2"
"""The hook's delay: ~50x a 4 MiB loopback all-reduce and ~200x a 384^3 CPU GEMM, so the slow
rank stands out of two busy cores' noise by far more than the verdict's factor (5)."""


def _preflight(*args: str, slow: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DTRAIN_PREFLIGHT_SLOW", None)
    if slow:
        env.update({"DTRAIN_PREFLIGHT_SLOW": slow, "DTRAIN_PREFLIGHT_SLOW_S": SLOW_S})
    return subprocess.run(
        [sys.executable, "-m", "cli", "preflight", *args, "--max-mb", "16",
         "--master-port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _check_tables(out: str, *, pairs: bool) -> None:
    """busbw per size, the pair table (or its absence said), the GEMM table, a verdict."""
    assert "All-reduce, whole world (busbw = algbw x 2(n-1)/n)" in out, out
    for size in ("1 MiB", "4 MiB", "16 MiB"):
        assert f"  {size} " in out, out
    assert "Node pairs" in out
    assert ("one node: no pairs" in out) != pairs, out
    assert "GEMM per rank (float32 384x384x384)" in out
    assert "Verdict: " in out
    assert "{...} (result; see preflight.json)" in out  # the JSON line is not dumped on screen


def _json(run: Path) -> dict[str, object]:
    data = json.loads((run / "preflight.json").read_text())
    assert isinstance(data, dict)
    return data


def test_local_two_ranks_a_slow_rank_is_named(tmp_path: Path) -> None:
    """The healthy local run (verdict ok, exit 0) is the wizard test's, below."""
    bundle = write_bundle(tmp_path / "b")
    slow = _preflight(
        str(bundle), "--backend", "local", "--run-dir", str(tmp_path / "r2"), slow="rank1"
    )
    assert slow.returncode == 1, slow.stdout[-3000:] + slow.stderr[-3000:]
    _check_tables(slow.stdout, pairs=False)
    host = _json(tmp_path / "r2")["hosts"]
    assert isinstance(host, list) and len(host) == 1
    assert f"slow rank: rank 1 on node 0 ({host[0]})" in slow.stdout, slow.stdout
    assert "rank 0 on" not in slow.stdout
    assert wait_no_pids(read_run(tmp_path / "r2")["run_id"]) == []


@pytest.fixture(scope="module")
def sshd_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Sshd], Path, Path]]:
    if sshd_path() is None:
        pytest.skip("sshd not installed (make system-deps)")
    servers, key, kh = start_many(tmp_path_factory.mktemp("sshd"), 2)
    yield servers, key, kh
    for s in servers:
        s.stop()


def test_two_sshd_nodes_name_the_slow_node_by_host(
    sshd_nodes: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    servers, key, kh = sshd_nodes
    hosts = [f"127.0.0.1:{s.port}" for s in servers]
    bundle = write_bundle(tmp_path / "b", "--hosts", ",".join(hosts), "--backend", "ssh", nodes=2)
    run = tmp_path / "run"
    venv_bin = shlex.quote(str(Path(sys.executable).parent))
    proc = _preflight(
        str(bundle), "--run-dir", str(run), "--identity", str(key), "--known-hosts", str(kh),
        "--remote-workdir", str(tmp_path / "remote"),
        "--remote-setup", f"export PATH={venv_bin}:$PATH",
        slow="node1",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    _check_tables(out, pairs=True)
    assert f"0-1   {hosts[0]} - {hosts[1]}" in out, out  # the pair table names both hosts
    assert f"slow node: node 1 ({hosts[1]})" in out, out
    assert f"node 0 ({hosts[0]})" not in out.split("Verdict:")[1]
    data = _json(run)
    assert data["hosts"] == hosts and data["nodes"] == 2 and data["world_size"] == 4
    findings = data["findings"]
    assert isinstance(findings, list)
    # The slow node, and its two ranks' GEMMs; a fabric finding (the whole world slowed by
    # one node) may come too, naming every host; nothing names node 0 alone.
    named = [(f["kind"], f["hosts"]) for f in findings if f["kind"] != "fabric"]
    assert sorted(named) == [("gpu", [hosts[1]]), ("gpu", [hosts[1]]), ("node", [hosts[1]])]
    measured = data["measured"]
    assert isinstance(measured, dict) and measured["inter_node_busbw_gbps"] > 0
    assert wait_no_pids(read_run(run)["run_id"]) == []


def test_local_slurm_two_nodes_names_the_slow_node(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    bundle = write_bundle(tmp_path / "b", nodes=2)
    run = tmp_path / "run"
    proc = _preflight(str(bundle), "--backend", "slurm", "--run-dir", str(run), slow="node0")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    _check_tables(proc.stdout, pairs=True)
    assert "slow node: node 0 (n1)" in proc.stdout, proc.stdout
    assert _json(run)["hosts"] == ["n1", "n2"]
    assert wait_no_pids(read_run(run)["run_id"]) == []


def test_wizard_preflight_button_shows_the_verdict(tmp_path: Path) -> None:
    """The Launch step's Preflight button writes the bundle, runs the preflight locally in a
    worker and shows the verdict line; preflight.json lands in a run directory of its own."""
    import asyncio

    asyncio.run(_wizard_preflight(tmp_path))


async def _wizard_preflight(tmp_path: Path) -> None:
    from textual.widgets import Static

    from engine.plan.specs import demo_spec
    from tests.tui.wizard_support import at_step, settle
    from tui.app import DtrainApp

    app = DtrainApp(
        demo_spec(), out_dir=tmp_path / "bundle", run_root=tmp_path / "runs", plan_delay_s=0.05
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press(*["ctrl+n"] * 6)
        await settle(pilot)
        await at_step(pilot, "launch")
        await pilot.click("#preflight")
        result = app.screen.query_one("#launch-result", Static)
        for _ in range(1200):  # the deadline: 120 s
            await pilot.pause(0.1)
            text = str(result.render())
            if "preflight ok" in text or "preflight slow" in text or "✗" in text:
                break
        text = str(result.render())
        assert "preflight ok: busbw" in text, text
        runs = list((tmp_path / "runs").iterdir())
        assert len(runs) == 1 and runs[0].name.endswith("-preflight")
        data = json.loads((runs[0] / "preflight.json").read_text())
        assert data["verdict"] == "ok" and data["findings"] == [] and data["world_size"] == 2
        assert [row["bytes"] >> 20 for row in data["allreduce"]] == [1, 4, 16, 64]
        measured = data["measured"]
        assert measured["gemm_tflops"] > 0 and measured["allreduce_busbw_gbps"] > 0
        assert measured["inter_node_busbw_gbps"] is None  # one node
        assert wait_no_pids(read_run(runs[0])["run_id"]) == []

"""The stuck rank named for a user's own script, for real: ``tests/data/user_scripts/
skip_allreduce.py`` (plain torch.distributed over gloo, no dtrain-tui code, a SIGUSR1 handler of
its own) runs through the bundle's rank agent on 2 CPU ranks; rank 1 never joins the all-reduce
of step 3. The hang timeout fires although the agent prints telemetry every second (the agent's
lines are no sign of life), the launcher asks every rank through the agent, and run.json's
diagnosis names rank 1 and the all-reduce; the monitor state built from the run's events carries
each rank's CPU telemetry. Locally and over two sshd "nodes"; the real 2-node Slurm is in
test_stuck_rank_slurm.py."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import pytest

from engine.launch.local import LocalBackend
from engine.launch.options import LaunchOptions
from engine.launch.ssh import SshBackend
from engine.monitor.state import MonitorState
from engine.plan.specs import Host
from engine.rundir.events import LineEvent
from engine.rundir.files import read_run
from tests.e2e.launch_util import collect, free_port, make_bundle, wait_no_pids
from tests.e2e.sshd import sshd_path, start_many

REPO = Path(__file__).resolve().parents[2]
USER_SCRIPT = REPO / "tests" / "data" / "user_scripts" / "skip_allreduce.py"
ARGS = ["--steps", "6", "--skip-at", "3", "--skip-rank", "1"]
HANG_S = 10.0
"""As in test_stuck_rank: longer than a loaded machine's silent start."""
TELEMETRY = {"DTRAIN_TELEMETRY_S": "1"}
"""A sample a second: more often than the hang timeout, which must fire all the same."""


def _check_named(info: dict[str, object], host_of_1: str) -> str:
    assert info["state"] == "failed", info
    assert str(info["reason"]).startswith("hang: "), info["reason"]
    diag = info["diagnosis"]
    assert isinstance(diag, dict), info
    summary = str(diag["summary"])
    assert summary.startswith(f"rank 1 (node {host_of_1}) never entered all_reduce #3"), summary
    assert "(pg default, [1024] float32)" in summary and "rank 0 waiting in it" in summary
    assert diag["stuck_ranks"] == [1] and diag["no_dump"] == [], diag
    # The stuck rank's own frame, from a script that knows nothing of dtrain-tui.
    assert "wait_for_data_that_never_comes" in diag["stacks"]["1"][0], diag["stacks"]
    assert any("main" in f for f in diag["stacks"]["0"]), diag["stacks"]
    return summary


def test_a_user_script_that_skips_an_all_reduce_is_named(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b", script=USER_SCRIPT, script_args=ARGS)
    backend = LocalBackend(
        bundle, tmp_path / "run", LaunchOptions(hang_timeout_s=HANG_S, env=TELEMETRY)
    )
    t0 = time.monotonic()
    backend.start()
    events = collect(backend, timeout=HANG_S + 150)
    took = time.monotonic() - t0
    summary = _check_named(read_run(tmp_path / "run"), "0, host localhost")
    shown = [e.line for e in events if isinstance(e, LineEvent)]
    assert f"[dtrain-tui] diagnosis: {summary}" in shown
    assert any("[dtrain] telemetry " in x for x in shown)
    # The monitor's rank state, fed the run's events, carries each rank's CPU telemetry.
    state = MonitorState()
    state.apply(events, time.time())
    for rank in (0, 1):
        t = state.ranks[rank].telemetry
        assert t is not None and t.rank == rank, state.ranks[rank]
        assert t.cpu_pct is not None and t.rss_bytes is not None and t.rss_bytes > 1 << 20
        assert t.gpu is None
    assert took < HANG_S + 30 + 60, took
    assert wait_no_pids(backend.run_id) == []


@pytest.mark.slow
@pytest.mark.skipif(sshd_path() is None, reason="sshd not installed (make system-deps)")
def test_a_user_script_on_two_sshd_nodes_is_named(tmp_path: Path) -> None:
    """Rank 1 alone on node 1 (a real sshd on its own port): the remote bash finds the agent's
    rank by its blocked request signal and the diagnosis names node and host."""
    (tmp_path / "sshd").mkdir()
    servers, key, kh = start_many(tmp_path / "sshd", 2)
    try:
        bundle = make_bundle(
            tmp_path / "b", nodes=2, gpus_per_node=1, script=USER_SCRIPT, script_args=ARGS
        )
        opts = LaunchOptions(
            hosts=[Host.parse(f"127.0.0.1:{s.port}") for s in servers],
            identity_file=key,
            known_hosts=kh,
            remote_workdir=str(tmp_path / "remote"),
            remote_setup=f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH",
            master_port=free_port(),
            hang_timeout_s=HANG_S,
            connect_timeout_s=10.0,
            env=TELEMETRY,
        )
        backend = SshBackend(bundle, tmp_path / "run", opts)
        backend.start()
        events = collect(backend, timeout=HANG_S + 150)
        host1 = f"127.0.0.1:{servers[1].port}"
        summary = _check_named(read_run(tmp_path / "run"), f"1, host {host1}")
        shown = [e.line for e in events if isinstance(e, LineEvent)]
        assert f"[dtrain-tui] diagnosis: {summary}" in shown
        assert wait_no_pids(backend.run_id) == []
    finally:
        for srv in servers:
            srv.stop()

"""The rank agent's telemetry lines in the monitor and the launcher: the rank state keeps the
latest sample, and a rank that only prints telemetry (its script silent: importing, stuck) is
neither running for the monitor nor alive for the launcher's hang clock."""

from __future__ import annotations

import threading
from pathlib import Path

from engine.launch.policy import HangClock, NodeState
from engine.launch.pump import OutputPump
from engine.monitor.state import MonitorState, RankStatus
from engine.rundir.files import RunDir
from tests.e2e.launch_util import make_bundle

SAMPLE = (
    '[dtrain] telemetry {"rank":1,"local_rank":1,"node":0,"host":"h0","pid":7,"time":5.0,'
    '"cpu_pct":98.5,"rss_bytes":1048576}'
)


def test_the_rank_state_keeps_the_latest_sample_and_telemetry_is_no_sign_of_life() -> None:
    state = MonitorState()
    state.ingest_lines(1, 0, [SAMPLE], now=10.0)
    st = state.ranks[1]
    assert st.telemetry is not None and st.telemetry.cpu_pct == 98.5
    assert st.telemetry.rss_bytes == 1 << 20
    assert st.status is RankStatus.STARTING and st.last_line_ts is None
    later = SAMPLE.replace('"cpu_pct":98.5', '"cpu_pct":12.0')
    state.ingest_lines(1, 0, ["step 1 loss 2.0", later], now=11.0)
    assert st.status is RankStatus.RUNNING and st.last_line_ts == 11.0
    assert st.telemetry is not None and st.telemetry.cpu_pct == 12.0
    assert state.snapshot(12.0).ranks[1].telemetry == st.telemetry


def test_telemetry_alone_does_not_feed_the_hang_clock(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b", hosts=["h0"])
    run = RunDir(tmp_path / "run")
    run.create(bundle)
    now = [100.0]
    hang = HangClock(clock=lambda: now[0])
    pump = OutputPump(run, [NodeState(node=0, host="h0")], 2, ended=threading.Event(), hang=hang)
    rank0 = SAMPLE.replace('"rank":1', '"rank":0')
    chunks = [f"[default1]:{SAMPLE}\n[default0]:{rank0}\n"]

    def read() -> bytes:
        now[0] += 50.0
        return chunks.pop(0).encode() if chunks else b""

    pump.add_stream(0, "stderr", read)
    pump.join(60)
    assert pump.open_streams(0) == 0
    assert not hang.alive  # the lines are on disk and shown, yet no rank has spoken
    assert "telemetry" in (tmp_path / "run" / "logs" / "rank1.stderr.log").read_text()
    assert hang.silent_s() >= 100.0  # silent since the clock was made, 100 s ago

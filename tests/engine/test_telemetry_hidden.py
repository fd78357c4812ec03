"""The rank agent's telemetry lines stay on disk and in the rank states, but no pane, no
``launch`` terminal and no ``monitor --follow`` shows them (noise every 5 s on every rank)."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

from cli.launch_cmd import _print_events
from cli.monitor_cmd import follow
from engine.fsio import atomic_write_text
from engine.monitor.reader import Batch, BatchReader
from engine.monitor.state import MonitorState
from engine.monitor.tail import ListSource
from engine.rundir.events import LineBatch, LineEvent, RankExit, RunStateChanged

TEL = (
    '[dtrain] telemetry {"rank":0,"local_rank":0,"node":0,"host":"h0","pid":7,"time":5.0,'
    '"cpu_pct":98.5,"rss_bytes":1048576}'
)


def test_panes_get_no_telemetry_and_errors_point_at_the_shown_line() -> None:
    events = [
        [RunStateChanged("running", "", 1.0)],
        [LineBatch(0, 0, "stderr", ("step 1", TEL, "50%|##  " + TEL))],
        [LineEvent(0, 0, "stderr", TEL)],
        [LineBatch(0, 0, "stderr", (TEL, "Traceback (most recent call last):"))],
        [RankExit(0, 0, 1), RunStateChanged("failed", "x", 2.0)],
    ]
    batches: list[Batch] = []
    done = threading.Event()
    state = MonitorState(1)
    reader = BatchReader(
        ListSource(events),
        state,
        deliver=lambda b: (batches.append(b), reader.taken()),
        finish=lambda s, m: done.set(),
        clock=lambda: 1.0,
    )
    t = threading.Thread(target=reader.run, daemon=True)
    t.start()
    assert done.wait(60)
    shown = [x for b in batches for x in b.lines.get(0, [])]
    assert shown == ["step 1", "50%|##", "Traceback (most recent call last):"]
    node = [x for b in batches for _, lines in b.nodes.get(0, []) for x in lines]
    assert node == shown
    assert state.ranks[0].telemetry is not None and state.ranks[0].telemetry.cpu_pct == 98.5
    (err,) = [e for e in state.errors if e.rank == 0]
    assert err.line_no == 2  # the pane's row, not the log's (4)


def test_launch_prints_no_telemetry() -> None:
    out = io.StringIO()
    _print_events([LineBatch(0, 0, "stderr", (TEL, "step 1")), LineEvent(0, 0, "stderr", TEL)], out)
    assert out.getvalue() == "[rank 0] step 1\n"


def test_monitor_follow_prints_no_telemetry(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank0.stderr.log").write_text(f"{TEL}\nreal line\n{TEL}\n")
    info = {
        "state": "succeeded",
        "world_size": 1,
        "nodes": 1,
        "ranks": [{"rank": 0, "node_rank": 0, "host": "localhost", "exit_code": 0}],
    }
    atomic_write_text(tmp_path / "run.json", json.dumps(info))
    out = io.StringIO()
    follow(tmp_path, out)
    assert "telemetry" not in out.getvalue()
    assert "[rank 0] real line" in out.getvalue()

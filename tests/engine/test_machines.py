"""The machines judged from the rank agent's telemetry lines, fed through the real rank state:
a hot GPU, a throttled one, one far below its node's peers (utilisation, or the SLOW step time)
flagged and named; CPU ranks' rows carry CPU use and resident memory; plan against measured
with its margin and the calibrate offer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.monitor.compare import MARGIN, compare, plan_figures, read_plan_figures
from engine.monitor.machines import FlagKind, all_flags, machines
from engine.monitor.state import MonitorState


def tel(rank: int, node: int = 0, **gpu: Any) -> str:
    body: dict[str, Any] = {
        "rank": rank,
        "node": node,
        "host": f"h{node}",
        "time": 5.0,
        "cpu_pct": 99.0,
        "rss_bytes": 3 << 30,
    }
    if gpu:
        body["gpu"] = {
            "index": str(rank % 4),
            "name": "NVIDIA H100 80GB HBM3",
            "util_pct": 97.0,
            "mem_used_bytes": 60 << 30,
            "mem_total_bytes": 80 << 30,
            "power_w": 650.0,
            "power_limit_w": 700.0,
            "temp_c": 70.0,
            "throttle": [],
            **gpu,
        }
        body["cuda_peak_bytes"] = 50 << 30
    return "[dtrain] telemetry " + json.dumps(body)


def step(n: int, t: float) -> str:
    return f"[dtrain] step={n}/20 loss=2.5 tokens_per_s={4096 / t:.1f} step_time_s={t} mem_gb=1.2"


def state_of(lines: dict[int, list[str]], node_of: Any = lambda r: r // 4) -> MonitorState:
    state = MonitorState()
    for rank, ls in lines.items():
        state.ingest_lines(rank, node_of(rank), ls, now=10.0)
    state.evaluate(10.0)
    return state


def texts(state: MonitorState) -> list[str]:
    return [f.text for f in all_flags(machines(state.ranks))]


def test_a_healthy_node_has_no_flags() -> None:
    state = state_of({r: [tel(r, r // 4, temp_c=60.0 + r)] for r in range(8)})
    nodes = machines(state.ranks)
    assert [n.node for n in nodes] == [0, 1] and [n.host for n in nodes] == ["h0", "h1"]
    row = nodes[1].rows[3]
    assert (row.rank, row.name, row.gpu, row.util_pct, row.temp_c) == (7, "GPU 3", True, 97, 67)
    assert row.mem_used_bytes == 60 << 30 and row.peak_bytes == 50 << 30
    assert texts(state) == []


def test_hot_throttled_and_a_slow_peer_are_flagged_by_name() -> None:
    lines = {r: [tel(r, r // 4, temp_c=70.0)] for r in range(8)}
    lines[7] = [tel(7, 1, throttle=["hw_slowdown", "idle"])]
    lines[2] = [tel(2, 0, temp_c=88.0)]
    lines[5] = [tel(5, 1, util_pct=30.0)]
    state = state_of(lines)
    assert texts(state) == [
        "GPU 2 on node 0: hot (88 °C, ≥ 85)",
        "GPU 1 on node 1: far below its peers (30 % busy, node median 97 %)",
        "GPU 3 on node 1: throttled (HW slowdown)",
    ]
    kinds = {f.rank: f.kind for f in all_flags(machines(state.ranks))}
    assert kinds == {2: FlagKind.HOT, 5: FlagKind.SLOW, 7: FlagKind.THROTTLED}


def test_idle_and_application_clocks_are_no_throttling_and_an_idle_node_no_slow_peer() -> None:
    lines = {r: [tel(r, 0, util_pct=2.0 if r else 0.0, throttle=["idle"])] for r in range(4)}
    assert texts(state_of(lines)) == []


def test_the_slow_step_time_flags_the_rank_on_cpu_ranks_too() -> None:
    lines = {
        r: [tel(r, 0)] + [step(n, 1.5 if r == 1 else 0.5) for n in range(1, 6)] for r in (0, 1, 2)
    }
    state = state_of(lines)
    assert state.ranks[1].straggler
    assert texts(state) == [
        "CPU rank 1 on node 0: slow step time (1.50 s/step), far below its peers"
    ]


def test_cpu_rows_carry_cpu_use_and_resident_memory() -> None:
    state = state_of({0: [tel(0)], 1: ["hello"]})
    rows = machines(state.ranks)[0].rows
    assert (rows[0].name, rows[0].gpu, rows[0].cpu_pct, rows[0].rss_bytes) == (
        "CPU rank 0",
        False,
        99.0,
        3 << 30,
    )
    assert rows[0].sampled and not rows[1].sampled  # rank 1's agent has sent nothing yet


def test_ecc_errors_are_flagged() -> None:
    state = state_of({0: [tel(0, ecc_uncorrected=2, xids=[79])]})
    assert texts(state) == ["GPU 0 on node 0: 2 uncorrected ECC error(s); XID 79 (drain the node)"]


PLAN = {"recommended": {"step_time_s": 1.2, "mfu": 0.5, "memory_per_gpu": {"total": 40 << 30}}}


def test_plan_vs_measured_offers_calibrate_past_the_margin() -> None:
    state = state_of(
        {r: [tel(r, 0, util_pct=97.0)] + [step(n, 1.8) for n in range(1, 6)] for r in (0, 1)}
    )
    pvm = compare(plan_figures(PLAN), state.ranks)
    assert pvm is not None and pvm.disagrees
    assert pvm.line() == (
        "plan vs measured (±15 %): step 1.80 s vs 1.20 s planned (+50 %), "
        "peak mem 50.0 GiB vs 40.0 GiB planned (+25 %), "
        "MFU 33 % vs 50 % planned (-33 %): press k to calibrate"
    )


def test_plan_vs_measured_within_the_margin_offers_nothing() -> None:
    t = 1.2 * (1 + MARGIN * 0.9)
    state = state_of({0: [step(n, t) for n in range(1, 6)]})  # CPU: the step lines' mem_gb
    pvm = compare(
        plan_figures({"recommended": {"step_time_s": 1.2, "memory_per_gpu": {"total": 1.2e9}}}),
        state.ranks,
    )
    assert pvm is not None and not pvm.disagrees
    assert pvm.line().endswith(
        "(+13 %), peak mem 1.1 GiB vs 1.1 GiB planned (+0 %): within the margin"
    )


def test_nothing_to_compare_without_a_plan_or_a_measurement(tmp_path: Path) -> None:
    state = state_of({0: ["hello"]})
    assert compare(None, state.ranks) is None
    assert compare(plan_figures(PLAN), state.ranks) is None
    assert read_plan_figures(tmp_path) is None
    (tmp_path / "plan.json").write_text("{not json")
    assert read_plan_figures(tmp_path) is None
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    got = read_plan_figures(tmp_path)
    assert got is not None and (got.step_time_s, got.mfu, got.mem_bytes) == (1.2, 0.5, 40 << 30)

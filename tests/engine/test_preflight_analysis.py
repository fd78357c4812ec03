"""The preflight's analysis (:mod:`engine.diagnose.preflight`) on results built in the shape rank
0 prints, the rank-side pairing (DLRover's re-pairing), and the node scripts' switch to
``preflight.py`` run under bash as torchrun would receive it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.diagnose.preflight import (
    CPU_SLOW_FACTOR,
    GLOO_FLOOR_GBPS,
    RESULT_MARK,
    analyze,
    parse_result_line,
    report_lines,
    verdict_line,
)
from engine.errors import DtrainError
from engine.plan.catalog import get_gpu, get_network
from engine.plan.names import NetworkTier

MIB = 1 << 20


def _sweep(n: int, busbw_top: float, sizes: tuple[int, ...] = (1, 4, 16)) -> list[dict[str, Any]]:
    f = 2 * (n - 1) / n
    rows = []
    for s in sizes:
        bus = busbw_top * s / sizes[-1] if s != sizes[-1] else busbw_top
        alg = bus / f
        rows.append(
            {"bytes": s * MIB, "seconds": s * MIB / alg / 1e9, "algbw_gbps": alg, "busbw_gbps": bus}
        )
    return rows


def _raw(
    nodes: int,
    per_node: int,
    *,
    backend: str = "gloo",
    busbw: float = 1.0,
    intra: list[float] | None = None,
    pairs: list[tuple[int, int, int, float]] = (),  # type: ignore[assignment]
    gemm: list[float] | None = None,
    dtype: str = "float32",
) -> dict[str, Any]:
    world = nodes * per_node
    return {
        "version": 1,
        "backend": backend,
        "device": "cpu" if backend == "gloo" else "NVIDIA H100 80GB HBM3",
        "world_size": world,
        "nodes": nodes,
        "gpus_per_node": per_node,
        "hostnames": [f"host{r // per_node}" for r in range(world)],
        "allreduce": _sweep(world, busbw),
        "intra_node": [
            {"node": i, "ranks": per_node, "bytes": 4 * MIB, "seconds": 0.01, "busbw_gbps": b}
            for i, b in enumerate(intra or [])
        ],
        "pairs": [
            {"round": r, "nodes": [a, b], "bytes": 4 * MIB, "seconds": 0.01, "busbw_gbps": bw}
            for r, a, b, bw in pairs
        ],
        "gemm": [
            {"rank": r, "node": r // per_node, "tflops": t, "n": 384, "dtype": dtype}
            for r, t in enumerate(gemm or [0.1] * world)
        ],
        "elapsed_s": 1.0,
    }


def test_busbw_is_nccl_tests_definition_and_a_healthy_cpu_world_is_ok() -> None:
    raw = _raw(1, 2, busbw=0.8)
    rep = analyze(raw, None, ["localhost"])
    assert rep.verdict == "ok" and rep.exit_code == 0 and rep.findings == ()
    top = rep.allreduce[-1]
    assert top.bytes == 16 * MIB and top.busbw_gbps == pytest.approx(top.algbw_gbps * 2 * 1 / 2)
    assert rep.measured.allreduce_busbw_gbps == 0.8
    assert rep.measured.inter_node_busbw_gbps is None  # one node: no inter-node figure
    assert rep.expected.busbw_gbps == GLOO_FLOOR_GBPS
    # "localhost" is the launcher's placeholder: the rank's own hostname names the node.
    assert rep.hosts == ("host0",)
    text = "\n".join(report_lines(rep))
    assert "16 MiB" in text and "one node: no pairs" in text and "Verdict: ok" in text
    data = json.loads(rep.to_json())
    assert set(data["measured"]) >= {"inter_node_busbw_gbps", "gemm_tflops"}


def test_gloo_below_its_floor_is_a_fabric_finding() -> None:
    rep = analyze(_raw(1, 2, busbw=GLOO_FLOOR_GBPS / 10), None, [])
    assert [f.kind for f in rep.findings] == ["fabric"]
    assert rep.exit_code == 1 and "below" in rep.findings[0].message


def test_a_slow_rank_gemm_is_named_with_its_host() -> None:
    raw = _raw(1, 2, gemm=[0.15, 0.15 / (3 * CPU_SLOW_FACTOR)])
    rep = analyze(raw, None, ["10.0.0.7"])
    assert [(f.kind, f.where) for f in rep.findings] == [("gpu", "rank 1 on node 0 (10.0.0.7)")]
    assert [g.slow for g in rep.gemm] == [False, True]
    assert verdict_line(rep).startswith("preflight slow rank: rank 1 on node 0 (10.0.0.7)")


def test_two_nodes_intra_node_comparison_names_the_slow_node_not_a_link() -> None:
    raw = _raw(2, 2, intra=[1.0, 0.05], pairs=[(1, 0, 1, 0.1)])
    rep = analyze(raw, None, ["127.0.0.1:2201", "127.0.0.1:2202"])
    assert [(f.kind, f.where) for f in rep.findings] == [("node", "node 1 (127.0.0.1:2202)")]
    assert rep.findings[0].hosts == ("127.0.0.1:2202",)
    assert [r.slow for r in rep.intra_node] == [False, True]
    assert rep.measured.inter_node_busbw_gbps == rep.measured.allreduce_busbw_gbps
    # Each node against the others: a 6x gap is found even where the median of both (the
    # slow one included) would need 9x.
    rep2 = analyze(_raw(2, 2, intra=[0.25, 0.04], pairs=[(1, 0, 1, 0.1)]), None, ["a", "b"])
    assert [(f.kind, f.where) for f in rep2.findings] == [("node", "node 1 (b)")]


def test_repairing_names_a_node_slow_in_both_rounds() -> None:
    # Round 1: 0-1 fast, 2-3 slow; round 2 (slowest with fastest): 0-3 fast, 1-2 slow: node 2.
    pairs = [(1, 0, 1, 1.0), (1, 2, 3, 0.05), (2, 0, 3, 0.9), (2, 1, 2, 0.05)]
    rep = analyze(_raw(4, 1, pairs=pairs), None, ["a", "b", "c", "d"])
    assert [(f.kind, f.where) for f in rep.findings] == [("node", "node 2 (c)")]
    assert [p.slow for p in rep.pairs] == [False, True, False, True]


def test_a_slow_pair_of_healthy_nodes_is_a_link() -> None:
    # 2-3 is slow in round 1 only; both are fast with other nodes in round 2.
    pairs = [(1, 0, 1, 1.0), (1, 2, 3, 0.05), (2, 0, 3, 0.9), (2, 1, 2, 1.1)]
    rep = analyze(_raw(4, 1, pairs=pairs), None, ["a", "b", "c", "d"])
    assert [(f.kind, f.where) for f in rep.findings] == [("link", "nodes 2-3 (c - d)")]
    assert rep.findings[0].hosts == ("c", "d")


def _gpu_plan(tier: str = "ib-ndr", gpu: str = "h100-sxm") -> dict[str, Any]:
    return {"gpu": {"key": gpu}, "spec": {"network": {"tier": tier}}}


def test_gpu_world_against_the_plans_network_and_gemm_peak() -> None:
    net = get_network(NetworkTier.IB_NDR)
    expected = net.gbps_per_node / 8 * net.efficiency
    h100 = get_gpu("h100-sxm")
    raw = _raw(
        2, 8, backend="nccl", busbw=expected * 0.3, intra=[380.0, 385.0],
        pairs=[(1, 0, 1, expected * 0.3)], gemm=[700.0] * 15 + [450.0], dtype="bfloat16",
    )  # fmt: skip
    rep = analyze(raw, _gpu_plan(), ["gpu-a", "gpu-b"])
    assert rep.expected.busbw_gbps == pytest.approx(expected)
    assert "InfiniBand NDR" in rep.expected.basis
    assert rep.expected.gemm_tflops == pytest.approx(h100.bf16_tflops * h100.gemm_efficiency)
    kinds = [(f.kind, f.where) for f in rep.findings]
    assert ("fabric", "world") in kinds
    assert ("link", "nodes 0-1 (gpu-a - gpu-b)") in kinds  # below half the plan's figure
    assert ("gpu", "rank 15 on node 1 (gpu-b)") in kinds  # 450 < 700 / 1.25
    assert rep.gemm[0].of_peak == pytest.approx(700.0 / rep.expected.gemm_tflops)
    # A bandwidth the spec gives overrides the tier's line rate.
    plan = _gpu_plan()
    plan["spec"]["network"]["bandwidth_gbps"] = 400
    assert analyze(raw, plan, []).expected.busbw_gbps == pytest.approx(400 / 8 * net.efficiency)


def test_one_gpu_node_is_held_to_its_scale_up_link() -> None:
    h100 = get_gpu("h100-sxm")
    raw = _raw(
        1, 8, backend="nccl", busbw=h100.intra_gbps * 0.75, gemm=[700.0] * 8, dtype="bfloat16"
    )
    rep = analyze(raw, _gpu_plan(), [])
    assert rep.verdict == "ok", rep.findings
    assert "NVLink" in rep.expected.basis or "nvlink" in rep.expected.basis.lower()


def test_result_line_parsing_takes_the_last_object_and_skips_junk() -> None:
    lines = [
        "[dtrain] preflight: 2 ranks on 1 node(s)",
        RESULT_MARK + "{not json",
        RESULT_MARK + json.dumps({"a": 1}),
        "[default0]:" + RESULT_MARK + json.dumps({"a": 2}),
    ]
    assert parse_result_line(lines) == {"a": 2}
    assert parse_result_line(["nothing here"]) is None


@pytest.mark.parametrize(
    "change",
    [
        {"world_size": "two"},
        {"allreduce": []},
        {"gemm": "fast"},
        {"allreduce": [{"bytes": 1, "seconds": 1, "algbw_gbps": None, "busbw_gbps": 1}]},
    ],
)
def test_a_malformed_result_is_one_line_error(change: dict[str, Any]) -> None:
    raw = {**_raw(1, 2), **change}
    with pytest.raises(DtrainError) as e:
        analyze(raw, None, [])
    assert "\n" not in str(e.value) and str(e.value).startswith("preflight: ")


def test_rank_side_pairing_is_dlrovers() -> None:
    from engine.trainer.preflight import busbw_factor, first_pairs, second_pairs

    assert busbw_factor(8) == pytest.approx(1.75) and busbw_factor(2) == 1.0
    assert first_pairs(4) == [[(0, 1), (2, 3)]]
    assert first_pairs(5) == [[(0, 1), (2, 3)], [(4, 0)]]
    # Round-1 times per node: 2 and 3 slow; fastest first: 0, 1, 3, 2 -> 0 with 2, 1 with 3.
    t = {0: 1.0, 1: 1.1, 2: 9.0, 3: 8.0}
    assert second_pairs(4, t) == [[(0, 2), (1, 3)]]
    assert second_pairs(3, {0: 1.0, 1: 5.0, 2: 2.0}) == [[(0, 1)], [(2, 0)]]


def test_node_scripts_run_preflight_py_when_asked(tmp_path: Path) -> None:
    from engine.write import write_bundle
    from tests.engine.test_writers import run_node_script
    from tests.engine.writers_fixtures import make_plan

    plan = make_plan(launch={"script": "my train.py", "script_args": ["--epochs", "2"]})
    out = tmp_path / "b"
    write_bundle(plan, out)
    assert (out / "preflight.py").is_file() and "preflight.py" in (out / "README.md").read_text()
    normal = run_node_script(out, 0, tmp_path)["argv"]
    pre = run_node_script(out, 0, tmp_path, {"DTRAIN_PREFLIGHT": "1"})["argv"]
    i = normal.index("my train.py")
    assert normal[i + 1 :] == ["--epochs", "2"]
    assert pre[:i] == normal[:i] and pre[i] == "preflight.py" and pre[i + 1 :] == normal[i + 1 :]


def test_bad_preflight_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli import main
    from engine.write import write_bundle
    from tests.engine.writers_fixtures import make_plan

    out = tmp_path / "b"
    write_bundle(make_plan(), out)
    cases = [
        (["--backend", "local", "--max-mb", "0"], "--max-mb"),
        (["--backend", "local", "--deadline", "-1"], "--deadline"),
    ]
    for extra, field in cases:
        code = main(["preflight", str(out), "--run-dir", str(tmp_path / "r"), *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and field in err[0], (extra, err)
        assert not (tmp_path / "r").exists()
    (out / "preflight.py").unlink()
    assert main(["preflight", str(out), "--backend", "local"]) == 2
    assert "has no preflight.py" in capsys.readouterr().err

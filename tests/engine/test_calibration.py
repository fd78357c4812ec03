"""Calibration: the fit from a run directory (real planner, run directories made here with the
trainer's step-line format), the planner applying it, the named store, and bad input refused in
one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cli import main
from engine.monitor.calibrate import calibrate_run
from engine.plan.calibration import (
    GIB,
    Calibration,
    CalibrationError,
    CalibrationSource,
    calibrated_usable,
    min_run_steps,
    solve_compute,
)
from engine.plan.catalog import get_gpu, get_network
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
from engine.write.plan_json import plan_json
from profiles.calibrations import CalibrationStore
from profiles.schema import ProfileError
from profiles.store import ProfileStore

TINY = Spec(
    model=ModelSpec(layers=2, hidden=64, heads=4, vocab=256),
    hardware=HardwareSpec(gpu="cpu", gpus_per_node=2),
    training=TrainingSpec(seq_len=32, global_batch=4),
)
MULTI = Spec(
    model=ModelSpec(preset="llama-3-8b"),
    hardware=HardwareSpec(gpu="h100", gpus_per_node=8, nodes=2),
    network=NetworkSpec(tier="ib-ndr"),
    training=TrainingSpec(seq_len=4096, global_batch=64),
)


def step_line(n: int, total: int, t: float, mem_gb: float = 0.3) -> str:
    return (
        f"[dtrain] step={n}/{total} loss=5.0000 tokens_per_s={64 / t:.1f} step_time_s={t:.6f} "
        f"mem_gb={mem_gb:.3f}\n"
    )


def make_run(
    root: Path,
    spec: Spec,
    times: list[float],
    *,
    ranks: int = 2,
    slow_rank_extra: float = 0.0,
    mem_gb: float = 0.3,
) -> tuple[Path, float]:
    """A run directory: the plan.json launch copies and rank logs with ``times``; returns it
    and the plan's predicted step time."""
    run = root / "run-a"
    (run / "logs").mkdir(parents=True)
    p = plan(spec)
    (run / "plan.json").write_text(plan_json(p))
    for r in range(ranks):
        extra = slow_rank_extra if r == ranks - 1 else 0.0
        lines = [step_line(i + 1, len(times), t + extra, mem_gb) for i, t in enumerate(times)]
        (run / "logs" / f"rank{r}.stdout.log").write_text("torchrun chatter\n" + "".join(lines))
    return run, p.recommended.step_time_s


def test_fit_matches_the_measured_median_and_names_the_run(tmp_path: Path) -> None:
    predicted = plan(TINY).recommended.step_time_s
    slow = 2.5 * predicted
    # Two warm-up steps far slower, one slow rank: the step lasts as long as its slowest rank.
    times = [50 * predicted, 20 * predicted] + [slow] * 10
    run, _ = make_run(tmp_path, TINY, times, slow_rank_extra=0.5 * predicted)
    res = calibrate_run(run, name="tiny")
    cal = res.calibration
    measured = slow + 0.5 * predicted
    assert cal.source.measured_step_time_s == pytest.approx(measured, rel=1e-4)
    assert cal.source.warmup_steps == 2 and cal.source.steps == 10
    assert res.after.recommended.step_time_s == pytest.approx(measured, rel=0.01)
    assert res.before.recommended.step_time_s == pytest.approx(predicted)
    assert cal.compute < 1.0 and cal.network == 1.0 and cal.network_tier == ""
    assert cal.source.calibrated_step_time_s == pytest.approx(measured, rel=0.01)
    assert cal.label().startswith("calibrated from run run-a (compute ×0.")
    assert cal.label().endswith(", network ×1.0)")
    # Measured peak (0.3 GB) less the prediction.
    assert cal.memory_overhead_gib == pytest.approx(
        0.3e9 / GIB - res.before.recommended.memory_per_gpu.total / GIB, abs=1e-3
    )


def test_faster_run_fits_a_factor_above_one(tmp_path: Path) -> None:
    predicted = plan(TINY).recommended.step_time_s
    run, _ = make_run(tmp_path, TINY, [predicted * 0.9] * 12)
    cal = calibrate_run(run).calibration
    assert cal.compute > 1.0
    assert cal.name == "run-a"


def test_a_cpu_rank_far_faster_than_its_nominal_figures_still_fits(tmp_path: Path) -> None:
    # A CPU rank's 0.5 TFLOPS is nominal: a fast machine ran this plan in 0.6 of the time the
    # figures allow at their "peak" (a GEMM efficiency of 1), and calibrate refused it. It now
    # scales the rank's rates, and the re-plan meets the measurement.
    predicted = plan(TINY).recommended.step_time_s
    run, _ = make_run(tmp_path, TINY, [predicted * 0.4] * 12)
    res = calibrate_run(run)
    assert res.calibration.compute > 2.0
    assert res.after.recommended.step_time_s == pytest.approx(predicted * 0.4, rel=0.01)


def test_planner_applies_and_names_it() -> None:
    src = CalibrationSource(run="r1", run_dir="/runs/r1", date="2026-01-01T00:00:00Z")
    cal = Calibration(
        name="c", gpu="h100-sxm", network_tier="ib-ndr", compute=0.5, network=0.5, source=src
    )
    base = plan(MULTI)
    p = plan(MULTI.model_copy(update={"calibration": cal}))
    assert base.calibration is None and base.to_json_dict()["calibration"] is None
    assert p.calibration == cal
    assert p.to_json_dict()["calibration"]["compute"] == 0.5
    assert p.path[1].question == "Which efficiency figures?"
    assert p.path[1].answer == "calibrated from run r1 (compute ×0.5, network ×0.5)"
    assert p.gpu.inter_node_gbps == pytest.approx(base.gpu.inter_node_gbps * 0.5)
    assert p.recommended.step_time_s > base.recommended.step_time_s * 1.5
    # Another network tier: the compute factor applies, the network factor does not.
    efa = MULTI.model_copy(update={"calibration": cal, "network": NetworkSpec(tier="efa")})
    q = plan(efa)
    assert q.gpu.inter_node_gbps == pytest.approx(
        plan(MULTI.model_copy(update={"network": NetworkSpec(tier="efa")})).gpu.inter_node_gbps
    )
    assert "network factor not applied" in q.path[1].reason


def test_calibration_for_another_gpu_is_not_applied() -> None:
    src = CalibrationSource(run="r1", run_dir="/runs/r1", date="2026-01-01T00:00:00Z")
    cal = Calibration(name="a100s", gpu="a100-80gb", compute=0.5, source=src)
    p = plan(MULTI.model_copy(update={"calibration": cal}))
    assert p.calibration is None
    assert p.recommended.step_time_s == pytest.approx(plan(MULTI).recommended.step_time_s)
    assert any("'a100s' was measured on a100-80gb, not h100-sxm" in w for w in p.warnings)


def test_memory_overhead_shrinks_what_fits() -> None:
    src = CalibrationSource(run="r1", run_dir="/runs/r1", date="2026-01-01T00:00:00Z")
    gpu = get_gpu("cpu")
    full = Calibration(name="m", gpu="cpu", memory_overhead_gib=8.0, source=src)
    assert calibrated_usable(full, gpu, 7 * GIB) == 0
    assert (
        calibrated_usable(full.model_copy(update={"memory_overhead_gib": -100.0}), gpu, 7 * GIB)
        == gpu.memory_bytes
    )
    assert calibrated_usable(full.model_copy(update={"gpu": "h100-sxm"}), gpu, 7 * GIB) == 7 * GIB
    forced = TINY.model_copy(update={"layout": LayoutSpec(strategy="ddp"), "calibration": full})
    assert plan(TINY.model_copy(update={"layout": LayoutSpec(strategy="ddp")})).recommended.fits
    assert not plan(forced).recommended.fits


def test_network_factor_from_a_preflight(tmp_path: Path) -> None:
    predicted = plan(MULTI).recommended.step_time_s
    run, _ = make_run(tmp_path, MULTI, [predicted * 1.3] * 12, ranks=16, mem_gb=60.0)
    pre = tmp_path / "pre"
    pre.mkdir()
    net = get_network("ib-ndr")
    modelled = net.gbps_per_node / 8 * net.efficiency
    (pre / "preflight.json").write_text(
        json.dumps({"measured": {"inter_node_busbw_gbps": modelled * 0.6}})
    )
    res = calibrate_run(run, preflight=pre)
    cal = res.calibration
    assert cal.network == pytest.approx(0.6) and cal.network_tier == "ib-ndr"
    assert "inter-node bus bandwidth" in cal.source.measured
    assert res.after.recommended.step_time_s == pytest.approx(predicted * 1.3, rel=0.01)
    # No inter-node figure (one node): network stays 1.0.
    (pre / "preflight.json").write_text(json.dumps({"measured": {"inter_node_busbw_gbps": None}}))
    assert calibrate_run(run, preflight=pre).calibration.network == 1.0
    # A figure that cannot be this fabric: refused, naming the option.
    (pre / "preflight.json").write_text(
        json.dumps({"measured": {"inter_node_busbw_gbps": modelled * 50}})
    )
    with pytest.raises(CalibrationError, match="--preflight: the preflight measured"):
        calibrate_run(run, preflight=pre)


@pytest.mark.parametrize(
    ("times", "ranks", "match"),
    [
        ([], 2, "has no step lines"),
        ([0.01] * (min_run_steps() - 1), 2, f"at least {min_run_steps()} steps"),
        ([0.01] * 12, 3, "logs have rank 2 but its plan.json is for 2 rank"),
        ([1e3] * 12, 2, "bound by something the model does not have"),
        ([2e-5] * 12, 2, "faster than the plan's"),
    ],
)
def test_runs_it_cannot_use_are_refused(
    tmp_path: Path, times: list[float], ranks: int, match: str
) -> None:
    run, _ = make_run(tmp_path, TINY, times, ranks=ranks)
    with pytest.raises(CalibrationError, match=match) as e:
        calibrate_run(run)
    assert "\n" not in str(e.value) and str(e.value).startswith("RUN_DIR: ")


def test_plan_json_missing_or_broken(tmp_path: Path) -> None:
    run, _ = make_run(tmp_path, TINY, [0.01] * 12)
    (run / "plan.json").write_text("{not json")
    with pytest.raises(CalibrationError, match="is not a readable plan"):
        calibrate_run(run)
    (run / "plan.json").write_text(json.dumps({"model": {}}))
    with pytest.raises(CalibrationError, match="no 'spec' and 'recommended'"):
        calibrate_run(run)
    (run / "plan.json").unlink()
    with pytest.raises(CalibrationError, match="has no plan.json"):
        calibrate_run(run)


def test_a_run_of_another_plan_is_refused(tmp_path: Path) -> None:
    run, _ = make_run(tmp_path, TINY, [0.01] * 12)
    data = json.loads((run / "plan.json").read_text())
    data["recommended"]["grad_accum"] = 2  # not what this spec's layout trains
    (run / "plan.json").write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match="a different plan"):
        calibrate_run(run)


def test_profile_on_another_gpu_refused(tmp_path: Path) -> None:
    run, _ = make_run(tmp_path, TINY, [0.01] * 12)
    with pytest.raises(CalibrationError, match="planned for cpu, not h100-sxm"):
        calibrate_run(run, expect_gpu="h100")


def test_solve_compute_inverts_a_monotone_model() -> None:
    def predict(c: float) -> float:
        return 0.2 + 1.0 / c

    assert solve_compute(predict, 0.2 + 1 / 0.37, "r") == pytest.approx(0.37, rel=1e-9)
    with pytest.raises(CalibrationError):
        solve_compute(predict, 0.1, "r")
    capped = solve_compute(predict, predict(1.5), "r", span=(0.02, 1.5))
    assert math.isclose(capped, 1.5, rel_tol=1e-9)
    with pytest.raises(CalibrationError, match="faster than the plan's"):
        solve_compute(predict, predict(1.6), "r", span=(0.02, 1.5))


@pytest.mark.parametrize(("gpu", "compute"), [("h100-sxm", 9.0), ("cpu", 900.0), ("cpu", 0.001)])
def test_factors_out_of_range_are_refused_on_load(tmp_path: Path, gpu: str, compute: float) -> None:
    store = CalibrationStore(tmp_path)
    store.directory.mkdir(parents=True)
    src = CalibrationSource(run="r", run_dir="/r", date="2026-01-01T00:00:00Z").model_dump()
    bad = {"name": "x", "gpu": gpu, "compute": compute, "source": src}
    (store.directory / "x.json").write_text(json.dumps(bad))
    with pytest.raises(ProfileError, match=r"x\.json is not a calibration: .*compute") as e:
        store.load("x")
    assert "\n" not in str(e.value)


def test_store_round_trip_never_overwrites_and_attaches(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path)
    src = CalibrationSource(run="r", run_dir="/r", date="2026-01-01T00:00:00Z")
    cal = Calibration(name="c1", gpu="cpu", compute=0.4, source=src)
    path = store.save(cal)
    assert path.stat().st_mode & 0o777 == 0o600
    assert store.load("c1") == cal and store.names() == ["c1"]
    with pytest.raises(ProfileError, match="exists .*--force"):
        store.save(cal.model_copy(update={"compute": 0.5}))
    assert store.load("c1").compute == 0.4
    store.save(cal.model_copy(update={"compute": 0.5}), overwrite=True)
    assert store.load("c1").compute == 0.5
    assert [p.name for p in store.directory.iterdir()] == ["c1.json"]  # no temp file left
    with pytest.raises(ProfileError, match="no calibration named 'c1x'; did you mean 'c1'"):
        store.load("c1x")
    with pytest.raises(ProfileError, match="is not a calibration name"):
        store.path("../x")
    profiles = ProfileStore(tmp_path)
    profiles.save_spec("p", TINY)
    store.attach("p", "c1")
    assert profiles.load("p").profile.calibration == "c1"
    assert 'calibration = "c1"' in profiles.user_path("p").read_text()


def test_cli_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a directory" in err
    assert (
        main(["plan", *_tiny_args(), "--config-dir", str(tmp_path), "--calibration", "missing"])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--calibration: no calibration named 'missing'" in err


def test_cli_calibrate_saves_and_plan_uses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    predicted = plan(TINY).recommended.step_time_s
    run, _ = make_run(tmp_path, TINY, [3 * predicted] * 12)
    cfg = tmp_path / "cfg"
    assert main(["calibrate", str(run), "--config-dir", str(cfg), "--name", "c"]) == 0
    out = capsys.readouterr().out
    assert "Calibration 'c' from run run-a" in out and "after" in out and "(±0%)" in out
    assert (
        main(["plan", *_tiny_args(), "--config-dir", str(cfg), "--calibration", "c", "--json"]) == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["calibration"]["name"] == "c"
    assert data["recommended"]["step_time_s"] == pytest.approx(3 * predicted, rel=0.01)
    # A calibration file by path works too.
    f = str(cfg / "calibrations" / "c.json")
    assert main(["plan", *_tiny_args(), "--calibration", f, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["calibration"]["name"] == "c"


def _tiny_args() -> list[str]:
    return [
        "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--gpu", "cpu",
        "--gpus-per-node", "2", "--seq-len", "32", "--global-batch", "4",
    ]  # fmt: skip

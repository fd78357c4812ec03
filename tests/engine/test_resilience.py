"""What failures will cost, before the run (engine/plan/resilience.py): each figure against a
hand computation, the interruption rate against the published fleet figure it comes from
(tests/data/fleet_failures.json), and the figures in ``plan``, ``plan --json`` and the spec."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from engine.plan.names import CkptStorage, Framework, Strategy
from engine.plan.planner import plan
from engine.plan.resilience import (
    FLEET_FIGURES,
    PARALLEL_FS_AGGREGATE_GBPS,
    RESTART_S,
    STORAGE_GBPS,
    goodput,
    summary_lines,
    young_interval_s,
)
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, Spec, TrainingSpec

DATA = Path(__file__).parents[1] / "data" / "fleet_failures.json"
ROOT = Path(__file__).parents[2]


def _llama70b(nodes: int = 4, **training: object) -> Spec:
    return Spec(
        model=ModelSpec(preset="llama-3-70b"),
        hardware=HardwareSpec(gpu="h100", gpus_per_node=8, nodes=nodes),
        training=TrainingSpec.model_validate({"seq_len": 4096, "global_batch": 256, **training}),
    )


def test_interruption_rate_is_llama3s_published_figure() -> None:
    data = json.loads(DATA.read_text())
    llama = data["fleets"][0]
    assert llama["interruptions_unexpected"] == 419
    assert llama["interruptions_total"] - llama["interruptions_planned"] == 419
    fig = FLEET_FIGURES[0]
    assert (fig.interruptions, fig.days, fig.gpus) == (419, llama["days"], llama["gpus"])
    # 419 / (54 days x 24 h x 16,384 GPUs) = 1.9733e-5 per GPU-hour: about one every three
    # hours on the whole fleet, as the issue quotes.
    assert fig.per_gpu_hour == pytest.approx(1.9733e-5, rel=1e-4)
    assert 1 / (fig.per_gpu_hour * 16384) == pytest.approx(54 * 24 / 419)
    assert (
        PARALLEL_FS_AGGREGATE_GBPS
        == data["storage"]["parallel_fs_aggregate"]["sustained_tb_per_s"] * 1000 * 8
    )


def test_worst_case_rate_is_opts_published_figure_and_priced_by_hand() -> None:
    opt = json.loads(DATA.read_text())["fleets"][1]
    assert opt["interruptions_manual"] + opt["interruptions_automatic_estimated"] == 105
    fig = FLEET_FIGURES[1]
    assert (fig.interruptions, fig.days, fig.gpus) == (105, opt["days"], opt["gpus"])
    # 105 / (60 days x 24 h x 992 GPUs) = 7.35e-5 per GPU-hour: 3.7 times Llama 3's rate.
    assert fig.per_gpu_hour == pytest.approx(7.3505e-5, rel=1e-4)
    assert fig.per_gpu_hour / FLEET_FIGURES[0].per_gpu_hour == pytest.approx(3.725, rel=1e-3)
    r = plan(_llama70b(nodes=4, ckpt_dir="/shared/ckpt")).resilience
    assert r is not None and r.worst_source == fig.name and r.worst_mtbf_s is not None
    assert r.worst_mtbf_s == pytest.approx(3600 / (7.3505e-5 * 32), rel=1e-4)
    period = r.every * plan(_llama70b(nodes=4, ckpt_dir="/shared/ckpt")).recommended.step_time_s
    by_hand = (
        period
        / (period + r.save_s)
        * (1 - (r.restart_s + (period + r.save_s) / 2) / r.worst_mtbf_s)
    )
    assert r.worst_goodput == pytest.approx(by_hand, rel=1e-9)
    assert r.worst_goodput < r.goodput
    line = summary_lines(r)[3]
    assert line.startswith(f"at the worst published rate, {fig.name}: 3.7x as often"), line


def test_checkpoint_size_and_save_time_by_hand() -> None:
    p = plan(_llama70b(ckpt_bandwidth_gbps=100.0))
    r = p.resilience
    assert r is not None and p.recommended.framework == Framework.MEGATRON
    psi = p.model.params_total
    # Megatron under bf16 with AdamW: 2 B of bf16 weights, 4 of fp32 master, 8 of moments.
    assert r.ckpt_bytes_total == pytest.approx(14 * psi, rel=1e-6)
    mem = p.recommended.memory_per_gpu
    assert r.ckpt_bytes_per_gpu == mem.params + mem.optimizer
    # 4 nodes each write a quarter at 100 Gbit/s = 12.5 GB/s.
    assert r.save_s == pytest.approx(14 * psi / 4 / 12.5e9, rel=1e-6)
    assert r.bandwidth_source == "--ckpt-bandwidth-gbps"


def test_fsdp_checkpoint_is_sharded_over_every_gpu() -> None:
    for strategy, shards in ((Strategy.FSDP_FULL, 16), (Strategy.FSDP_HYBRID, 8)):
        spec = _llama70b(nodes=2).model_copy(
            update={
                "layout": LayoutSpec(framework=Framework.FSDP, strategy=strategy),
                "model": ModelSpec(preset="llama-3-8b"),
            }
        )
        p = plan(spec)
        r = p.resilience
        assert r is not None and p.recommended.strategy == strategy
        # FSDP: fp32 sharded parameters (the master copy) and AdamW's two fp32 moments: 12 B.
        assert r.ckpt_bytes_total == pytest.approx(12 * p.model.params_total, rel=1e-6)
        # Sharded over all 16 GPUs, or over the 8 of a node and replicated across the two.
        assert r.ckpt_bytes_per_gpu == pytest.approx(r.ckpt_bytes_total / shards, rel=1e-3)


def test_default_bandwidth_per_storage_kind() -> None:
    one = plan(_llama70b(nodes=1)).resilience
    many = plan(_llama70b(nodes=4)).resilience
    s3 = plan(_llama70b(nodes=4, ckpt_storage=CkptStorage.OBJECT)).resilience
    assert one is not None and many is not None and s3 is not None
    assert (one.storage, one.bandwidth_gbps) == ("local", STORAGE_GBPS[CkptStorage.LOCAL][0])
    assert (many.storage, many.bandwidth_gbps) == ("parallel-fs", 40.0)
    assert (s3.storage, s3.bandwidth_gbps) == ("object", 8.0)
    assert one.bandwidth_source == STORAGE_GBPS[CkptStorage.LOCAL][1]
    assert many.save_s == pytest.approx(many.ckpt_bytes_total / 4 / 5e9, rel=1e-6)


def test_parallel_fs_default_caps_the_fleets_aggregate() -> None:
    big = plan(_llama70b(nodes=2048, global_batch=2048)).resilience
    assert big is not None
    # 2,048 nodes at 5 GB/s would be 10 TB/s; the file system takes 2 TB/s.
    assert big.save_s == pytest.approx(big.ckpt_bytes_total / 2e12, rel=1e-6)


def test_mtbf_interval_and_goodput_by_hand() -> None:
    p = plan(_llama70b(nodes=4, ckpt_dir="/lustre/ckpt"))
    r = p.resilience
    assert r is not None
    rate = 419 / (54 * 24 * 16384)
    mtbf = 3600 / (rate * 32)
    assert r.mtbf_s == pytest.approx(mtbf)
    tau = math.sqrt(2 * r.save_s * mtbf)
    assert r.interval_s == pytest.approx(tau)
    step = p.recommended.step_time_s
    assert r.interval_steps == max(1, round(tau / step))
    assert r.every == r.interval_steps
    work = r.every * step
    period = work + r.save_s
    assert r.goodput == pytest.approx(work / period * (1 - (RESTART_S + period / 2) / mtbf))
    assert r.lost_per_failure_s == pytest.approx(RESTART_S + period / 2)


def test_young_interval_minimises_the_waste() -> None:
    save, mtbf = 60.0, 4 * 3600.0
    best = young_interval_s(save, mtbf)
    assert best == pytest.approx(math.sqrt(2 * 60 * 14400))  # 1,315 s
    g = goodput(best, save, 0.0, mtbf)
    assert g > goodput(best / 2, save, 0.0, mtbf)
    assert g > goodput(best * 2, save, 0.0, mtbf)
    # 1 - 60/1375 lost to saves, then 1 - 687.7/14400 to the work interruptions lose.
    assert g == pytest.approx(best / (best + save) * (1 - (best + save) / 2 / mtbf))


def test_ckpt_every_overrides_and_zero_loses_the_run_so_far() -> None:
    r = plan(_llama70b(ckpt_every=100)).resilience
    assert r is not None and r.every == 100 and r.interval_steps != 100
    none = plan(_llama70b(ckpt_every=0, tokens=1e11)).resilience
    assert none is not None and none.every == 0
    hours = plan(_llama70b(tokens=1e11)).recommended.gpu_hours
    assert hours is not None
    run_s = hours / 32 * 3600
    assert none.lost_per_failure_s == pytest.approx(RESTART_S + run_s / 2)
    assert none.expected_interruptions == pytest.approx(hours * 419 / (54 * 24 * 16384))


def test_plan_prints_and_json_carries_the_figures() -> None:
    args = [
        sys.executable,
        "-m",
        "cli",
        "plan",
        "--model",
        "llama-3-70b",
        "--gpu",
        "h100",
        "--gpus-per-node",
        "8",
        "--nodes",
        "4",
        "--seq-len",
        "4096",
        "--global-batch",
        "256",
        "--ckpt-bandwidth-gbps",
        "100",
        "--ckpt-shared",
    ]
    text = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "What failures cost" in text.stdout, text.stderr
    assert "988 GB in all" in text.stdout
    assert "19.8 s at 100 Gbit/s" in text.stdout
    out = subprocess.run([*args, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    res = json.loads(out.stdout)["resilience"]
    assert res["bandwidth_gbps"] == 100.0
    assert res["every"] == res["interval_steps"] > 0
    bad = subprocess.run(
        [*args, "--ckpt-every", "-3"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_several_nodes_save_nothing_by_default_without_a_shared_dir() -> None:
    r = plan(_llama70b(nodes=4)).resilience
    assert r is not None and r.every == 0 and r.interval_steps > 0
    assert r.note is not None and "--ckpt-dir" in r.note
    one = plan(_llama70b(nodes=1)).resilience
    assert one is not None and one.every == one.interval_steps and one.note is None
    shared = plan(_llama70b(nodes=4, ckpt_shared=True)).resilience
    assert shared is not None and shared.every == shared.interval_steps

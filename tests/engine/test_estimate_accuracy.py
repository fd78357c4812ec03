"""The accuracy harness (``benchmarks/estimate_accuracy.py``) against the published runs in
``tests/data/published_runs.json``: it scores the real model within a bound, it can fail (a
deliberately wrong model scores far worse), and every layout that really trained on an 80 GB GPU
in the Megatron papers is judged to fit."""

from __future__ import annotations

import copy
import functools
import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from engine.plan import perf
from engine.plan.catalog import get_gpu
from engine.plan.memory import gpu_reserves, gpu_usable_bytes
from engine.plan.names import CpComm, Fp8Recipe, MoeDispatcher, Recompute

ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "estimate_accuracy", ROOT / "benchmarks" / "estimate_accuracy.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["estimate_accuracy"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def harness() -> ModuleType:
    return _harness()


def _mape(h: ModuleType, prefixes: tuple[str, ...]) -> float:
    rows = [r for r in h.load_rows() if r.id.startswith(prefixes)]
    for r in rows:
        h.evaluate(r)
    return float(h.mape([r.error for r in rows if not math.isnan(r.error)]))


def test_the_model_is_within_its_recorded_accuracy(harness: ModuleType) -> None:
    # Korthikanti 2022 Table 5 (Megatron, A100, layouts and recompute as published).
    assert _mape(harness, ("korthikanti2022",)) < 0.15


def test_megatron_papers_within_ten_percent_without_a_size_trend(harness: ModuleType) -> None:
    # Narayanan 2021 (fp16, full recompute, 1.7B at TP1 to 1T at TP8 x PP64, and PTD-P vs ZeRO-3)
    # and Korthikanti 2022: under 10 % on average, and the weak-scaling sweep has no trend with
    # model size (the model was once 25 % fast on the small ones and too slow on the largest).
    assert _mape(harness, ("narayanan2021",)) < 0.10
    assert _mape(harness, ("korthikanti2022",)) < 0.10
    rows = [r for r in harness.load_rows() if r.id.startswith("narayanan2021_t1")]
    for r in rows:
        harness.evaluate(r)
    errors = [r.error for r in rows]
    assert len(errors) == 10
    assert max(abs(e) for e in errors) < 0.12
    assert abs(sum(errors[:3]) / 3 - sum(errors[-3:]) / 3) < 0.10


def test_a_wrong_model_fails_the_harness(
    harness: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every GEMM twice as slow as the GPU really runs it: the harness must see it.
    monkeypatch.setattr(perf, "GEMM_HALF_DIM", 4096)
    assert _mape(harness, ("korthikanti2022",)) > 0.5


def test_spearman_and_ranks() -> None:
    h = _harness()
    assert h.ranks([3.0, 1.0, 2.0, 2.0]) == [4.0, 1.0, 2.5, 2.5]
    assert h.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert h.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)


def test_the_measured_best_is_predicted_near_the_fastest_in_every_sweep(
    harness: ModuleType,
) -> None:
    # The planner issue's criterion: inside each published sweep (held out too, across GPU
    # counts too), the layout that measured fastest is predicted within 5 % of the fastest
    # prediction. The converse (the predicted fastest measures within 5 % of the best) misses
    # one held-out sweep, a 2 % predicted near-tie (docs/accuracy.md).
    rows = harness.load_rows()
    for r in rows:
        harness.evaluate(r)
    for by_size in (True, False):
        sweeps = harness.sweeps(rows, by_size=by_size)
        assert len(sweeps) >= 30
        assert [sw.key for sw in sweeps if not sw.best_predicted_near()] == []
    # It can fail: two layouts predicted 10 % apart the other way round from how they measured.
    fast, slow = (
        SimpleNamespace(measured_tps=110.0, error=0.10),
        SimpleNamespace(measured_tps=100.0, error=-0.10),
    )
    assert not harness.Sweep("x", [fast, slow]).best_predicted_near()


def test_named_reserves_leave_most_of_an_80_gb_part() -> None:
    mem = get_gpu("a100-80gb").memory_bytes
    reserves = gpu_reserves(mem)
    assert set(reserves) == {"cuda_context", "fragmentation"}  # NCCL's: per layout
    usable = gpu_usable_bytes(mem)
    assert usable == mem - sum(reserves.values())
    assert 74 * GIB < usable < 77 * GIB


def test_published_megatron_layouts_on_80_gb_fit(harness: ModuleType) -> None:
    rows = [
        r
        for r in harness.load_rows()
        if r.id.startswith(("korthikanti2022_t5", "narayanan2021_t1", "llama3_405b"))
    ]
    for r in rows:
        harness.evaluate(r)
    judged = [r for r in rows if r.predicted is not None]
    assert len(judged) >= 15
    assert [r.id for r in judged if not r.predicted.fits] == []


def test_zero3_against_ptd_p_ranks_as_measured(harness: ModuleType) -> None:
    # Narayanan et al. 2021 Table 2: at every GPU count DeepSpeed ZeRO-3 trained GPT-3 175B and
    # 530B slower per GPU than Megatron's PTD-P; the fastest layout of each sweep is a PTD-P one.
    rows = [r for r in harness.load_rows() if r.id.startswith("narayanan2021_t2")]
    for r in rows:
        harness.evaluate(r)
    # At each GPU count where both ran (175B at 384, 768 and 1536 GPUs; 530B at 1120 and 2240):
    at_size = harness.sweeps(rows)
    assert len(at_size) == 5
    assert all(sw.figures()[1] for sw in at_size), [sw.key for sw in at_size]
    # And each model's runs across its GPU counts rank as measured.
    series = harness.sweeps(rows, by_size=False)
    assert len(series) == 2
    for sw in series:
        rho, best_ok = sw.figures()
        assert rho >= 0.9, sw.key
        assert best_ok, sw.key


def test_no_published_run_is_timed_with_offload(harness: ModuleType) -> None:
    # A layout that does not fit the memory model must still be timed as it ran (no offload).
    rows = [r for r in harness.load_rows() if r.id.startswith("torchtitan_dec24_t1_8b")]
    for r in rows:
        harness.evaluate(r)
    assert rows and all(r.predicted is not None for r in rows)
    assert all(r.predicted.offload.value == "none" for r in rows)  # type: ignore[union-attr]


def test_llama3_large_runs_mfu_within_ten_percent(harness: ModuleType) -> None:
    # Llama 3 paper Table 4 (held out: TP8 PP16 at 8K and 16K GPUs, and CP16 at 128K). With
    # 16 micro-batches a replica only interleaving (with lighter ends: 126 layers) reaches 41 %.
    assert _mape(harness, ("llama3_405b",)) < 0.10


def test_fsdp2_with_expert_parallelism_fits_as_it_trained(harness: ModuleType) -> None:
    # NeMo AutoModel (FSDP2 + EP on 80 GB H100s): Kimi K2 on 256 GPUs and Qwen3-30B-A3B on 8
    # trained; their experts shard over the EP x FSDP mesh, the fp32 shards are the master.
    rows = [r for r in harness.load_rows() if r.id.startswith("automodel_h100")]
    for r in rows:
        harness.evaluate(r)
    judged = [r for r in rows if r.predicted is not None]
    assert len(judged) == 6
    assert [r.id for r in judged if not r.predicted.fits] == []
    assert all(r.predicted.zero_stage == 3 for r in judged if r.predicted.pp > 1)


def test_torchtitan_h100s_are_the_500_w_hbm2e_part(harness: ModuleType) -> None:
    # torchtitan's benchmark H100s (96GB HBM2e, 2.4 TB/s, 500 W: its own hardware section).
    rows = [r for r in harness.load_rows() if r.id.startswith("torchtitan_dec24")]
    assert rows and {r.spec.hardware.gpu for r in rows} == {"h100-sxm-500w"}
    gpu = get_gpu("h100-sxm-500w")
    assert gpu.hbm_gbps == 2400.0 and 835 < gpu.bf16_tflops < get_gpu("h100-sxm").bf16_tflops


def test_torchtitan_rows_within_fifteen_percent(harness: ModuleType) -> None:
    # Issue 12 round 2: torchtitan was 24 % off (bias -22 %) before its H100s were the 500 W
    # HBM2e part and its TP/PP layouts were timed as the PyTorch-native stack they are.
    assert _mape(harness, ("torchtitan",)) < 0.15


def test_bigscience_sweep_is_held_out_and_every_layout_fits(harness: ModuleType) -> None:
    # BigScience's tr11 topology benchmarks (A100 x 384, fp16, full recompute, TP 2-8 x PP 2-48):
    # held out, within 20 % on average, and every layout that ran on the 80 GB parts fits,
    # including TP8 x PP2 x DP24 at micro-batch 2 (76 GB on nvidia-smi), which fits only with
    # fp16 Megatron's fp16 grads (4 + 16/d bytes a parameter).
    rows = [r for r in harness.load_rows() if r.id.startswith("bigscience_tr11pre")]
    assert len(rows) == 22
    assert not any(r.id.startswith(harness.CALIBRATION) for r in rows)
    for r in rows:
        harness.evaluate(r)
    assert all(r.predicted is not None for r in rows)
    assert [r.id for r in rows if not r.predicted.fits] == []
    assert harness.mape([r.error for r in rows]) < 0.20


def test_megatron_bridge_moe_rows_no_longer_run_far_too_fast(harness: ModuleType) -> None:
    # Issue 12, round 4: the expert all-to-all across nodes at one NIC per GPU, the busiest expert
    # rank, and Megatron's host-bound per-expert launches. Megatron-Bridge's MoE rows (held out)
    # were 31 % fast on average (now 22 %; GPT-OSS on B200 over IB -62 %, now -28 %).
    moe = ("qwen3", "deepseekv3", "gpt_oss")
    rows = [
        r
        for r in harness.load_rows()
        if r.id.startswith(("mbridge2511", "mbridge2602")) and any(m in r.id for m in moe)
    ]
    for r in rows:
        harness.evaluate(r)
    errors = [r.error for r in rows if not math.isnan(r.error)]
    assert len(errors) >= 20
    assert harness.mape(errors) < 0.26
    assert sum(errors) / len(errors) > -0.25
    assert _mape(harness, ("mbridge2511", "mbridge2602")) < 0.19


def test_the_moe_parallel_folding_runs_wait_for_their_all_to_all(harness: ModuleType) -> None:
    # Round 16: Megatron-Core dispatches, computes and combines in sequence, so a layout without
    # the all-to-all overlap waits for all of it. With 20 % of it hidden behind nothing, the
    # paper's fine-grained G8T8 runs (eight routed copies of every token) were 20 % fast on
    # average and the source 13.1 % off; now 15 % and 10.9 %.
    rows = [r for r in harness.load_rows() if r.id.startswith("liu2025")]
    for r in rows:
        harness.evaluate(r)
    fine = [r.error for r in rows if "g8t8" in r.id]
    assert len(fine) == 10
    assert sum(fine) / len(fine) > -0.17
    assert harness.mape([r.error for r in rows]) < 0.12


def test_torchtitan_fsdp2_under_pipelining_holds_its_stage_whole(harness: ModuleType) -> None:
    # torchtitan does not reshard FSDP2 after the forward under PP and accumulates the
    # micro-batches' unsharded fp32 gradients: the stage's 16-bit weights and fp32 gradients stay
    # whole, as Megatron's distributed optimizer keeps them. Stated as ZeRO-3 (sharded weights
    # and gradients), its 405B rows were planned at 32 GiB against 73-85 GiB measured (the
    # allocator's reserved peak, which counts its caching on top).
    rows = [
        r
        for r in harness.load_rows()
        if r.id.startswith("torchtitan_dec24") and r.raw["layout"]["pp"] > 1
    ]
    assert len(rows) == 6
    for r in rows:
        harness.evaluate(r)
        assert r.predicted.zero_stage == 1
        ratio = r.predicted.memory_per_gpu.total / GIB / r.raw["measured"]["peak_memory_gib"]
        assert 0.7 < ratio <= 1.0, (r.id, ratio)


def test_automodel_gpt_oss_runs_with_its_recipes_experts_and_no_recompute(
    harness: ModuleType,
) -> None:
    # AutoModel's benchmark recipes (examples/benchmark/configs/gptoss_{20,120}b_te_deepep.yaml)
    # set ep_size 8 / 64 and no activation checkpointing; the table prints EP "-". Planned as
    # FSDP without EP and with the least recompute that fits, they were +18 % and +33 %.
    # Timed with the balanced routing their fake gate forces (round 15), the 20B one is
    # -23 % (-17 % under the planner's 15 % busiest-rank assumption).
    rows = [r for r in harness.load_rows() if r.id.startswith("automodel_h100_gpt_oss")]
    assert len(rows) == 2
    for r in rows:
        harness.evaluate(r)
        assert r.predicted.ep == r.raw["layout"]["ep"] > 1
        assert r.predicted.recompute.value == "none"
        assert abs(r.error) < 0.25, (r.id, r.error)


def test_stacks_older_than_sequence_parallelism_are_stated_without_it(harness: ModuleType) -> None:
    # Sequence parallelism came with Korthikanti et al. 2022 (Megatron-LM); Narayanan 2021's
    # Megatron-LM and BigScience's Megatron-DeepSpeed (the tr11 topology sweep and BLOOM's
    # tr11-176B-ml.slurm, which passes no --sequence-parallel) ran without it, and a TP > 1
    # row that leaves it unstated would be planned with it.
    rows = [
        r
        for r in harness.load_rows()
        if r.id.startswith(("narayanan2021", "bigscience", "bloom176b")) and r.spec is not None
    ]
    assert any(r.id.startswith("bloom176b") for r in rows)
    tp = [r for r in rows if r.spec.layout.tp > 1]
    assert len(tp) >= 20
    assert not any(r.spec.layout.sequence_parallel for r in tp)


def _sc21_step(
    h: ModuleType,
    *,
    layers: int,
    hidden: int,
    heads: int,
    tp: int,
    pp: int,
    dp: int,
    gbs: int,
    micro_batch: int = 1,
    chunks: int = 1,
) -> float:
    """Planned step time of one configuration of Narayanan et al. 2021's §5.3-5.5 sweeps, as
    Megatron-LM's ``examples/sc21/run_figure_*.sh`` set it up: fp16, full recompute, no
    sequence parallelism, 2048 tokens, DGX A100 nodes (Table 1's 3.6B row, reshaped)."""
    raw = copy.deepcopy(
        next(r.raw for r in h.load_rows() if r.id == "narayanan2021_t1_gpt3.6b_64gpu")
    )
    raw["id"] = "narayanan2021_sc21_figure"
    raw["model"].update(layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn=4 * hidden)
    raw["hardware"].update(nodes=tp * pp * dp // 8, total_gpus=tp * pp * dp)
    raw["layout"].update(tp=tp, pp=pp, dp=dp, virtual_stages=chunks, pipeline_schedule=None)
    raw["training"].update(global_batch=gbs, micro_batch=micro_batch)
    spec, why = h.build_spec(raw)
    assert spec is not None, why
    return float(h.plan(spec).recommended.step_time_s)


def test_narayanan_2021_parallelism_sweeps_keep_their_published_orderings(
    harness: ModuleType,
) -> None:
    # The paper gives its Figs. 11-16 sweeps only as plots; its text states the orderings.
    # Lower step time is higher throughput per GPU here (same GPUs and batch in each sweep).
    step = functools.partial(_sc21_step, harness)
    # Fig. 13 (162B, 32 x 20480, TP x PP = 64): "peak performance ... when the tensor-parallel
    # size is equal to the number of GPUs in a single node (8)".
    for gbs in (32, 128):
        times = {
            t: step(layers=32, hidden=20480, heads=128, tp=t, pp=64 // t, dp=1, gbs=gbs)
            for t in (2, 4, 8, 16, 32)
        }
        assert min(times, key=times.__getitem__) == 8, (gbs, times)
    # Figs. 14 and 15 (5.9B, 32 x 3840, 64 GPUs, micro-batch 1): throughput falls as the
    # pipeline-parallel size grows (against DP), and as the tensor-parallel size grows.
    for gbs in (32, 512):
        pp = [
            step(layers=32, hidden=3840, heads=32, tp=1, pp=p, dp=64 // p, gbs=gbs)
            for p in (2, 4, 8, 16, 32)
        ]
        assert pp == sorted(pp), (gbs, pp)
    for gbs in (32, 128, 512):
        tp = [
            step(layers=32, hidden=3840, heads=32, tp=t, pp=1, dp=64 // t, gbs=gbs)
            for t in (2, 4, 8, 16, 32)
        ]
        assert tp == sorted(tp), (gbs, tp)
    # Fig. 11 (weak scaling, 3 layers a stage of 20480, TP 8): the bubble costs the small batch
    # more than the large one going from 1 to 8 stages.
    loss = {
        gbs: step(layers=24, hidden=20480, heads=128, tp=8, pp=8, dp=1, gbs=gbs)
        / step(layers=3, hidden=20480, heads=128, tp=8, pp=1, dp=1, gbs=gbs)
        for gbs in (8, 128)
    }
    assert loss[8] > loss[128] > 1.0, loss
    # Fig. 12 (GPT-3 175B, TP 8 x PP 12, two layers a virtual stage): interleaving is faster at
    # every batch, the gap closing as the batch grows.
    gain = [
        step(layers=96, hidden=12288, heads=96, tp=8, pp=12, dp=1, gbs=gbs)
        / step(layers=96, hidden=12288, heads=96, tp=8, pp=12, dp=1, gbs=gbs, chunks=4)
        for gbs in (12, 36, 60)
    ]
    assert all(g > 1.0 for g in gain) and gain == sorted(gain, reverse=True), gain
    # Fig. 16 (91B, TP 8 x PP 8, "the best microbatch size is 2") is not kept: under plain 1F1B
    # micro-batch 1 plans 1.5 % faster than 2 at GBS 128 (tests/data/published_runs.md).


def test_megatron_bridge_2509_rows_are_scored_as_fp8_and_token_drop(harness: ModuleType) -> None:
    # 25.09's table has no precision column; its note makes every row FP8 ("different
    # quantization granularities" of the scaling), and its token-drop MoE rows run Megatron-
    # Bridge's token-drop helper (capacity factor 1.0). Every row is scored: the GB200
    # DeepSeek-V3 variant at PP 8 runs EP 32, the most a pipeline stage of 32 GPUs holds (the
    # table's EP 64 cell has no variant; Megatron-Core refuses EP 64 there).
    rows = [r for r in harness.load_rows() if r.id.startswith("mbridge2509")]
    assert len(rows) == 19
    scored = [r for r in rows if r.spec is not None]
    assert len(scored) == 19
    assert all(r.spec.training.precision.value == "fp8" for r in scored)
    drop = [r for r in scored if "tokendrop" in r.id]
    assert len(drop) == 9
    assert all(r.spec.training.moe_capacity_factor == 1.0 for r in drop)
    for r in rows:
        harness.evaluate(r)
    assert sum(1 for r in rows if not math.isnan(r.error)) == 19
    alt = next(r for r in rows if r.id == "mbridge2509_dgx_gb200_deepseekv3__tokendrop_256gpu_alt")
    assert (alt.spec.layout.pp, alt.spec.layout.ep) == (8, 32)


def test_a_stated_interleaving_the_planner_cannot_split_is_timed_as_stated(
    harness: ModuleType,
) -> None:
    # AutoModel's DeepSeek-V3 runs 61 layers over PP 4 with 8 virtual stages a rank: its
    # pipeline splits modules unevenly, which Megatron's rule (every stage's layers divisible
    # by v) and so the planner cannot write. Timed without interleaving, its 8 micro-batches
    # idled 3 of 11 slots in the bubble instead of 3/8 of one (+54 %).
    row = next(r for r in harness.load_rows() if r.id == "automodel_h100_deepseek_v3_671b_256gpu")
    assert harness._uneven_chunks(row.raw) == 8
    assert harness._uneven_chunks({**row.raw, "layout": {**row.raw["layout"], "pp": 1}}) == 0
    planned = harness.plan(row.spec).recommended
    assert planned.virtual_stages == 1
    # Re-timing carries what the planner takes from the spec (DeepEP, expert TP): the planned
    # layout re-timed as planned is the plan's own step.
    assert harness._retimed(row.spec, planned, eager=False) == pytest.approx(planned.step_time_s)
    harness.evaluate(row)
    assert abs(row.error) < 0.25
    assert harness._retimed(row.spec, planned, eager=False, chunks=8) < 0.8 * planned.step_time_s


def test_deepseek_v3s_dualpipe_is_timed_as_the_overlap_it_is(harness: ModuleType) -> None:
    # DualPipe (DeepSeek-V3 report §3.2.1): two model chunks a rank, each chunk's all-to-all
    # under another's computation, which is Megatron-Core's expert-parallel overlap over two
    # virtual stages. Timed as plain 1F1B with its all-to-all exposed, the row was +37 %.
    row = next(r for r in harness.load_rows() if r.id == "deepseekv3_2048xh800_pretrain")
    assert row.spec is not None and row.spec.training.moe_a2a_overlap
    assert harness._uneven_chunks(row.raw) == 2
    harness.evaluate(row)
    assert abs(row.error) < 0.15
    planned = harness.plan(row.spec).recommended
    plain = harness._retimed(row.spec, planned, eager=False)
    assert harness._retimed(row.spec, planned, eager=False, chunks=2) < 0.8 * plain


def test_rows_are_timed_under_the_fp8_recipe_they_name(harness: ModuleType) -> None:
    # Megatron-Bridge's "FP8-MX" / "MXFP8" and 25.09's blockwise rows scale in blocks, its
    # "FP8-CS" and 25.09's per-tensor rows per tensor; DeepSeek-V3 trained fine-grained
    # (1x128 / 128x128) blocks. Held out: on the same layout block scales plan slower, as
    # each pair measured (2-7 % apart).
    rows = {r.id: r for r in harness.load_rows()}
    recipe = {rid: rows[rid].spec.training.fp8_recipe for rid in rows if rows[rid].spec}
    assert recipe["mbridge2511_dgx_b200_llama3_8b_8gpu_fp8_mx"] == Fp8Recipe.MXFP8
    assert recipe["mbridge2511_dgx_b200_llama3_8b_8gpu_fp8_cs"] == Fp8Recipe.TENSORWISE
    assert recipe["mbridge2602_dgx_gb200_llama3_70b_64gpu_mxfp8"] == Fp8Recipe.MXFP8
    assert recipe["mbridge2509_dgx_b200_llama3_8b_8gpu_alt"] == Fp8Recipe.BLOCKWISE
    assert recipe["mbridge2509_dgx_b200_llama3_8b_8gpu"] == Fp8Recipe.TENSORWISE
    assert recipe["deepseekv3_2048xh800_pretrain"] == Fp8Recipe.BLOCKWISE
    assert recipe["mbridge2602_dgx_gb200_llama3_70b_64gpu_fp8"] is None
    assert recipe["narayanan2021_t1_gpt3.6b_64gpu"] is None
    for gpu in ("b200", "gb200", "gb300"):
        pair = [rows[f"mbridge2511_dgx_{gpu}_llama3_8b_8gpu_fp8_{s}"] for s in ("cs", "mx")]
        for r in pair:
            harness.evaluate(r)
        cs, mx = (r.measured_s * (1 + r.error) for r in pair)
        assert 1.0 < mx / cs < 1.1, gpu
        assert pair[1].measured_s > pair[0].measured_s


def test_a_row_retimed_at_its_interleaving_gets_the_planners_choice_there(
    harness: ModuleType,
) -> None:
    # Megatron-Bridge's B200 Llama 3.1 405B runs 126 layers over PP 8 x 8 virtual stages,
    # which the planner cannot split; it plans v 2, where full recompute of one layer and no
    # recompute are 0.1 % apart, and picks them differently for FP8-CS and FP8-MX. Re-timed
    # at v 8 they are 8 % apart, so the harness re-makes the choice at v 8 among the plan's
    # layouts on the same mesh: the two recipes then differ only by the block-scaled rate.
    rows = {r.id: r for r in harness.load_rows()}
    pred = {}
    for recipe in ("cs", "mx"):
        r = rows[f"mbridge2511_dgx_b200_llama3_1_405b_128gpu_fp8_{recipe}"]
        harness.evaluate(r)
        pred[recipe] = r.measured_s * (1 + r.error)
        p = harness.plan(r.spec)
        planned = harness._retimed(r.spec, p.recommended, eager=False, chunks=8)
        assert pred[recipe] <= planned
    assert 1.0 < pred["mx"] / pred["cs"] < 1 / 0.92


def test_nemo_rows_state_what_their_launcher_configs_set(harness: ModuleType) -> None:
    # NeMo 24.07's benchmarks ran the NeMo Framework Launcher's training configs: no activation
    # checkpointing in any of them, and Nemotron-340B's (TP8 PP8 VP12) reduces its gradients
    # in bf16 (optim.grad_sync_dtype). Stated, Nemotron-340B fits without recompute, as it ran;
    # planned with fp32 main grads it needed MLP recompute to fit and was timed 27 % slow.
    rows = {r.id: r for r in harness.load_rows() if r.id.startswith("nemo2407")}
    assert len(rows) == 12
    assert all(r.spec.layout.recompute == Recompute.NONE for r in rows.values())
    big = rows["nemo2407_h100_Nemotron-340B_128gpu"]
    assert big.spec.training.grads_bf16
    assert sum(1 for r in rows.values() if r.spec.training.grads_bf16) == 1
    harness.evaluate(big)
    assert big.predicted.fits and big.predicted.recompute == Recompute.NONE
    assert abs(big.error) < 0.1


def test_llama3s_long_context_run_is_timed_with_its_all_gather(harness: ModuleType) -> None:
    # Llama 3's context parallelism all-gathered K and V on the critical path (§3.3.2): stated
    # on the 128K row, which the ring's overlap made 20 % too fast in MFU.
    rows = {r.id: r for r in harness.load_rows() if r.id.startswith("llama3_")}
    long = rows["llama3_405b_16384gpu_cp16"]
    assert long.spec.training.cp_comm == CpComm.ALLGATHER
    assert [r.spec.training.cp_comm for r in rows.values()].count(None) == 2
    harness.evaluate(long)
    assert long.predicted.cp == 16
    assert abs(long.error) < 0.15


def test_force_balanced_benchmarks_state_their_routing(harness: ModuleType) -> None:
    # Megatron-Bridge's dropless MoE tables ("we force-balance"), AutoModel's ("fake balanced
    # MoE gate") and the Megatron Core MoE report's ("force-balanced routing") route evenly by
    # construction; Liu et al.'s Mixtral runs and DeepSeek-V3's own pre-training route as
    # trained and keep the assumption.
    rows = [r for r in harness.load_rows() if r.raw["model"].get("moe") and r.spec is not None]
    for r in rows:
        forced = r.id.startswith(("automodel", "mcoremoe2026")) or (
            r.id.startswith("mbridge") and not r.spec.training.moe_capacity_factor
        )
        assert r.spec.training.moe_imbalance == (1.0 if forced else None), r.id
    assert sum(r.spec.training.moe_imbalance == 1.0 for r in rows) >= 40


def test_the_megatron_core_moe_report_runs_are_stated_as_they_ran(harness: ModuleType) -> None:
    # arXiv:2603.07685, Table 11 with Appendix B: force-balanced routing, HybridEP / DeepEP,
    # the 1F1B all-to-all overlap where B.2 turns it on, DeepSeek-V3 on H100 at PP 8 (Table
    # 17). Held out: the model was not changed for them.
    rows = {r.id: r for r in harness.load_rows() if r.id.startswith("mcoremoe2026_")}
    assert len(rows) == 9
    overlap = {i for i, r in rows.items() if r.spec.training.moe_a2a_overlap}
    assert overlap == {
        "mcoremoe2026_gb300_deepseekv3_256gpu_mxfp8",
        "mcoremoe2026_h100_deepseekv3_1024gpu_fp8blk",
        "mcoremoe2026_gb200_qwen3_235b_256gpu_mxfp8",
        "mcoremoe2026_gb200_qwen3_235b_256gpu_bf16",
        "mcoremoe2026_h100_qwen3_235b_256gpu_bf16",
    }
    for r in rows.values():
        assert r.spec.training.moe_imbalance == 1.0
        assert r.spec.training.moe_dispatcher == MoeDispatcher.DEEPEP
        harness.evaluate(r)
        assert r.predicted is not None, r.id
        # Every one fits as it ran: the GB200 Qwen3 MXFP8 run with the activations it
        # offloaded (its reproduction command's --offload-modules expert_fc1 moe_act).
        assert r.predicted.fits, r.id
        offloaded = r.id == "mcoremoe2026_gb200_qwen3_235b_256gpu_mxfp8"
        assert bool(r.spec.training.offload_modules) == offloaded, r.id
        assert bool(r.predicted.memory_per_gpu.host_activations) == offloaded, r.id
        # The fp8 and mxfp8 runs keep Adam's moments in bf16 (the benchmark script's
        # --use-precision-aware-optimizer), the bf16 ones in fp32.
        assert r.spec.training.moments_bf16 == ("fp8" in r.id or None), r.id
        # The GB200 DeepSeek-V3 MXFP8 run offloads its optimizer states between steps.
        states = r.id == "mcoremoe2026_gb200_deepseekv3_256gpu_mxfp8"
        assert bool(r.spec.training.offload_optimizer_states) == states, r.id
        assert abs(r.error) < 0.25, (r.id, r.error)
    h100 = rows["mcoremoe2026_h100_deepseekv3_1024gpu_fp8blk"]
    assert (h100.predicted.tp, h100.predicted.pp, h100.predicted.ep) == (2, 8, 64)
    assert harness.mape([r.error for r in rows.values()]) < 0.10


def test_megatron_bridge_token_drop_runs_use_the_all_to_all_dispatcher(harness: ModuleType) -> None:
    # Megatron-Bridge's token-drop helper (apply_moe_token_drop) asserts
    # moe_token_dispatcher_type in ("alltoall", "alltoall_seq"): its "tokendrop" rows ran NCCL's
    # all-to-all, its dropless MoE rows the DeepEP / HybridEP the hardware guide names, except
    # GPT-OSS 120B in 26.02, whose performance config set no flex backend: its provider's
    # all-to-all (round 19).
    rows = [r for r in harness.load_rows() if r.id.startswith("mbridge") and r.spec is not None]
    drop = [r for r in rows if r.spec.training.moe_capacity_factor]
    dropless = [
        r for r in rows if r.raw["model"].get("moe") and not r.spec.training.moe_capacity_factor
    ]
    stated = [r for r in dropless if r.raw["training"].get("moe_dispatcher")]
    assert len(drop) >= 8 and len(dropless) >= 30
    assert all(r.spec.training.moe_dispatcher is None for r in drop)
    assert {r.id for r in stated} == {
        f"mbridge2602_dgx_{gpu}_gpt_oss_120b_64gpu_bf16"
        for gpu in ("gb300", "gb200", "b300", "b200", "h100")
    }
    assert all(r.spec.training.moe_dispatcher == MoeDispatcher.ALLTOALL for r in stated)
    others = [r for r in dropless if r not in stated]
    assert len(others) >= 30
    assert all(r.spec.training.moe_dispatcher == MoeDispatcher.DEEPEP for r in others)

"""The planner's decisions as an expert would sign them (issue 12): the global batch is trained
exactly or refused with the nearest batches offered; the search covers interleaved schedules,
lighter end stages and every expert-parallel degree; the labels say what the numbers say."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from engine.plan.batch import GlobalBatchError
from engine.plan.catalog import get_gpu
from engine.plan.context import PlanContext
from engine.plan.models import resolve_model
from engine.plan.names import Precision, Recompute, Strategy
from engine.plan.planner import plan
from engine.plan.result import Plan
from engine.plan.search import candidates
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
from engine.plan.stages import stage_layers, uneven_splits, virtual_options

ROOT = Path(__file__).resolve().parents[2]


def _spec(
    model: ModelSpec | str,
    gpu: str = "h100-sxm",
    nodes: int = 1,
    network: str = "ib-ndr",
    layout: LayoutSpec | None = None,
    **training: object,
) -> Spec:
    return Spec(
        model=ModelSpec(preset=model) if isinstance(model, str) else model,
        hardware=HardwareSpec(gpu=gpu, gpus_per_node=8, nodes=nodes),
        network=NetworkSpec(tier=network),  # type: ignore[arg-type]
        training=TrainingSpec(**training),  # type: ignore[arg-type]
        layout=layout or LayoutSpec(),
    )


def _ctx(spec: Spec) -> PlanContext:
    return PlanContext.build(
        spec, resolve_model(spec.model), get_gpu(spec.hardware.gpu), Precision.BF16
    )


# ---------------------------------------------------------------------------------------------
# The global batch


def test_an_odd_batch_is_trained_exactly_and_a_faster_one_only_offered() -> None:
    # 7 sequences on 8 GPUs: no DDP (each replica would need 7/8 of a sequence).
    p = plan(_spec("gpt2", network="tcp", global_batch=7))
    r = p.recommended
    assert r.global_batch == 7 == r.micro_batch * r.grad_accum * r.dp
    assert all(a.global_batch == 7 for a in p.alternatives)
    offered = {c.global_batch: c for c in p.batch_choices}
    assert 8 in offered and offered[8].fits and offered[8].tokens_per_s > r.tokens_per_s
    assert any("--global-batch 8" in w for w in p.warnings)
    fit = next(s for s in p.path if s.question.startswith("Does the model fit on one GPU"))
    assert "does not split into 8 replicas" in fit.reason


def test_a_batch_no_layout_can_train_is_refused_with_the_nearest() -> None:
    spec = _spec("llama-3-8b", layout=LayoutSpec(dp=8), global_batch=7)
    with pytest.raises(GlobalBatchError) as e:
        plan(spec)
    assert e.value.field == "training.global_batch"
    assert [c.global_batch for c in e.value.choices] == [8]
    text = str(e.value)
    assert "--global-batch 8" in text and "--global-batch-nearest" in text and "\n" not in text


def test_global_batch_nearest_trains_the_nearest_and_says_so() -> None:
    base = _spec("llama-3-8b", layout=LayoutSpec(dp=8), global_batch=7)
    spec = base.model_copy(
        update={"training": base.training.model_copy(update={"global_batch_nearest": True})}
    )
    p = plan(spec)
    assert p.recommended.global_batch == 8
    assert [c.global_batch for c in p.batch_choices] == [8]
    step = next(s for s in p.path if s.question.startswith("Can a layout train"))
    assert step.answer.startswith("no: training 8")
    assert any("--global-batch-nearest" in w for w in p.warnings)


def test_the_405b_at_8192_gpus_keeps_its_batch() -> None:
    # Issue 12: recommended FSDP dp=8192, which trains 8192 sequences for 1024 asked.
    spec = _spec("llama-3.1-405b", nodes=1024, seq_len=8192, global_batch=1024)
    p = plan(spec)
    assert p.recommended.global_batch == 1024 and p.recommended.fits
    odd = spec.model_copy(
        update={"training": spec.training.model_copy(update={"global_batch": 1000})}
    )
    with pytest.raises(GlobalBatchError) as e:
        plan(odd)
    assert sorted(c.global_batch for c in e.value.choices) == [992, 1008]


def test_every_candidate_trains_the_asked_batch() -> None:
    for spec in (
        _spec("llama-3-70b", nodes=4, global_batch=96),
        _spec("mixtral-8x7b", nodes=2, global_batch=24),
    ):
        cands = candidates(_ctx(spec))
        assert cands
        assert {c.draft.global_batch for c in cands} == {spec.training.global_batch}


def test_cli_flag_and_refusal(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "cli", "plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"]
    argv += ["--gpus-per-node", "8", "--dp", "8", "--global-batch", "7"]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.splitlines()) == 1 and "training.global_batch" in r.stderr
    r = subprocess.run(
        [*argv, "--global-batch-nearest"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert "global batch 8" in r.stdout


# ---------------------------------------------------------------------------------------------
# Pipeline shapes and expert parallelism


def test_stage_splits_are_what_megatron_can_run() -> None:
    assert stage_layers(126, 16, 7, 7) == [7, *[8] * 14, 7]  # Llama 3 405B
    assert (7, 7) in uneven_splits(126, 16)
    assert uneven_splits(80, 16) == [(0, 0)]
    assert uneven_splits(40, 16) == []  # only heavier ends would do: not searched
    for layers, pp in ((126, 8), (61, 16), (80, 8), (32, 4)):
        for first, last in uneven_splits(layers, pp):
            split = stage_layers(layers, pp, first, last)
            assert sum(split) == layers and len(split) == pp
            middle = split[1:-1]
            assert len(set(middle)) <= 1 and all(e <= max(split) for e in (split[0], split[-1]))
    assert virtual_options(80, 4) == [1, 2, 4, 5, 10]
    assert virtual_options(126, 8) == [1]


def test_interleaved_and_lighter_end_stages_are_searched() -> None:
    cands = candidates(_ctx(_spec("llama-3-70b", nodes=16, seq_len=8192, global_batch=1024)))
    inter = [c.draft for c in cands if c.draft.virtual_stages > 1]
    assert inter
    for d in inter:
        assert 80 % (d.pp * d.virtual_stages) == 0 and d.grad_accum % d.pp == 0
    cands = candidates(_ctx(_spec("llama-3.1-405b", nodes=1024, seq_len=8192, global_batch=1024)))
    piped = [c.draft for c in cands if c.draft.pp > 1]
    assert any(d.first_stage_layers or d.last_stage_layers for d in piped)
    # Unforced, no depth Megatron cannot split: 126 layers over 8 stages need lighter ends.
    assert all(126 % d.pp == 0 or d.first_stage_layers or d.last_stage_layers for d in piped)


def test_interleaving_combines_with_lighter_end_stages() -> None:
    # Megatron-Core splits each stage's own count into v chunks beside
    # --decoder-first/last-pipeline-num-layers: every stage's count must divide by v.
    assert stage_layers(126, 16, 0, 6) == [*[8] * 15, 6]
    assert virtual_options(126, 16, 0, 6) == [1, 2]
    assert virtual_options(126, 16, 7, 7) == [1]  # 7 and 8 share no chunk size
    assert virtual_options(126, 32, 0, 2) == [1, 2]  # 4-layer stages in 2-layer chunks
    # Llama 3 405B on 16K GPUs (Table 4: TP8 PP16 DP128, 16 micro-batches a replica): plain
    # 1F1B idles half the step; interleaving a lighter-ended split is what makes it 41 % MFU.
    spec = _spec(
        "llama-3.1-405b",
        nodes=2048,
        seq_len=8192,
        global_batch=2048,
        layout=LayoutSpec(tp=8, pp=16, dp=128),
    )
    r = plan(spec).recommended
    assert r.virtual_stages > 1 and (r.first_stage_layers or r.last_stage_layers)
    assert r.bubble_fraction < 0.35 and r.mfu > 0.3  # causal-attention FLOPs: below PaLM MFU
    forced = spec.model_copy(update={"layout": LayoutSpec(tp=8, pp=16, dp=128, virtual_stages=1)})
    assert plan(forced).recommended.step_time_s > 1.2 * r.step_time_s


def test_the_405b_issue_scenario_interleaves() -> None:
    # Issue 12: TP8 PP32 DP32 at 49 % bubble; an expert interleaves there, and so does the plan.
    r = plan(_spec("llama-3.1-405b", nodes=1024, seq_len=8192, global_batch=1024)).recommended
    assert r.global_batch == 1024 and r.fits
    assert r.pp > 1 and r.virtual_stages > 1 and r.bubble_fraction < 0.4
    assert r.mfu > 0.35


def test_megatron_arguments_for_interleaved_lighter_ends() -> None:
    from engine.write.megatron import megatron_args_list

    spec = _spec(
        "llama-3.1-405b",
        nodes=2048,
        seq_len=8192,
        global_batch=2048,
        layout=LayoutSpec(tp=8, pp=16, dp=128),
    )
    p = plan(spec)
    r = p.recommended
    assert r.virtual_stages == 2 and r.last_stage_layers == 6
    args = megatron_args_list(p)
    assert "--num-virtual-stages-per-pipeline-rank 2" in args
    assert "--decoder-last-pipeline-num-layers 6" in args
    assert not any(a.startswith("--num-layers-per-virtual-pipeline-stage") for a in args)


def test_the_70b_on_16_nodes_is_not_a_deep_pipeline() -> None:
    # Issue 12: TP4 PP16 (5 layers a stage) won because its costs were missing.
    p = plan(_spec("llama-3-70b", nodes=16, seq_len=8192, global_batch=1024))
    r = p.recommended
    assert r.fits and r.global_batch == 1024
    assert r.pp <= 8


def test_every_expert_parallel_divisor_is_searched() -> None:
    # A 256-expert model on 2048 GPUs (DeepSeek-V3's shape) must see ep=64.
    moe = ModelSpec(
        layers=61,
        hidden=7168,
        heads=128,
        kv_heads=128,
        vocab=129280,
        ffn=2048,
        num_experts=256,
        experts_per_token=8,
    )
    ctx = _ctx(_spec(moe, nodes=256, seq_len=4096, global_batch=4096))
    cands = candidates(ctx)
    eps = {c.draft.ep for c in cands}
    assert {1, 2, 4, 8, 16, 32, 64, 128, 256} <= eps
    kinds = {(c.draft.strategy, c.draft.ep > 1) for c in cands}
    assert (Strategy.ZERO1, True) in kinds and (Strategy.THREE_D, True) in kinds
    assert (Strategy.ZERO3, True) not in kinds  # DeepSpeed-MoE refuses ZeRO-3


# ---------------------------------------------------------------------------------------------
# Labels


SCENARIOS = [
    _spec("llama-3-70b", gpu="mi300x", network="tcp"),
    _spec("llama-3-70b", nodes=16, seq_len=8192, global_batch=1024),
    _spec("mixtral-8x7b", nodes=4, network="ib", seq_len=4096, global_batch=512),
    _spec("llama-2-7b", gpu="a100-80gb", network="tcp", seq_len=4096, global_batch=256),
    _spec("llama-3-8b", nodes=4, network="ib", global_batch=7),
    _spec("gpt2", network="tcp", global_batch=7),
]


def _plans() -> list[Plan]:
    return [plan(s) for s in SCENARIOS]


def test_labels_say_what_the_numbers_say() -> None:
    replaced = 0
    for p in _plans():
        r = p.recommended
        for w in p.warnings:
            if w.startswith("scaling efficiency"):
                assert r.comm_time_s > 0.2 * r.step_time_s, w
        for a in p.alternatives:
            why = a.rejected_because or ""
            if not a.fits or not r.fits:
                continue
            ratio = a.step_time_s / r.step_time_s
            if "about as fast" in why:
                assert abs(ratio - 1) <= 0.021, why
            if ratio < 0.98:
                assert "faster" in why, why
            if ratio > 1.02 and not why.startswith("the flowchart's choice"):
                assert "slower" in why, why
        nearby = next(s for s in p.path if s.question == "Is a nearby layout clearly faster?")
        if nearby.answer.startswith("yes"):
            replaced += 1
            assert any(
                (a.rejected_because or "").startswith("the flowchart's choice")
                for a in p.alternatives
            )
    assert replaced  # at least one scenario exercises the flowchart's own pick


def test_the_advice_names_the_traffic_that_is_exposed() -> None:
    """A one-GPU offload plan and a one-node ZeRO-3 plan are not told to buy a faster network;
    a multi-node plan over a slow fabric is."""

    def advice(spec: Spec) -> str:
        (line,) = [w for w in plan(spec).warnings if w.startswith("scaling efficiency")]
        return line

    one_gpu = _spec("llama-3-8b", seq_len=4096, global_batch=32)
    one_gpu.hardware.gpus_per_node = 1
    offload = advice(one_gpu)
    assert "CPU offload takes" in offload and "network" not in offload, offload
    zero3 = LayoutSpec(strategy=Strategy.ZERO3, framework="deepspeed", micro_batch=1)
    node = advice(_spec("llama-3-8b", layout=zero3, seq_len=1024, global_batch=64))
    assert "inside the node" in node and "faster network" not in node, node
    wire = advice(_spec("llama-3-8b", nodes=4, network="tcp", seq_len=8192, global_batch=256))
    assert "faster network" in wire, wire


def test_mi300x_70b_does_not_blame_communication() -> None:
    # Issue 12: "communication dominates" fired with 0 ms exposed communication.
    p = plan(SCENARIOS[0])
    r = p.recommended
    assert not any(w.startswith("scaling efficiency") for w in p.warnings) or (
        r.comm_time_s > 0.2 * r.step_time_s
    )


def test_the_alternatives_weigh_the_plan_against_other_meshes() -> None:
    """A 3D plan is listed against other TP/PP/DP meshes of its own kind, not only against a
    different split of its own mesh (the 405B on 8192 GPUs listed nothing else)."""

    def mesh(lay: object) -> tuple[int, ...]:
        return tuple(getattr(lay, k) for k in ("tp", "pp", "cp", "ep", "dp"))

    for p in (
        plan(SCENARIOS[1]),
        plan(_spec("llama-3.1-405b", nodes=1024, seq_len=8192, global_batch=1024)),
    ):
        r = p.recommended
        assert r.strategy == Strategy.THREE_D
        others = [a for a in p.alternatives if a.strategy == r.strategy and mesh(a) != mesh(r)]
        assert others, [mesh(a) for a in p.alternatives]
        assert all(a.fits and a.step_time_s >= r.step_time_s * 0.85 for a in others)


def _plan_70b_text(nodes: int, global_batch: int, *forced: str) -> str:
    """``dtrain-tui plan``'s text for Llama 3 70B at 8K tokens on ``nodes`` H100 nodes."""
    return subprocess.run(
        [sys.executable, "-m", "cli", "plan", "--model", "llama-3-70b", "--gpu", "h100"]
        + ["--gpus-per-node", "8", "--nodes", str(nodes), "--network", "ib-ndr"]
        + ["--seq-len", "8192", "--global-batch", str(global_batch), *forced],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout


def test_an_alternative_says_what_it_recomputes() -> None:
    out = _plan_70b_text(16, 1024)
    alternatives = out.split("\nAlternatives\n", 1)[1].split("\n\n", 1)[0]
    fsdp = [line for line in alternatives.splitlines() if "FSDP FULL_SHARD" in line]
    assert fsdp and all(", recompute full:" in line for line in fsdp), alternatives


# ---------------------------------------------------------------------------------------------
# Full sharding with expert parallelism


def test_an_moe_model_on_one_node_is_fully_sharded_with_expert_parallelism() -> None:
    # Qwen3-30B-A3B on 8 H100s at batch 512 x 4K: NeMo AutoModel trains it with FSDP2 + EP8
    # (tests/data/published_runs.json, 21.8 s a step). The search offers full sharding with EP
    # (Megatron-FSDP), the flowchart's full-sharding question answers with it, and no TP2 x PP2
    # pipeline with micro-batches of 16 sequences is chosen for a 3B-active model.
    p = plan(_spec("qwen3-30b-a3b", seq_len=4096, global_batch=512))
    lay = p.recommended
    assert lay.fits and lay.zero_stage == 3 and lay.ep > 1
    assert (lay.tp, lay.pp) == (1, 1)
    step = next(s for s in p.path if s.question.startswith("Does it fit with full sharding"))
    assert step.answer == "yes" and "Megatron-FSDP" in step.reason


def test_a_fitting_layout_set_aside_is_not_said_to_need_more_memory() -> None:
    # A 124M model at a 32K sequence: DDP fits, but the pool keeps context-parallel layouts.
    # The answer must say why DDP was set aside, not "needs 24 GiB of 75.6 GiB usable".
    # (GPT-2's shape with positions past its 1024: a bare shape states no position limit.)
    gpt2_shape = ModelSpec(layers=12, hidden=768, heads=12, vocab=50257, ffn=3072)
    p = plan(_spec(gpt2_shape, seq_len=32_768, global_batch=16))
    step = next(s for s in p.path if s.question.startswith("Does the model fit on one GPU"))
    assert step.answer == "no"
    assert "would fit" in step.reason and "context parallelism" in step.reason
    assert "needs at least" not in step.reason


# ---------------------------------------------------------------------------------------------
# Partial recompute: N layers of each stage (Megatron's block method)


def test_block_recompute_recomputes_only_the_layers_memory_needs() -> None:
    from dataclasses import replace

    from engine.plan.memory import estimate_memory
    from engine.plan.names import Recompute
    from engine.plan.perf import estimate_time
    from engine.write import megatron_args

    # Llama 3 70B on 64 H100 at 8K, batch 512: no recompute does not fit TP4 x PP4; recomputing
    # every layer is a third more compute. The plan recomputes the first few layers of each
    # stage, the least that fits, and says so.
    p = plan(
        _spec("llama-3-70b", nodes=8, seq_len=8192, global_batch=512, layout=LayoutSpec(tp=4, pp=4))
    )
    lay = p.recommended
    assert lay.fits and lay.recompute == Recompute.FULL
    assert 0 < lay.recompute_layers < 80 // lay.pp
    note = next(n for n in lay.notes if "first" in n and "recompute" in n)
    assert f"first {lay.recompute_layers} layers" in note
    lines = megatron_args(p).splitlines()
    assert "--recompute-method block" in lines
    assert f"--recompute-num-layers {lay.recompute_layers}" in lines
    # Memory falls and time rises with every recomputed layer.
    ctx = _ctx(p.spec)
    from engine.plan.memory import LayoutDraft

    d = LayoutDraft(
        **{k: getattr(lay, k) for k in LayoutDraft.__dataclass_fields__ if hasattr(lay, k)}
    )
    mems, times = [], []
    for n in (1, lay.recompute_layers, 80 // lay.pp - 1, 0):
        dn = replace(d, recompute_layers=n)
        mems.append(
            estimate_memory(ctx.dims, dn, seq_len=8192, optimizer=p.spec.training.optimizer).total
        )
        times.append(estimate_time(ctx.dims, dn, ctx.hw, seq_len=8192).step_time_s)
    assert mems == sorted(mems, reverse=True)  # 0: every layer, the least memory
    assert times == sorted(times)
    less = replace(d, recompute_layers=lay.recompute_layers - 1)
    if lay.recompute_layers > 1:
        m = estimate_memory(ctx.dims, less, seq_len=8192, optimizer=p.spec.training.optimizer)
        assert m.total > ctx.usable  # one fewer does not fit: it is the least


def test_a_tight_layout_loses_to_one_about_as_fast_with_room() -> None:
    """Llama 3 70B on 64 H100 at 8K, batch 256: TP4 x PP4 with a block recompute (72.5 GiB, 4 %
    spare) is 0.6 % faster than a plain TP4 x PP8 (68.7 GiB, 9 % spare); the plan takes the
    margin (the review's block recompute at 75.4 GiB kept over a plain layout at 66.5, 0.9 %
    slower), and says how much it keeps."""
    p = plan(_spec("llama-3-70b", nodes=8, seq_len=8192, global_batch=256))
    lay = p.recommended
    assert lay.recompute == Recompute.NONE
    spare = p.spare_bytes()
    assert spare > p.headroom_bytes + 0.04 * (p.usable_bytes + p.headroom_bytes)
    free = p.usable_bytes - lay.memory_per_gpu.total
    assert p.margin_text().startswith(f"fits with {free / 1024**3:.1f} GiB to spare beyond the ")
    assert f"[{p.margin_text()}]" in _plan_70b_text(8, 256)


def test_plan_text_names_the_block_recompute() -> None:
    out = _plan_70b_text(8, 512, "--tp", "4", "--pp", "4")
    assert "recompute full (the first " in out and "layers of each stage)" in out


def test_the_block_recompute_is_worded_for_the_layout_it_covers() -> None:
    # "of each stage" only where there are stages; chunks under interleaving (Megatron counts
    # --recompute-num-layers per model chunk there).
    from engine.plan.annotate import recompute_scope
    from engine.plan.memory import LayoutDraft
    from engine.plan.names import Framework, Recompute, Strategy

    base = LayoutDraft(
        Strategy.THREE_D, Framework.MEGATRON, recompute=Recompute.FULL, recompute_layers=2
    )
    assert recompute_scope(base) == "the first 2 layers"
    assert recompute_scope(replace(base, pp=4)) == "the first 2 layers of each stage"
    assert recompute_scope(replace(base, pp=4, virtual_stages=2)) == (
        "the first 2 layers of each model chunk"
    )

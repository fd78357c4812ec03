"""Pipeline splits that count the embedding and the loss as layers (Megatron's
``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``), as
NeMo and Megatron-Bridge recipes run them: Llama 3.1 405B's 126 layers at PP8 x VP8 (128 units,
two a chunk), Qwen3-235B's 94 at PP4 x VP6 (the Megatron Core MoE report's Table 20). Refused
before ("every stage's layer count divides by 8")."""

from __future__ import annotations

from engine.plan.names import NetworkTier, PPSchedule, Strategy
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
from engine.plan.stages import accounted_ends, virtual_options
from engine.write.megatron import megatron_args


def test_the_accounted_split_interleaves() -> None:
    assert accounted_ends(126, 8, 15, 15) == (True, True)
    assert 8 in virtual_options(126, 8, 15, 15, accounted=True)
    assert accounted_ends(94, 4, 23, 23) == (True, True)
    assert 6 in virtual_options(94, 4, 23, 23, accounted=True)
    assert 6 not in virtual_options(94, 4, 23, 23)  # the free search keeps Megatron's default
    assert accounted_ends(126, 8, 0, 0) == (False, False)


def _spec(model: str, nodes: int, tp: int, pp: int, v: int, batch: int) -> Spec:
    return Spec(
        model=ModelSpec(preset=model),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=nodes),
        network=NetworkSpec(tier=NetworkTier.IB_NDR),
        training=TrainingSpec(
            seq_len=8192 if model.startswith("llama") else 4096, global_batch=batch
        ),
        layout=LayoutSpec(strategy=Strategy.THREE_D, tp=tp, pp=pp, virtual_stages=v),
    )


def test_llama_405b_at_pp8_vp8_is_accepted_and_written_as_megatron_runs_it() -> None:
    p = plan(_spec("llama-3.1-405b", 128, 8, 8, 8, 512))
    lay = p.recommended
    assert lay.pp_schedule == PPSchedule.INTERLEAVED and lay.virtual_stages == 8
    assert (lay.first_stage_layers, lay.last_stage_layers) == (15, 15)
    args = megatron_args(p).splitlines()
    assert "--account-for-embedding-in-pipeline-split" in args
    assert "--account-for-loss-in-pipeline-split" in args
    assert "--num-virtual-stages-per-pipeline-rank 8" in args
    assert not any(a.startswith("--decoder-first-pipeline-num-layers") for a in args)


def test_qwen3_235b_at_pp4_vp6_is_accepted() -> None:
    lay = plan(_spec("qwen3-235b-a22b", 32, 1, 4, 6, 3072)).recommended
    assert lay.virtual_stages == 6 and (lay.first_stage_layers, lay.last_stage_layers) == (23, 23)

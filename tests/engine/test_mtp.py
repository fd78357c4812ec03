"""Multi-token prediction (DeepSeek-V3 report §2.2; Megatron-Core's ``--mtp-num-layers``): each
module is one more transformer layer, a ``2h -> h`` projection and one more pass through the
output head, all on the last pipeline stage. DeepSeek-V3 trained with one, and
Megatron-Bridge's DeepSeek-V3 recipe trains with one, lightening the last stage to a single
decoder layer to carry it (its layout ``[embedding + 4] + 14 x [4] + [1 + mtp + loss]`` for
16 stages); transformers' models do not run it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from cli import main
from engine.errors import SpecError
from engine.plan import perf
from engine.plan.memory import LayoutDraft, estimate_memory, stage_params
from engine.plan.models import load_hf_config, preset_config, resolve_model
from engine.plan.names import Framework, NetworkTier, Optimizer, Precision, Strategy
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
from engine.write.megatron import megatron_args
from tests.engine.perf_fixtures import h100_hardware


def test_the_depth_comes_from_the_config_and_can_be_set() -> None:
    ds = resolve_model(ModelSpec(preset="deepseek-v3"))
    assert ds.mtp_layers == 1
    # Kept apart from the published size: 671B is the main model's.
    assert ds.params_total == 671_026_404_352
    assert resolve_model(ModelSpec(preset="kimi-k2")).mtp_layers == 0
    assert resolve_model(ModelSpec(preset="llama-3-8b")).mtp_layers == 0
    assert resolve_model(ModelSpec(preset="deepseek-v3", mtp_layers=0)).mtp_layers == 0
    assert resolve_model(ModelSpec(preset="llama-3-8b", mtp_layers=2)).mtp_layers == 2


@pytest.mark.parametrize("value", [-1, 1.5, "one", True])
def test_a_bad_depth_in_a_config_is_one_line_naming_it(tmp_path: Path, value: object) -> None:
    cfg = {k: v for k, v in preset_config("deepseek-v3").items() if not k.startswith("_")}
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**cfg, "num_nextn_predict_layers": 3}))
    assert load_hf_config(f).mtp_layers == 3
    f.write_text(json.dumps({**cfg, "num_nextn_predict_layers": value}))
    with pytest.raises(SpecError) as e:
        load_hf_config(f)
    assert "\n" not in str(e.value) and "num_nextn_predict_layers" in (e.value.field or "")


def _draft(framework: Framework, pp: int, last: int = 0) -> LayoutDraft:
    strategy = Strategy.THREE_D if framework == Framework.MEGATRON else Strategy.ZERO1
    return LayoutDraft(
        strategy, framework, pp=pp, dp=16, ep=8, grad_accum=64, last_stage_layers=last
    )


def test_megatron_runs_it_on_the_last_stage() -> None:
    hw = h100_hardware(32)
    with_mtp = resolve_model(ModelSpec(preset="deepseek-v3"))
    without = with_mtp.model_copy(update={"mtp_layers": 0})
    # Megatron-Bridge's split for 16 stages: 4 layers each, one on the last beside the module
    # (its DeepSeek-V3 recipes dispatch with DeepEP).
    bridge = replace(_draft(Framework.MEGATRON, 16, last=1), deepep=True)
    one, none = (perf.micro_batch_time(d, bridge, hw, 4096) for d in (with_mtp, without))
    layer = perf.terms(with_mtp, bridge, hw, 4096).layer[0]
    head = 3 * perf.terms(with_mtp, bridge, hw, 4096).head
    # Without it the 4-layer stages are the heaviest; with it the last stage is (one layer,
    # the module's layer, two head passes and the projection) -- heavier than four layers.
    assert none.compute == pytest.approx(4 * layer, rel=0.05)
    assert one.compute > 2 * layer + 2 * head > none.compute
    # Under an even split (3 layers on the last stage) it would cost more still.
    even = perf.micro_batch_time(
        with_mtp, replace(_draft(Framework.MEGATRON, 16), deepep=True), hw, 4096
    )
    assert even.compute > one.compute
    # transformers' DeepSeek-V3 (under DeepSpeed, FSDP) has no such module: no cost.
    ds = _draft(Framework.DEEPSPEED, 1)
    assert perf.micro_batch_time(with_mtp, ds, hw, 4096) == perf.micro_batch_time(
        without, ds, hw, 4096
    )


def test_its_weights_and_activations_count_where_it_runs() -> None:
    with_mtp = resolve_model(ModelSpec(preset="llama-3-8b", mtp_layers=1))
    without = resolve_model(ModelSpec(preset="llama-3-8b"))
    one = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, dp=8)
    dense_l = (without.params_total - without.params_embedding) / without.layers
    extra = stage_params(with_mtp, one)[0] - stage_params(without, one)[0]
    assert extra == pytest.approx(dense_l + 2 * 4096**2)
    # Eight stages of 4 layers: the last holds 4 + 1 layers and the head, more than the first.
    pp8 = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, pp=8)
    first = stage_params(without, pp8)[0]
    assert stage_params(with_mtp, pp8)[0] == pytest.approx(first + dense_l + 2 * 4096**2)
    # The single stage holds its activations too; DeepSpeed's model has no module to hold.
    mem = {
        (d.mtp_layers, lay.framework): estimate_memory(
            d, lay, seq_len=4096, optimizer=Optimizer.ADAMW
        ).activations
        for d in (with_mtp, without)
        for lay in (one, LayoutDraft(Strategy.ZERO1, Framework.DEEPSPEED, dp=8))
    }
    assert mem[1, Framework.MEGATRON] > mem[0, Framework.MEGATRON]
    assert mem[1, Framework.DEEPSPEED] == mem[0, Framework.DEEPSPEED]


def _deepseek_on_b200(mtp: int | None) -> Spec:
    return Spec(
        model=ModelSpec(preset="deepseek-v3", mtp_layers=mtp),
        hardware=HardwareSpec(gpu="b200", gpus_per_node=8, nodes=32),
        network=NetworkSpec(tier=NetworkTier.IB_NDR),
        training=TrainingSpec(seq_len=4096, global_batch=4096, precision=Precision.FP8),
        layout=LayoutSpec(
            strategy=Strategy.THREE_D, tp=1, pp=16, ep=8, dp=16, micro_batch=1, virtual_stages=1
        ),
    )


def test_the_plan_times_it_places_it_and_writes_it() -> None:
    # Megatron-Bridge's 25.11/26.02 DeepSeek-V3 layout on 256 B200s, forced: the search picks
    # the recipe's own split (one layer on the last stage beside the module).
    with_mtp = plan(_deepseek_on_b200(None))
    without = plan(_deepseek_on_b200(0))
    lay = with_mtp.recommended
    assert (lay.first_stage_layers, lay.last_stage_layers) == (0, 1)
    assert lay.step_time_s > 1.03 * without.recommended.step_time_s
    assert any("multi-token prediction" in n for n in lay.notes)
    split = next(s for s in with_mtp.path if s.question == "Which pipeline schedule and split?")
    assert "multi-token prediction (last)" in split.reason
    assert not any("multi-token prediction" in n for n in without.recommended.notes)
    assert "--mtp-num-layers 1" in megatron_args(with_mtp).splitlines()
    assert "--mtp-num-layers" not in megatron_args(without)
    j = with_mtp.model_dump(mode="json")
    assert j["model"]["mtp_layers"] == 1


def test_the_command_line_sets_it_beside_a_profile_or_preset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["plan", "--model", "deepseek-v3", "--gpu", "h100-sxm", "--gpus-per-node", "8"]
    assert main([*base, "--nodes", "32", "--global-batch", "512", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["mtp_layers"] == 1
    assert (
        main([*base, "--nodes", "32", "--global-batch", "512", "--json", "--mtp-layers", "0"]) == 0
    )
    assert "mtp_layers" not in json.loads(capsys.readouterr().out)["model"]
    # Beside a spec file it adds to the file's model instead of replacing it.
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[model]\npreset = "llama-3-8b"\n'
        '[hardware]\ngpu = "h100-sxm"\ngpus_per_node = 8\nnodes = 2\n'
        "[training]\nglobal_batch = 64\n"
    )
    assert main(["plan", "--spec", str(spec), "--mtp-layers", "1", "--json"]) == 0
    model = json.loads(capsys.readouterr().out)["model"]
    assert (model["name"], model["mtp_layers"]) == ("llama-3-8b", 1)
    assert main([*base, "--mtp-layers", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mtp_layers" in err[0]


def test_model_inspect_takes_the_depth_and_the_head_width(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["model", "inspect", "deepseek-v3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mtp_layers"] == 1
    assert main(["model", "inspect", "deepseek-v3", "--mtp-layers", "0", "--json"]) == 0
    assert "mtp_layers" not in json.loads(capsys.readouterr().out)
    dims = ["--layers", "4", "--hidden", "64", "--heads", "4", "--head-dim", "32", "--vocab", "100"]
    assert main(["model", "inspect", *dims, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["head_dim"] == 32

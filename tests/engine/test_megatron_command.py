"""The Megatron-LM side of a 3D bundle: ``megatron_args.txt`` carries what the model *is*
(normalization, positions, gated MLP, GQA, biases, head width), and ``pretrain_gpt.sh`` is a real
``pretrain_gpt.py`` command: run under bash with a recording ``TORCHRUN``, its words parse with
torchrun's own parser and reach ``$MEGATRON_LM/pretrain_gpt.py`` with every flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.plan.names import Strategy
from engine.plan.specs import ModelSpec
from engine.write import megatron_args, render_bundle, write_bundle
from engine.write.bundle import EXEC_MODE
from engine.write.megatron import PRETRAIN_GPT
from tests.engine.writers_fixtures import golden_plans, make_plan

DUMP = """\
import json, os, sys
with open(os.environ["DUMP_TO"], "w") as f:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(),
               "addr": os.environ.get("MASTER_ADDR")}, f)
"""


def _args(preset: str) -> list[str]:
    plan = make_plan(
        model=ModelSpec(preset=preset), gpu="h100-sxm", gpus_per_node=8, strategy=Strategy.THREE_D
    )
    return [line for line in megatron_args(plan).splitlines() if not line.startswith("#")]


def test_llama_flags_come_from_the_model() -> None:
    lines = _args("llama-3-8b")
    for flag in (
        "--normalization RMSNorm",
        "--position-embedding-type rope",
        "--swiglu",
        "--group-query-attention",
        "--num-query-groups 8",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
        "--attention-dropout 0.0",
        "--hidden-dropout 0.0",
    ):
        assert flag in lines, flag
    assert not any(line.startswith("--kv-channels") for line in lines)


@pytest.mark.parametrize(
    ("preset", "present", "absent"),
    [
        (
            "gpt2",
            ["--normalization LayerNorm", "--position-embedding-type learned_absolute"],
            ["--swiglu", "--group-query-attention", "--disable-bias-linear"],
        ),
        ("pythia-160m", ["--normalization LayerNorm", "--position-embedding-type rope"], []),
        ("qwen2-7b", ["--disable-bias-linear", "--add-qkv-bias"], []),
        ("gemma-7b", ["--kv-channels 256", "--normalization RMSNorm"], []),
        ("llama-3.2-1b", ["--swiglu"], ["--untie-embeddings-and-output-weights"]),
        (
            # GPT-OSS as Megatron-Bridge's GPTOSSProvider builds it: biased linears, attention
            # sinks, a 128-token window on every second layer, clamped quick-GELU GLU.
            "gpt-oss-20b",
            [
                "--normalization RMSNorm",
                "--softmax-type learnable",
                "--window-size 128,0",
                "--window-attn-skip-freq [1,0]*12",
                "--quick-geglu",
                "--glu-linear-offset 1.0",
                "--activation-func-clamp-value 7.0",
                "--kv-channels 64",
            ],
            ["--disable-bias-linear", "--swiglu"],
        ),
    ],
)
def test_architecture_flags(preset: str, present: list[str], absent: list[str]) -> None:
    lines = _args(preset)
    for flag in present:
        assert flag in lines, flag
    for flag in absent:
        assert flag not in lines, flag


@pytest.mark.parametrize(
    ("preset", "rotary"),
    [
        # Megatron rotates with base 10000 over whole heads unless told: each model's own.
        ("llama-3-8b", ["--rotary-base 500000"]),
        ("qwen3-30b-a3b", ["--rotary-base 1000000"]),
        ("pythia-160m", ["--rotary-base 10000", "--rotary-percent 0.25"]),
        (
            "llama-3.1-405b",
            ["--rotary-base 500000", "--use-rope-scaling", "--rope-scaling-factor 8"],
        ),
        ("gpt-oss-20b", ["--rotary-base 150000"]),
        ("gpt2", []),
    ],
)
def test_rotary_embedding_flags_come_from_the_config(preset: str, rotary: list[str]) -> None:
    lines = _args(preset)
    flags = ("--rotary-", "--use-rope-scaling", "--rope-scaling-")
    assert [line for line in lines if line.startswith(flags)] == rotary


@pytest.mark.parametrize(
    ("preset", "eps"),
    [("qwen3-30b-a3b", "1e-06"), ("gemma-7b", "1e-06"), ("llama-3-8b", "1e-05"), ("gpt2", "1e-05")],
)
def test_the_norms_epsilon_comes_from_the_config(preset: str, eps: str) -> None:
    # Megatron's --norm-epsilon defaults to 1e-5; Qwen and Gemma normalise with 1e-6.
    assert [line for line in _args(preset) if line.startswith("--norm-epsilon")] == [
        f"--norm-epsilon {eps}"
    ]


def test_a_scaling_without_flags_and_an_unknown_base_are_said(tmp_path: Path) -> None:
    plan = make_plan(
        model=ModelSpec(preset="gpt-oss-20b"),
        gpu="h100-sxm",
        gpus_per_node=8,
        strategy=Strategy.THREE_D,
    )
    assert "# The config's yarn RoPE scaling (factor 32) is not passed" in megatron_args(plan)
    cfg = {
        "model_type": "llama",
        "hidden_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "intermediate_size": 1024,
        "vocab_size": 1000,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    plan = make_plan(
        model=ModelSpec(config_path=tmp_path / "config.json"),
        gpu="h100-sxm",
        gpus_per_node=8,
        strategy=Strategy.THREE_D,
    )
    text = megatron_args(plan)
    assert "# No rope_theta known" in text
    assert not any(line.startswith("--rotary-") for line in text.splitlines())


def test_pretrain_gpt_is_written_next_to_the_arguments() -> None:
    files = render_bundle(golden_plans()["llama70b_4x8h100_3d"])
    assert {"megatron_args.txt", PRETRAIN_GPT} <= set(files)
    assert files[PRETRAIN_GPT].mode == EXEC_MODE
    ddp = render_bundle(make_plan())
    assert PRETRAIN_GPT not in ddp and "megatron_args.txt" not in ddp


@pytest.mark.parametrize("data", [False, True], ids=["mock-data", "data-path"])
def test_pretrain_gpt_command_parses_with_torchrun(tmp_path: Path, data: bool) -> None:
    from torch.distributed.run import get_args_parser

    plan = golden_plans()["llama70b_4x8h100_3d"]
    bundle = tmp_path / "bundle"
    write_bundle(plan, bundle)
    dump = tmp_path / "dump.py"
    dump.write_text(DUMP)
    out = tmp_path / "argv.json"
    megatron = tmp_path / "Megatron-LM"
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(
        {
            "TORCHRUN": f"{sys.executable} {dump}",
            "DUMP_TO": str(out),
            "MEGATRON_LM": str(megatron),
            "NODE_RANK": "2",
        }
    )
    if data:
        env.update({"DATA_PATH": "/data/corpus_text_document", "TOKENIZER_MODEL": "meta/llama"})
    proc = subprocess.run(
        ["bash", str(bundle / PRETRAIN_GPT)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(out.read_text())
    assert Path(got["cwd"]) == bundle.resolve()
    a = get_args_parser().parse_args(got["argv"])
    assert (a.nnodes, a.nproc_per_node, a.node_rank) == ("4", "8", 2)
    assert a.master_addr == got["addr"] == "10.0.0.1"
    assert a.training_script == f"{megatron}/pretrain_gpt.py"
    words = [
        w
        for line in megatron_args(plan).splitlines()
        if not line.startswith("#")
        for w in line.split()
    ]
    rest = a.training_script_args
    assert rest[: len(words)] == words
    if data:
        assert rest[len(words) :] == [
            "--data-path",
            "/data/corpus_text_document",
            "--tokenizer-type",
            "HuggingFaceTokenizer",
            "--tokenizer-model",
            "meta/llama",
        ]
    else:
        assert rest[len(words) :] == [
            "--mock-data",
            "--tokenizer-type",
            "NullTokenizer",
            "--vocab-size",
            str(plan.model.vocab),
        ]


def test_pretrain_gpt_refuses_without_megatron_lm(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(golden_plans()["llama70b_4x8h100_3d"], bundle)
    env = {k: v for k, v in os.environ.items() if k != "MEGATRON_LM"}
    env["TORCHRUN"] = "false"
    proc = subprocess.run(
        ["bash", str(bundle / PRETRAIN_GPT)], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0 and "set MEGATRON_LM" in proc.stderr


@pytest.mark.parametrize(
    ("recompute", "flags"),
    [
        ("none", []),
        ("selective", ["--recompute-granularity selective"]),
        ("mlp", ["--recompute-granularity selective", "--recompute-modules mlp"]),
        ("full", ["--recompute-granularity full", "--recompute-method uniform"]),
    ],
)
def test_recompute_flags_follow_the_layout(recompute: str, flags: list[str]) -> None:
    from engine.plan.names import Recompute

    plan = make_plan(
        model=ModelSpec(preset="llama-3-8b"),
        gpu="h100-sxm",
        gpus_per_node=8,
        strategy=Strategy.THREE_D,
        recompute=Recompute(recompute),
    )
    lines = [line for line in megatron_args(plan).splitlines() if line.startswith("--recompute")]
    assert all(f in lines for f in flags) and len(lines) == len(flags) + (recompute == "full")


def test_a_sharded_moe_layout_writes_megatron_fsdp() -> None:
    # Qwen3-30B-A3B on one H100 node: the planner shards the experts' states over the data
    # parallel ranks (Megatron-FSDP with EP); the arguments must ask Megatron for exactly that.
    from engine.plan.planner import plan as make
    from engine.plan.specs import HardwareSpec, Spec, TrainingSpec

    p = make(
        Spec(
            model=ModelSpec(preset="qwen3-30b-a3b"),
            hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=1),
            training=TrainingSpec(seq_len=4096, global_batch=512),
        )
    )
    assert p.recommended.zero_stage == 3 and p.recommended.ep > 1
    lines = [line for line in megatron_args(p).splitlines() if not line.startswith("#")]
    for flag in (
        "--use-megatron-fsdp",
        "--data-parallel-sharding-strategy optim_grads_params",
        "--use-distributed-optimizer",
        f"--expert-model-parallel-size {p.recommended.ep}",
        "--moe-token-dispatcher-type alltoall",
        "--moe-grouped-gemm",
    ):
        assert flag in lines, flag


@pytest.mark.parametrize(
    ("optimizer", "zero_stage", "tp", "flags"),
    [
        ("adamw", 1, 1, []),
        ("sgd", 1, 1, ["--optimizer sgd", "--sgd-momentum 0.9"]),
        (
            "adam8bit",
            1,
            1,
            ["--use-precision-aware-optimizer", "--exp-avg-dtype fp8", "--exp-avg-sq-dtype fp8"],
        ),
        # One data-parallel rank: the distributed optimizer shards nothing but holds the states.
        (
            "adam8bit",
            0,
            8,
            [
                "--use-distributed-optimizer",
                "--use-precision-aware-optimizer",
                "--exp-avg-dtype fp8",
                "--exp-avg-sq-dtype fp8",
            ],
        ),
    ],
)
def test_the_optimizer_is_written_as_it_was_planned(
    optimizer: str, zero_stage: int, tp: int, flags: list[str]
) -> None:
    # Megatron's default is Adam with fp32 moments: an SGD or 8-bit Adam plan (its memory
    # counted at 4 or 2 bytes of states a parameter) must say so, or Megatron runs another one.
    plan = make_plan(
        model=ModelSpec(preset="llama-3-8b"),
        gpu="h100-sxm",
        gpus_per_node=8,
        strategy=Strategy.THREE_D,
        zero_stage=zero_stage,
        tp=tp,
        training={"optimizer": optimizer},
    )
    optimizer_flags = ("--optimizer", "--sgd", "--use-precision", "--exp-avg")
    lines = [x for x in megatron_args(plan).splitlines() if x.startswith(optimizer_flags)]
    if zero_stage == 0:
        lines = [x for x in megatron_args(plan).splitlines() if x in flags]
    assert lines == flags


def test_8bit_adam_without_the_distributed_optimizer_is_refused() -> None:
    from engine.errors import DtrainError

    plan = make_plan(
        model=ModelSpec(preset="llama-3-8b"),
        gpu="h100-sxm",
        gpus_per_node=8,
        strategy=Strategy.THREE_D,
        zero_stage=0,
        tp=2,
        training={"optimizer": "adam8bit"},
    )
    with pytest.raises(DtrainError) as e:
        megatron_args(plan)
    assert e.value.field == "training.optimizer" and "--zero-stage 1" in str(e.value)


def test_llama3_scaling_without_a_factor_keeps_megatrons_default(tmp_path: Path) -> None:
    cfg = {
        "model_type": "llama",
        "hidden_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3"},
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    plan = make_plan(
        model=ModelSpec(config_path=tmp_path / "config.json"),
        gpu="h100-sxm",
        gpus_per_node=8,
        strategy=Strategy.THREE_D,
    )
    lines = megatron_args(plan).splitlines()
    assert "--use-rope-scaling" in lines
    assert not any(line.startswith("--rope-scaling-factor") for line in lines)

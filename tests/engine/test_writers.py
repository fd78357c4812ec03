"""Config writers, checked by the programs that read them: torchrun's own argument parser (fed
by actually running each node script under bash), DeepSpeed's hostfile parser, SkyPilot's task
loader, Accelerate's config loader; plus shell-injection and never-lose-a-user's-edit tests."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli import main
from engine.errors import DtrainError
from engine.plan.names import (
    Backend,
    Framework,
    NetworkTier,
    Offload,
    Precision,
    Recompute,
    Strategy,
)
from engine.plan.result import Plan
from engine.plan.specs import ModelSpec
from engine.write import (
    Scheduler,
    WriteOptions,
    ds_config_dict,
    fsdp_settings_dict,
    megatron_args,
    nccl_env,
    render_bundle,
    write_bundle,
)
from engine.write.bundle import manifest_text
from engine.write.checks import check_spec_batch
from engine.write.manifest import read_manifest
from tests.engine.writers_fixtures import golden_plans, make_plan

DUMP = """\
import json, os, sys
keys = ("MASTER_ADDR", "MASTER_PORT", "EVIL", "OMP_NUM_THREADS", "NCCL_DEBUG")
with open(os.environ["DUMP_TO"], "w") as f:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(),
               "env": {k: os.environ.get(k) for k in keys}}, f)
"""


def _plans() -> dict[str, Plan]:
    plans = dict(golden_plans())
    plans["zero3_offload_2x4"] = make_plan(
        gpu="a100-80gb",
        gpus_per_node=4,
        nodes=2,
        strategy=Strategy.ZERO3,
        offload=Offload.OPTIMIZER_PARAMS,
        tier=NetworkTier.ROCE,
        launch={"hosts": ["gpu-a", "gpu-b"], "max_restarts": 3, "master_port": 31000},
    )
    plans["user_script"] = make_plan(
        strategy=Strategy.FSDP_FULL,
        launch={"script": "my train.py", "script_args": ["--epochs", "2"]},
    )
    return plans


def run_node_script(
    bundle: Path, node: int, tmp: Path, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run launch_node{node}.sh under bash with TORCHRUN set to a program that records the
    words it receives, exactly as torchrun would receive them."""
    dump = tmp / "dump_args.py"
    dump.write_text(DUMP)
    out = tmp / f"dump{node}.json"
    full = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    # Hostile values include `rm -rf ~`: should quoting ever break, ~ is a sandbox, not $HOME.
    sandbox = tmp / "home"
    sandbox.mkdir(exist_ok=True)
    (sandbox / "sentinel").write_text("still here\n")
    full.update({"TORCHRUN": f"{sys.executable} {dump}", "DUMP_TO": str(out), "HOME": str(sandbox)})
    full.update(env or {})
    proc = subprocess.run(
        ["bash", str(bundle / f"launch_node{node}.sh")],
        env=full,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert (sandbox / "sentinel").is_file()
    data: dict[str, Any] = json.loads(out.read_text())
    return data


@pytest.mark.parametrize("name", sorted(_plans()))
def test_every_torchrun_line_parses_with_torchruns_parser(name: str, tmp_path: Path) -> None:
    from torch.distributed.run import get_args_parser

    plan = _plans()[name]
    bundle = tmp_path / "bundle"
    write_bundle(plan, bundle)
    launch = plan.spec.launch
    # Without hosts a multi-node script needs MASTER_ADDR (SkyPilot's run section sets it).
    needs_addr = plan.nodes > 1 and not launch.hosts and not launch.master_addr
    env = {"MASTER_ADDR": "10.9.9.9"} if needs_addr else {}
    for node in range(plan.nodes):
        got = run_node_script(bundle, node, tmp_path, env)
        assert Path(got["cwd"]) == bundle.resolve()
        a = get_args_parser().parse_args(got["argv"])
        assert a.nnodes == str(plan.nodes)
        assert a.nproc_per_node == str(plan.gpus_per_node)
        assert a.node_rank == node
        assert a.max_restarts == 0  # the launcher's restart policy restarts whole runs
        assert a.tee == "3" and a.log_dir == "logs"
        port = launch.master_port
        if plan.nodes == 1:
            assert a.rdzv_backend == "c10d"
            assert a.rdzv_endpoint == f"127.0.0.1:{port}"
        else:
            assert a.rdzv_backend == "static"
            first = launch.parsed_hosts()[0].host if launch.hosts else "10.9.9.9"
            assert a.master_addr == (launch.master_addr or first)
            assert a.master_port == port
            assert got["env"]["MASTER_ADDR"] == a.master_addr
        # Every rank starts through the rank agent, the real script its first argument.
        assert a.training_script == "dtrain_agent.py"
        if launch.script is None:
            assert a.training_script_args[:3] == ["train.py", "--bundle", "."]
        else:
            assert a.training_script_args[0] == launch.script
        if plan.recommended.framework.value == "megatron":
            words = [
                w
                for line in megatron_args(plan).splitlines()
                if not line.startswith("#")
                for w in line.split()
            ]
            assert a.training_script_args[1:] == launch.script_args + words
        elif launch.script is not None:
            assert a.training_script_args[1:] == launch.script_args


def test_bundles_for_real_planner_output(tmp_path: Path) -> None:
    """What the planner recommends for common set-ups always renders, and node 0's torchrun
    line carries the plan's node and GPU counts."""
    from torch.distributed.run import get_args_parser

    from engine.plan.planner import plan
    from engine.plan.specs import HardwareSpec, NetworkSpec, Spec, demo_spec

    h100 = {"gpu": "h100-sxm", "gpus_per_node": 8}
    specs = [
        demo_spec(),
        Spec(
            model=ModelSpec(preset="llama-2-7b"),
            hardware=HardwareSpec(gpu="a100-80gb", gpus_per_node=8),
        ),
        Spec(
            model=ModelSpec(preset="llama-2-70b"),
            hardware=HardwareSpec(**h100, nodes=4),
            network=NetworkSpec(tier=NetworkTier.IB_NDR),
        ),
        Spec(
            model=ModelSpec(preset="mixtral-8x7b"),
            hardware=HardwareSpec(**h100, nodes=2),
            network=NetworkSpec(tier=NetworkTier.EFA),
        ),
        Spec(
            model=ModelSpec(preset="llama-2-13b"),
            hardware=HardwareSpec(gpu="a10g", gpus_per_node=4, nodes=2),
        ),
    ]
    for i, spec in enumerate(specs):
        p = plan(spec)
        out = tmp_path / str(i)
        write_bundle(p, out)
        env = {"MASTER_ADDR": "10.0.0.1"} if p.nodes > 1 else {}
        a = get_args_parser().parse_args(run_node_script(out, 0, tmp_path, env)["argv"])
        assert (a.nnodes, a.nproc_per_node) == (str(p.nodes), str(p.gpus_per_node))


def test_master_addr_and_port_come_from_the_environment_when_set(tmp_path: Path) -> None:
    plan = golden_plans()["mixtral_2x8h100_fsdp"]  # two nodes, no hosts: MASTER_ADDR required
    write_bundle(plan, tmp_path / "b")
    proc = subprocess.run(
        ["bash", str(tmp_path / "b" / "launch_node1.sh")],
        env={**os.environ, "TORCHRUN": "true"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode != 0 and "MASTER_ADDR" in proc.stderr
    got = run_node_script(
        tmp_path / "b", 1, tmp_path, {"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "40001"}
    )
    argv = got["argv"]
    assert argv[argv.index("--master-addr") + 1] == "10.1.2.3"
    assert argv[argv.index("--master-port") + 1] == "40001"
    single = make_plan()
    write_bundle(single, tmp_path / "s")
    got = run_node_script(tmp_path / "s", 0, tmp_path, {"MASTER_PORT": "40002"})
    assert got["argv"][got["argv"].index("--rdzv-endpoint") + 1] == "127.0.0.1:40002"


HOSTILE = ["; rm -rf ~", "$(touch CANARY)", "`touch CANARY`", 'it\'s "quoted"', "a b\tc", "*"]


def test_hostile_values_reach_the_program_as_literal_text(tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    args = [h.replace("CANARY", str(canary)) for h in HOSTILE]
    evil_env = f"$(touch {canary}); rm -rf ~ `touch {canary}` 'x\"y"
    plan = make_plan(
        launch={
            "script": f"$(touch {canary}).py",
            "script_args": args,
            "env": {"EVIL": evil_env},
        },
    )
    write_bundle(plan, tmp_path / "b")
    got = run_node_script(tmp_path / "b", 0, tmp_path)
    assert not canary.exists()
    script_at = got["argv"].index(f"$(touch {canary}).py")
    assert got["argv"][script_at + 1 :] == args
    assert got["env"]["EVIL"] == evil_env
    import yaml

    run = yaml.safe_load((tmp_path / "b" / "sky.yaml").read_text())["run"]
    assert "'; rm -rf ~'" in run and "'$(touch " in run  # quoted in the run section too


def test_a_model_name_with_a_newline_cannot_escape_a_comment(tmp_path: Path) -> None:
    """Model names come from a user's config.json and appear in script and YAML comments."""
    canary = tmp_path / "pwned"
    plan = make_plan()
    evil = plan.model.model_copy(update={"name": f"x\ntouch {canary}\nname: y"})
    plan = plan.model_copy(update={"model": evil})
    write_bundle(plan, tmp_path / "b")
    run_node_script(tmp_path / "b", 0, tmp_path)
    assert not canary.exists()
    import sky

    from engine.write.naming import run_name

    task = sky.Task.from_yaml(str(tmp_path / "b" / "sky.yaml"))
    assert task.name == run_name(plan) and "\n" not in task.name


@pytest.mark.parametrize(
    ("launch", "field"),
    [
        ({"script_args": ["ok", "two\nlines"]}, "launch.script_args"),
        ({"script": "train.py\nrm -rf ~"}, "launch.script"),
    ],
)
def test_values_that_cannot_be_quoted_on_one_line_are_rejected(
    launch: dict[str, Any], field: str
) -> None:
    plan = make_plan(nodes=2, launch=launch)
    with pytest.raises(DtrainError) as e:
        render_bundle(plan)
    assert e.value.field == field
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("addr", ["10.0.0.1; rm -rf ~", "$(id)", "10.0.0.1\n", "-oProxyCommand=x"])
def test_a_bad_master_addr_is_refused_by_the_writer_too(addr: str) -> None:
    """The spec refuses these; a plan built around it (model_copy skips validation) still
    gets no script: the writer checks the address whole (a trailing newline passed ``$``)."""
    plan = make_plan(nodes=2)
    launch = plan.spec.launch.model_copy(update={"master_addr": addr})
    plan = plan.model_copy(update={"spec": plan.spec.model_copy(update={"launch": launch})})
    with pytest.raises(DtrainError) as e:
        render_bundle(plan)
    assert e.value.field == "launch.master_addr"
    assert "\n" not in str(e.value).replace("\\n", "")


def test_hostile_hosts_and_env_are_rejected_by_the_spec() -> None:
    from pydantic import ValidationError

    for bad in (
        {"hosts": ["node1; rm -rf ~"]},
        {"hosts": ["$(id)"]},
        {"hosts": ["-oProxyCommand=x"]},
        {"hosts": ["root@-x"]},
        {"env": {"A": "x\ny"}},
        {"master_addr": "10.0.0.1\n"},
        {"master_addr": "-oX"},
        {"master_addr": "$(id)"},
    ):
        with pytest.raises(ValidationError):
            make_plan(launch=bad)


@pytest.mark.parametrize("name", sorted(_plans()))
def test_hostfile_matches_deepspeeds_parser(name: str, tmp_path: Path) -> None:
    from deepspeed.launcher.runner import fetch_hostfile

    plan = _plans()[name]
    write_bundle(plan, tmp_path)
    pool = fetch_hostfile(str(tmp_path / "hostfile"))
    assert pool is not None and len(pool) == plan.nodes
    assert set(pool.values()) == {plan.gpus_per_node}
    hosts = plan.spec.launch.parsed_hosts()
    if hosts:
        assert [h.split("@")[-1] for h in pool] == [h.host for h in hosts]


@pytest.mark.parametrize("name", sorted(_plans()))
def test_sky_yaml_loads_with_skypilot(name: str, tmp_path: Path) -> None:
    import sky

    plan = _plans()[name]
    write_bundle(plan, tmp_path)
    task = sky.Task.from_yaml(str(tmp_path / "sky.yaml"))
    assert task.num_nodes == plan.nodes
    (res,) = list(task.resources)
    if plan.gpu.dist_backend == "gloo":
        assert res.accelerators is None
    else:
        assert list(res.accelerators.values()) == [plan.gpus_per_node]
    assert task.envs["MASTER_PORT"] == str(plan.spec.launch.master_port)
    assert "$SKYPILOT_NODE_RANK" in (task.run or "")


@pytest.mark.parametrize(
    ("name", "version"), [("mixtral_2x8h100_fsdp", 2), ("user_script", 2), ("user_script", 1)]
)
def test_accelerate_config_loads_with_accelerates_loader(
    name: str, version: int, tmp_path: Path
) -> None:
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    from accelerate.commands.config.config_args import ClusterConfig

    plan = _plans()[name]
    write_bundle(plan, tmp_path, options=WriteOptions(fsdp_version=version))
    cfg = ClusterConfig.from_yaml_file(str(tmp_path / "accelerate_config.yaml"))
    assert str(cfg.distributed_type).endswith("FSDP")
    assert cfg.num_machines == plan.nodes
    assert cfg.num_processes == plan.world_size
    assert cfg.fsdp_config["fsdp_version"] == version
    assert json.loads((tmp_path / "fsdp.json").read_text())["fsdp_version"] == version
    if version == 1:
        assert cfg.fsdp_config["fsdp_sharding_strategy"] == "FULL_SHARD"
    expected = fsdp_settings_dict(plan)["transformer_layer_cls_to_wrap"][0]
    assert cfg.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == expected


def test_a_context_parallel_plan_carries_its_cp_to_accelerate(tmp_path: Path) -> None:
    # FSDP2 + CP: fsdp.json names the degree (the example trainer splits each sequence over
    # that many consecutive ranks) and Accelerate's own launcher reads the mesh from the config.
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    plan = make_plan(strategy=Strategy.FSDP_FULL, gpus_per_node=4, cp=2, seq_len=64)
    write_bundle(plan, tmp_path, options=WriteOptions(fsdp_version=2))
    assert json.loads((tmp_path / "fsdp.json").read_text())["context_parallel"] == 2
    parsed = launch_command_parser().parse_args(
        ["--config_file", str(tmp_path / "accelerate_config.yaml"), "train.py"]
    )
    args, _, _ = _validate_launch_command(parsed)
    assert args.use_fsdp and args.use_parallelism_config
    assert (args.parallelism_config_cp_size, args.parallelism_config_dp_shard_size) == (2, 2)
    with pytest.raises(DtrainError) as e:
        write_bundle(plan, tmp_path / "v1", options=WriteOptions(fsdp_version=1))
    assert "--fsdp-version 2" in str(e.value)
    plain = make_plan(strategy=Strategy.FSDP_FULL, gpus_per_node=4)
    assert "context_parallel" not in fsdp_settings_dict(plain)


def test_fsdp_settings_follow_the_plan() -> None:
    hybrid = fsdp_settings_dict(golden_plans()["mixtral_2x8h100_fsdp"])
    assert hybrid["sharding_strategy"] == "HYBRID_SHARD"
    assert hybrid["device_mesh"] == {"replicate": 2, "shard": 8}
    assert hybrid["activation_checkpointing"] is True
    assert hybrid["mixed_precision"]["param_dtype"] == "bfloat16"
    grad_op = fsdp_settings_dict(make_plan(strategy=Strategy.FSDP_GRAD_OP))
    assert grad_op["sharding_strategy"] == "SHARD_GRAD_OP"
    assert grad_op["reshard_after_forward"] is False
    assert grad_op["mixed_precision"] is None  # fp32 on cpu
    user = fsdp_settings_dict(
        make_plan(
            model=ModelSpec(preset="llama-2-7b"),
            strategy=Strategy.FSDP_FULL,
            launch={"script": "train_llama.py"},
        )
    )
    assert user["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]


def _walk(x: Any) -> list[Any]:
    if isinstance(x, dict):
        return [v for val in x.values() for v in _walk(val)]
    if isinstance(x, list):
        return [v for val in x for v in _walk(val)]
    return [x]


def test_ds_config_has_no_auto_unless_hf_integration() -> None:
    for stage in (Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3):
        plan = make_plan(strategy=stage, precision=Precision.BF16)
        assert "auto" not in _walk(ds_config_dict(plan))
        hf = make_plan(strategy=stage, launch={"hf_integration": True})
        cfg = ds_config_dict(hf)
        assert cfg["train_batch_size"] == "auto"
        assert cfg["optimizer"]["params"]["lr"] == "auto"


def test_ds_config_blocks() -> None:
    z3 = ds_config_dict(
        make_plan(
            model=ModelSpec(preset="llama-2-7b"),
            strategy=Strategy.ZERO3,
            offload=Offload.OPTIMIZER_PARAMS,
            precision=Precision.FP16,
        )
    )
    zo = z3["zero_optimization"]
    assert zo["stage"] == 3 and zo["overlap_comm"] and zo["contiguous_gradients"]
    assert zo["reduce_bucket_size"] == 4096 * 4096
    assert zo["stage3_param_persistence_threshold"] == 40960
    assert zo["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert zo["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert z3["fp16"]["enabled"] is True and z3["fp16"]["loss_scale"] == 0
    assert "bf16" not in z3
    z2 = ds_config_dict(
        make_plan(
            strategy=Strategy.ZERO2,
            micro_batch=3,
            grad_accum=5,
            training={"grad_clip": 0.5, "optimizer": "sgd"},
        )
    )
    assert (z2["train_batch_size"], z2["train_micro_batch_size_per_gpu"]) == (30, 3)
    assert z2["gradient_accumulation_steps"] == 5 and z2["gradient_clipping"] == 0.5
    assert z2["optimizer"]["type"] == "SGD"
    assert "offload_optimizer" not in z2["zero_optimization"]
    sched = ds_config_dict(
        make_plan(strategy=Strategy.ZERO1, steps=100),
        scheduler=Scheduler.WARMUP_DECAY,
        warmup_steps=10,
    )
    assert sched["scheduler"]["type"] == "WarmupDecayLR"
    assert sched["scheduler"]["params"]["total_num_steps"] == 100
    with pytest.raises(DtrainError, match="stage 3"):
        ds_config_dict(make_plan(strategy=Strategy.ZERO2, offload=Offload.OPTIMIZER_PARAMS))


def test_wrong_batch_product_is_caught_with_every_factor_named() -> None:
    # A Layout's global batch is its micro_batch x grad_accum x dp by construction: what can
    # differ is the batch the spec asked for.
    plan = make_plan(strategy=Strategy.ZERO2, micro_batch=4, grad_accum=2, global_batch=12)
    assert plan.recommended.global_batch == 16
    with pytest.raises(DtrainError) as e:
        check_spec_batch(plan)
    msg = str(e.value)
    assert e.value.field == "training.global_batch"
    assert "12 is not training.micro_batch x grad_accum x dp (4 x 2 x 2 = 16)" in msg


def test_nccl_env_per_fabric_with_a_reason_per_variable(tmp_path: Path) -> None:
    def env_of(plan: Plan) -> dict[str, str]:
        text = nccl_env(plan)
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if "=" in line and not line.startswith("#") and "launch.env" not in lines[i - 1]:
                assert lines[i - 1].startswith("# "), f"no reason above {line}"
        f = tmp_path / "nccl.env"
        f.write_text(text)
        out = subprocess.run(
            ["bash", "-c", f"set -a; source {f}; env -0"],
            capture_output=True,
            text=True,
            env={},
            check=True,
        ).stdout
        return dict(kv.split("=", 1) for kv in out.split("\0") if "=" in kv)

    base = {"gpu": "h100-sxm", "gpus_per_node": 8, "nodes": 2}
    ib = env_of(make_plan(**base, tier=NetworkTier.IB_NDR, network={"ib_hca": "mlx5_0"}))
    assert ib["NCCL_IB_DISABLE"] == "0" and ib["NCCL_IB_HCA"] == "mlx5_0"
    assert ib["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    tcp = env_of(make_plan(**base, tier=NetworkTier.TCP))
    assert tcp["NCCL_IB_DISABLE"] == "1" and tcp["NCCL_SOCKET_IFNAME"] == "^lo,docker"
    efa = env_of(make_plan(**base, tier=NetworkTier.EFA))
    assert efa["FI_PROVIDER"] == "efa" and "NCCL_IB_DISABLE" not in efa
    roce = env_of(make_plan(**base, tier=NetworkTier.ROCE))
    assert roce["NCCL_IB_GID_INDEX"] == "3"
    one_node = env_of(make_plan(gpu="h100-sxm", gpus_per_node=8, tier=NetworkTier.IB))
    assert "NCCL_IB_DISABLE" not in one_node and one_node["NCCL_DEBUG"] == "WARN"
    cpu = env_of(make_plan(launch={"nccl_debug": "INFO", "env": {"FOO": "a b"}}))
    assert not any(k.startswith("NCCL_") for k in cpu) and cpu["FOO"] == "a b"


def test_megatron_args_for_3d() -> None:
    text = megatron_args(golden_plans()["llama70b_4x8h100_3d"])
    for flag in (
        "--tensor-model-parallel-size 8",
        "--pipeline-model-parallel-size 2",
        "--sequence-parallel",
        "--num-layers-per-virtual-pipeline-stage 20",
        "--global-batch-size 64",
        "--recompute-granularity selective",
    ):
        assert flag in text.splitlines()
    moe = megatron_args(
        make_plan(
            model=ModelSpec(preset="mixtral-8x7b"),
            gpu="h100-sxm",
            gpus_per_node=8,
            strategy=Strategy.THREE_D,
            tp=2,
            ep=4,
            recompute=Recompute.FULL,
        )
    )
    assert "--expert-model-parallel-size 4" in moe and "--num-experts 8" in moe
    assert "--recompute-method uniform" in moe
    with pytest.raises(DtrainError, match="virtual"):
        megatron_args(
            make_plan(
                gpu="h100-sxm",
                gpus_per_node=8,
                strategy=Strategy.THREE_D,
                tp=2,
                pp=2,
                virtual_stages=3,
            )
        )


# ----------------------------------------------------------------- writing without losing edits


def _ds_plan(micro: int = 2) -> Plan:
    return make_plan(strategy=Strategy.ZERO2, micro_batch=micro)


def test_bundle_files_modes_and_manifest(tmp_path: Path) -> None:
    plan = _ds_plan()
    report = write_bundle(plan, tmp_path)
    assert "ds_config.json" in report.written and "bundle.json" in report.written
    script = tmp_path / "launch_node0.sh"
    assert script.stat().st_mode & stat.S_IXUSR
    assert not (tmp_path / "ds_config.json").stat().st_mode & stat.S_IXUSR
    m = read_manifest(tmp_path)
    assert m.framework == "deepspeed" and m.node_scripts == ["launch_node0.sh"]
    assert m.world_size == 2 and m.dist_backend == "gloo"
    assert set(m.files) == set(render_bundle(plan))
    again = write_bundle(plan, tmp_path)
    assert again.written == [] and "ds_config.json" in again.unchanged


def test_manifest_names_are_enums_and_old_manifests_read_back_byte_identical(
    tmp_path: Path,
) -> None:
    """bundle.json's framework and backend are the spec's StrEnums: a manifest written before
    they were (plain strings) reads back as the enum members, still equal to the strings the
    launch code compares them with, and writes back the same bytes."""
    write_bundle(_ds_plan(), tmp_path)
    path = tmp_path / "bundle.json"
    text = path.read_text()
    assert '"framework": "deepspeed"' in text and '"backend": "local"' in text
    m = read_manifest(tmp_path)
    assert m.framework is Framework.DEEPSPEED and m.backend is Backend.LOCAL
    assert m.framework == "deepspeed" and m.backend == "local" and f"{m.backend}" == "local"
    assert manifest_text(m) == text
    data = json.loads(text)
    data["backend"] = "ssh"
    path.write_text(json.dumps(data))
    assert read_manifest(tmp_path).backend is Backend.SSH


def test_an_edited_file_is_refused_then_backed_up_with_force(tmp_path: Path) -> None:
    write_bundle(_ds_plan(), tmp_path)
    cfg = tmp_path / "ds_config.json"
    mine = cfg.read_text().replace('"steps_per_print": 100', '"steps_per_print": 7')
    cfg.write_text(mine)
    before = (tmp_path / "plan.json").read_text()
    with pytest.raises(DtrainError) as e:
        write_bundle(_ds_plan(micro=4), tmp_path)
    assert "ds_config.json (edited since dtrain-tui wrote it)" in str(e.value)
    assert "--force" in str(e.value)
    assert cfg.read_text() == mine and (tmp_path / "plan.json").read_text() == before
    report = write_bundle(_ds_plan(micro=4), tmp_path, force=True)
    bak = tmp_path / report.backed_up["ds_config.json"]
    assert bak.name.startswith("ds_config.json.bak-") and bak.read_text() == mine
    assert json.loads(cfg.read_text())["train_micro_batch_size_per_gpu"] == 4
    assert "backed up your ds_config.json as " + bak.name in report.lines()


def test_a_file_dtrain_did_not_write_is_protected(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("# my own trainer\n")
    (tmp_path / "notes.txt").write_text("unrelated\n")
    with pytest.raises(DtrainError, match=r"train.py \(not written by dtrain-tui\)"):
        write_bundle(make_plan(), tmp_path)
    assert not (tmp_path / "bundle.json").exists()
    write_bundle(make_plan(), tmp_path, force=True)
    baks = list(tmp_path.glob("train.py.bak-*"))
    assert len(baks) == 1 and baks[0].read_text() == "# my own trainer\n"
    assert (tmp_path / "notes.txt").read_text() == "unrelated\n"


def test_files_the_new_plan_drops_are_removed_only_when_unedited(tmp_path: Path) -> None:
    write_bundle(_ds_plan(), tmp_path)
    report = write_bundle(make_plan(strategy=Strategy.FSDP_FULL), tmp_path)
    assert report.removed == ["ds_config.json"] and not (tmp_path / "ds_config.json").exists()
    (tmp_path / "fsdp.json").write_text("{}\n")
    report = write_bundle(_ds_plan(), tmp_path)
    assert report.kept == ["fsdp.json"] and report.removed == ["accelerate_config.yaml"]
    assert (tmp_path / "fsdp.json").read_text() == "{}\n"


def test_a_foreign_manifest_is_protected(tmp_path: Path) -> None:
    (tmp_path / "bundle.json").write_text("not json")
    with pytest.raises(DtrainError, match="bundle.json"):
        write_bundle(make_plan(), tmp_path)
    report = write_bundle(make_plan(), tmp_path, force=True)
    assert "bundle.json" in report.backed_up


def test_write_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b"
    argv = [
        "write",
        "--layers",
        "2",
        "--hidden",
        "64",
        "--heads",
        "4",
        "--vocab",
        "128",
        "--gpu",
        "cpu",
        "--gpus-per-node",
        "2",
        "--seq-len",
        "32",
        "--global-batch",
        "8",
        "--strategy",
        "zero2",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "wrote ds_config.json" in text and f"dtrain-tui launch {out}" in text
    cfg = json.loads((out / "ds_config.json").read_text())
    assert cfg["train_batch_size"] == 8
    (out / "nccl.env").write_text("# mine\n")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nccl.env" in err and "--force" in err
    assert main([*argv, "--force"]) == 0
    assert "backed up your nccl.env" in capsys.readouterr().out
    assert main([*argv[:-2], "--print", "ds_config.json", "--scheduler", "warmup"]) == 0
    assert json.loads(capsys.readouterr().out)["scheduler"]["type"] == "WarmupLR"


def test_write_command_from_a_spec_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "run.toml"
    spec.write_text(
        "[model]\nlayers = 2\nhidden = 64\nheads = 4\nvocab = 128\n"
        '[hardware]\ngpu = "cpu"\ngpus_per_node = 2\nnodes = 2\n'
        '[layout]\nstrategy = "fsdp-full"\n'
        '[launch]\nhosts = ["10.0.0.5", "10.0.0.6"]\nscript_args = ["--tag", "$(id)"]\n'
        '[launch.env]\nWANDB_PROJECT = "a b; c"\n'
    )
    out = tmp_path / "b"
    assert main(["write", "--spec", str(spec), "--fsdp-version", "1", "--out", str(out)]) == 0
    m = read_manifest(out)
    assert m.nodes == 2 and m.hosts == ["10.0.0.5", "10.0.0.6"] and m.master_addr == "10.0.0.5"
    assert m.node_scripts == ["launch_node0.sh", "launch_node1.sh"]
    assert json.loads((out / "fsdp.json").read_text())["fsdp_version"] == 1
    assert "WANDB_PROJECT='a b; c'" in (out / "nccl.env").read_text()
    assert "'$(id)'" in (out / "launch_node1.sh").read_text()
    assert main(["write", "--spec", str(spec), "--print", "nope.txt"]) == 2
    assert "has no 'nope.txt'" in capsys.readouterr().err

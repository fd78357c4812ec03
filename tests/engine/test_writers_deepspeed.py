"""Every ds_config.json we write is accepted by DeepSpeed's own ``DeepSpeedConfig`` at the plan's
data-parallel size; a wrong batch product is rejected by DeepSpeed, and caught by our check
first with a message naming every factor."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from engine.errors import DtrainError
from engine.plan.names import Framework, Offload, Precision, Strategy
from engine.plan.result import Plan
from engine.plan.specs import ModelSpec
from engine.write import Scheduler, ds_config_dict
from engine.write.checks import check_spec_batch
from tests.engine.writers_fixtures import make_plan

pytestmark = pytest.mark.slow


class DataParallelOnly:
    """The ``mpu`` DeepSpeed asks for the data-parallel world size (no model parallelism)."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0


@pytest.fixture(scope="module")
def ds_comm() -> Iterator[Any]:
    """deepspeed.comm on a one-rank gloo group (DeepSpeedConfig reads the world size from it)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import importlib

    import deepspeed.comm as dscomm
    import torch.distributed as dist

    # deepspeed.comm re-exports names that shadow its submodules: import them by name.
    dscomm_state = importlib.import_module("deepspeed.comm.comm")
    dstorch = importlib.import_module("deepspeed.comm.torch")

    # The CPU backend JIT-compiles a shared-memory allreduce op on first use (~90 s cold);
    # validating a config never runs a collective, so skip building it.
    mp = pytest.MonkeyPatch()
    mp.setattr(dstorch, "build_shm_op", lambda: None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
    }
    for k, v in env.items():
        mp.setenv(k, v)
    dscomm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    try:
        yield dscomm
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        dscomm_state.cdb = None
        mp.undo()


def _cases() -> dict[str, Plan]:
    llama = ModelSpec(preset="llama-2-7b")
    a100 = {"model": llama, "gpu": "a100-80gb", "precision": Precision.BF16}
    return {
        "ddp-1gpu": make_plan(
            gpus_per_node=1, strategy=Strategy.DDP, framework=Framework.DEEPSPEED
        ),
        "ddp-2cpu-fp32": make_plan(
            strategy=Strategy.DDP, framework=Framework.DEEPSPEED, grad_accum=3
        ),
        "zero1-8": make_plan(**a100, gpus_per_node=8, strategy=Strategy.ZERO1, micro_batch=4),
        "zero2-8": make_plan(**a100, gpus_per_node=8, strategy=Strategy.ZERO2, grad_accum=4),
        # FP8 linears (Transformer Engine in the model code) inside bf16 mixed precision.
        "zero2-8-fp8": make_plan(
            model=llama,
            gpu="h100-sxm",
            precision=Precision.FP8,
            gpus_per_node=8,
            strategy=Strategy.ZERO2,
        ),
        "zero2-offload-16": make_plan(
            **a100, gpus_per_node=8, nodes=2, strategy=Strategy.ZERO2, offload=Offload.OPTIMIZER
        ),
        "zero3-fp16-32": make_plan(
            model=llama,
            gpu="v100-32gb",
            gpus_per_node=8,
            nodes=4,
            strategy=Strategy.ZERO3,
            precision=Precision.FP16,
        ),
        "zero3-offload-64": make_plan(
            **a100,
            gpus_per_node=8,
            nodes=8,
            strategy=Strategy.ZERO3,
            offload=Offload.OPTIMIZER_PARAMS,
            micro_batch=1,
            grad_accum=2,
        ),
        "zero3-sgd-sched": make_plan(
            **a100,
            gpus_per_node=4,
            strategy=Strategy.ZERO3,
            training={"optimizer": "sgd", "lr": 0.1},
            steps=50,
        ),
        "zero2-adam8bit": make_plan(
            **a100, gpus_per_node=2, strategy=Strategy.ZERO2, training={"optimizer": "adam8bit"}
        ),
    }


def _planned() -> dict[str, Plan]:
    """The same check on what the real planner recommends (forced where needed)."""
    from engine.plan.planner import plan
    from engine.plan.specs import HardwareSpec, LayoutSpec, Spec

    a100x8 = HardwareSpec(gpu="a100-80gb", gpus_per_node=8)
    llama = ModelSpec(preset="llama-2-7b")
    return {
        "planned-zero2": plan(
            Spec(model=llama, hardware=a100x8, layout=LayoutSpec(strategy=Strategy.ZERO2))
        ),
        "planned-zero3-offload": plan(
            Spec(
                model=llama,
                hardware=a100x8,
                layout=LayoutSpec(strategy=Strategy.ZERO3, offload=Offload.OPTIMIZER_PARAMS),
            )
        ),
        "planned-zero1-2nodes": plan(
            Spec(
                model=llama,
                hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=2),
                layout=LayoutSpec(strategy=Strategy.ZERO1),
            )
        ),
    }


def _all_cases() -> dict[str, Plan]:
    return {**_cases(), **_planned()}


@pytest.mark.parametrize("name", sorted(_all_cases()))
def test_deepspeed_accepts_every_written_config(name: str, ds_comm: Any) -> None:
    from deepspeed.runtime.config import DeepSpeedConfig

    plan = _all_cases()[name]
    assert plan.recommended.framework == Framework.DEEPSPEED
    sched = Scheduler.WARMUP_DECAY if "sched" in name else Scheduler.NONE
    cfg = ds_config_dict(plan, scheduler=sched)
    lay = plan.recommended
    c = DeepSpeedConfig(cfg, mpu=DataParallelOnly(lay.dp))
    assert c.world_size == lay.dp
    assert c.train_batch_size == lay.global_batch
    assert c.train_micro_batch_size_per_gpu == lay.micro_batch
    assert c.gradient_accumulation_steps == lay.grad_accum
    assert c.zero_optimization_stage == lay.zero_stage
    assert c.bfloat16_config.enabled == (lay.precision in (Precision.BF16, Precision.FP8))
    assert c.float16_config.enabled == (lay.precision == Precision.FP16)
    zc = c.zero_config
    if lay.offload != Offload.NONE:
        assert zc.offload_optimizer is not None and zc.offload_optimizer.pin_memory
    if lay.offload == Offload.OPTIMIZER_PARAMS:
        assert zc.offload_param is not None and str(zc.offload_param.device).endswith("cpu")
    if sched != Scheduler.NONE:
        assert c.scheduler_name == "WarmupDecayLR"


def test_a_wrong_batch_product_is_rejected_by_deepspeed_and_by_us_first(ds_comm: Any) -> None:
    from deepspeed.runtime.config import DeepSpeedConfig

    good = make_plan(
        gpu="a100-80gb",
        gpus_per_node=8,
        strategy=Strategy.ZERO2,
        precision=Precision.BF16,
        micro_batch=4,
        grad_accum=2,
    )
    cfg = ds_config_dict(good)
    cfg["train_batch_size"] = cfg["train_batch_size"] - 8
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        DeepSpeedConfig(cfg, mpu=DataParallelOnly(good.recommended.dp))
    bad = make_plan(
        gpu="a100-80gb",
        gpus_per_node=8,
        strategy=Strategy.ZERO2,
        precision=Precision.BF16,
        micro_batch=4,
        grad_accum=2,
        global_batch=56,
    )
    # The layout trains its micro_batch x grad_accum x dp by construction; the spec's 56 is
    # caught with every factor named.
    assert bad.recommended.global_batch == 64
    with pytest.raises(DtrainError, match=r"56 is not .* \(4 x 2 x 8 = 64\)"):
        check_spec_batch(bad)

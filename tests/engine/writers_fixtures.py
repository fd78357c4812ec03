"""Plans built by hand for the writer tests: fixed layouts and estimates, so the writers' output
(and the golden files) do not move when the planner's cost model is tuned."""

from __future__ import annotations

from typing import Any

from engine.plan.catalog import get_gpu, get_network
from engine.plan.context import usable_memory
from engine.plan.models import resolve_model
from engine.plan.names import (
    Framework,
    NetworkTier,
    Offload,
    PPSchedule,
    Precision,
    Recompute,
    Strategy,
)
from engine.plan.result import GpuInfo, Layout, MemoryBreakdown, Plan
from engine.plan.specs import HardwareSpec, LaunchSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec

GIB = 1024**3

_FRAMEWORK = {
    Strategy.DDP: Framework.DDP,
    Strategy.ZERO1: Framework.DEEPSPEED,
    Strategy.ZERO2: Framework.DEEPSPEED,
    Strategy.ZERO3: Framework.DEEPSPEED,
    Strategy.FSDP_FULL: Framework.FSDP,
    Strategy.FSDP_GRAD_OP: Framework.FSDP,
    Strategy.FSDP_HYBRID: Framework.FSDP,
    Strategy.THREE_D: Framework.MEGATRON,
}
_ZERO = {Strategy.ZERO1: 1, Strategy.ZERO2: 2, Strategy.ZERO3: 3}


def make_plan(
    *,
    model: ModelSpec | None = None,
    gpu: str = "cpu",
    gpus_per_node: int = 2,
    nodes: int = 1,
    strategy: Strategy = Strategy.DDP,
    framework: Framework | None = None,
    zero_stage: int | None = None,
    offload: Offload = Offload.NONE,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    micro_batch: int = 2,
    grad_accum: int = 1,
    global_batch: int | None = None,
    precision: Precision | None = None,
    recompute: Recompute = Recompute.NONE,
    sequence_parallel: bool = False,
    virtual_stages: int = 1,
    seq_len: int = 64,
    steps: int = 3,
    tier: NetworkTier = NetworkTier.TCP,
    network: dict[str, Any] | None = None,
    launch: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
) -> Plan:
    """A Plan with exactly the given layout (dp is what the world size leaves)."""
    g = get_gpu(gpu)
    world = gpus_per_node * nodes
    dp = world // (tp * pp * cp)
    gb = global_batch if global_batch is not None else micro_batch * grad_accum * dp
    prec = precision or g.default_precision()
    spec = Spec(
        model=model or ModelSpec(layers=2, hidden=64, heads=4, vocab=128),
        hardware=HardwareSpec(gpu=gpu, gpus_per_node=gpus_per_node, nodes=nodes),
        network=NetworkSpec(tier=tier, **(network or {})),
        training=TrainingSpec(seq_len=seq_len, global_batch=gb, steps=steps, **(training or {})),
        launch=LaunchSpec(**(launch or {})),
    )
    mem = MemoryBreakdown(
        params=GIB, grads=GIB, optimizer=4 * GIB, activations=2 * GIB, buffers=GIB, total=9 * GIB
    )
    layout = Layout(
        strategy=strategy,
        framework=framework or _FRAMEWORK[strategy],
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=ep,
        etp=1,  # expert TP 1 (the experts whole): what the golden files were written with
        zero_stage=zero_stage if zero_stage is not None else _ZERO.get(strategy, 0),
        offload=offload,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        recompute=recompute,
        sequence_parallel=sequence_parallel,
        precision=prec,
        pp_schedule=PPSchedule.INTERLEAVED if virtual_stages > 1 else PPSchedule.ONE_F_ONE_B,
        virtual_stages=virtual_stages,
        memory_per_gpu=mem,
        fits=True,
        step_time_s=1.5,
        tokens_per_s=1000.0,
        mfu=0.4,
    )
    net = get_network(tier)
    info = GpuInfo(
        key=g.key,
        name=g.name,
        memory_bytes=g.memory_bytes,
        peak_tflops=g.peak_tflops(prec),
        bf16=g.has_bf16,
        intra_node_gbps=g.intra_gbps,
        inter_node_gbps=net.gbps_per_node / 8,
        dist_backend=g.dist_backend,
        price_per_gpu_hour=g.price_per_hour,
    )
    return Plan(
        spec=spec,
        model=resolve_model(spec.model),
        gpu=info,
        world_size=world,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        recommended=layout,
        forced=True,
        usable_bytes=usable_memory(g, None),
    )


def golden_plans() -> dict[str, Plan]:
    """The plans whose bundles are pinned by golden files."""
    return {
        "cpu_demo": make_plan(strategy=Strategy.DDP, micro_batch=4, steps=20),
        "llama7b_8xa100_zero2": make_plan(
            model=ModelSpec(preset="llama-2-7b"),
            gpu="a100-80gb",
            gpus_per_node=8,
            strategy=Strategy.ZERO2,
            micro_batch=4,
            grad_accum=2,
            seq_len=4096,
            precision=Precision.BF16,
            training={"lr": 3e-4, "reference_batch": 32},
        ),
        "llama70b_4x8h100_3d": make_plan(
            model=ModelSpec(preset="llama-2-70b"),
            gpu="h100-sxm",
            gpus_per_node=8,
            nodes=4,
            strategy=Strategy.THREE_D,
            tp=8,
            pp=2,
            micro_batch=1,
            grad_accum=32,
            seq_len=4096,
            recompute=Recompute.SELECTIVE,
            sequence_parallel=True,
            virtual_stages=2,
            zero_stage=1,
            tier=NetworkTier.IB_NDR,
            network={"ib_hca": "mlx5_0,mlx5_1", "socket_ifname": "eth0"},
            launch={
                "backend": "ssh",
                "hosts": ["ubuntu@10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4:2222"],
                "script": "/opt/Megatron-LM/pretrain_gpt.py",
                "nccl_debug": "INFO",
            },
        ),
        "mixtral_2x8h100_fsdp": make_plan(
            model=ModelSpec(preset="mixtral-8x7b"),
            gpu="h100-sxm",
            gpus_per_node=8,
            nodes=2,
            strategy=Strategy.FSDP_HYBRID,
            micro_batch=1,
            grad_accum=4,
            seq_len=4096,
            recompute=Recompute.FULL,
            tier=NetworkTier.EFA,
            launch={"backend": "skypilot", "sky_cloud": "aws"},
        ),
    }

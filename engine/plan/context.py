"""The facts a plan works from, resolved once from the spec: the model's dimensions, the GPU, the
training precision (the flowchart's first step), the hardware the time model reads and the memory
budgets. Built by :func:`engine.plan.planner.plan` and read by every planning step (forced checks,
search, flowchart walk, narration), which never look the spec's defaults up again.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import SpecError
from engine.plan.calibration import Calibration, apply_network, calibrated_usable
from engine.plan.catalog import (
    GpuType,
    get_network,
    host_gpus_problem,
    job_domain,
    list_gpus,
)
from engine.plan.dims import ModelDims
from engine.plan.memory import default_headroom, gpu_usable_bytes, usable_bytes
from engine.plan.names import Fp8Recipe, IntraNodeLink, Precision
from engine.plan.nccl_memory import NcclFabric
from engine.plan.perf import Hardware
from engine.plan.result import PathStep
from engine.plan.specs import Spec


@dataclass(slots=True)
class PlanContext:
    """What one call of the planner knows about the problem."""

    spec: Spec
    dims: ModelDims
    gpu: GpuType
    hw: Hardware
    precision: Precision
    usable: int
    """GPU memory a layout may use (bytes): :func:`usable_memory` less the headroom."""
    headroom_bytes: int
    """What the plan keeps free of :func:`usable_memory` (``training.headroom``, else
    :func:`engine.plan.memory.default_headroom`)."""
    cpu_usable: int
    """Host RAM per node offload may use (bytes)."""
    flash: bool
    """FlashAttention / SDPA kernels: the attention scores are never stored."""
    world: int
    gpn: int
    """GPUs per node."""
    nccl: NcclFabric | None
    """Where the layouts' NCCL buffers run (None on CPU ranks: gloo)."""
    nodes: int
    batch: int
    """The global batch the plan trains: the spec's, or the nearest one a layout can train
    when the spec allows it (``training.global_batch_nearest``)."""

    @classmethod
    def build(cls, spec: Spec, dims: ModelDims, gpu: GpuType, precision: Precision) -> PlanContext:
        """The context of ``spec``: host RAM for offload is the spec's, else twice the node's GPU
        memory. A node larger than the GPU's host (an NVL72 tray) is refused in one line."""
        problem = host_gpus_problem(gpu, spec.hardware.gpus_per_node)
        if problem is not None:
            raise SpecError(problem, field="hardware.gpus_per_node")
        capacity = usable_memory(gpu, spec.calibration)
        share = spec.training.headroom
        if share is None:
            share = default_headroom(dims, spec.training.moe_capacity_factor)
        kept = 0 if gpu.is_cpu else int(capacity * share)
        hw = hardware(spec, gpu, precision)
        return cls(
            spec=spec,
            dims=dims,
            gpu=gpu,
            hw=hw,
            precision=precision,
            usable=capacity - kept,
            headroom_bytes=kept,
            cpu_usable=usable_bytes(
                int(spec.hardware.cpu_ram_gb * 1e9)
                if spec.hardware.cpu_ram_gb
                else 2 * gpu.memory_bytes * spec.hardware.gpus_per_node
            ),
            flash=not gpu.is_cpu,
            world=spec.hardware.world_size,
            gpn=spec.hardware.gpus_per_node,
            nccl=None if gpu.is_cpu else NcclFabric(hw.domain, _nvlink(spec, gpu)),
            nodes=spec.hardware.nodes,
            batch=spec.training.global_batch,
        )


def _nvlink(spec: Spec, gpu: GpuType) -> bool:
    """Whether the GPUs of a node talk over NVLink (the spec may say PCIe only)."""
    link = spec.hardware.intra_node_link or gpu.intra_link
    return link == IntraNodeLink.NVLINK


def usable_memory(gpu: GpuType, calibration: Calibration | None) -> int:
    """GPU memory a layout may use on ``gpu`` (bytes): the device's memory less the named reserves
    (CUDA context, fragmentation; all of it times the usable fraction for CPU
    ranks), less ``calibration``'s measured overhead where it was measured on this GPU. The
    planner judges every layout by it and the Plan carries it (``Plan.usable_bytes``), so the CLI
    and the wizard show the figure the planner used."""
    reserved = usable_bytes if gpu.is_cpu else gpu_usable_bytes
    return calibrated_usable(calibration, gpu, reserved(gpu.memory_bytes))


def resolve_precision(
    spec: Spec, gpu: GpuType, warnings: list[str], path: list[PathStep]
) -> Precision:
    """The precision to train in: the spec's, or the GPU's default; fp16 where bf16 was asked
    for on a GPU without it. Records the path's "Which precision?" step."""
    asked = spec.training.precision
    default = gpu.default_precision()
    _check_fp8_recipe(spec, gpu)
    if asked is None:
        why = (
            "CPU ranks train in fp32 (no fast 16-bit math over gloo)"
            if gpu.is_cpu
            else f"{gpu.name} has bf16"
            if gpu.has_bf16
            else f"{gpu.name} has no bf16: fp16 mixed precision with dynamic loss scaling"
        )
        path.append(PathStep(question="Which precision?", answer=default.value, reason=why))
        return default
    if asked == Precision.FP8 and not gpu.fp8_peak_tflops():
        with_fp8 = ", ".join(g.key for g in list_gpus() if g.fp8_peak_tflops())
        raise SpecError(
            f"{gpu.name} has no FP8 tensor cores; use --precision bf16, or a GPU with them "
            f"({with_fp8})",
            field="training.precision",
        )
    if asked == Precision.BF16 and not gpu.has_bf16 and not gpu.is_cpu:
        warnings.append(
            f"training.precision: {gpu.name} has no bf16; using fp16 with dynamic loss scaling "
            "(pass --precision fp16 to silence this)"
        )
        path.append(
            PathStep(
                question="Which precision?",
                answer="fp16",
                reason=f"bf16 was asked for but {gpu.name} has no bf16 units",
            )
        )
        return Precision.FP16
    recipe = spec.training.fp8_recipe
    reason = f"as given, {recipe.value} scaling" if recipe else "as given"
    path.append(PathStep(question="Which precision?", answer=asked.value, reason=reason))
    return asked


def _check_fp8_recipe(spec: Spec, gpu: GpuType) -> None:
    """An FP8 recipe needs FP8 training, and MXFP8 tensor cores that apply MX block scales."""
    recipe = spec.training.fp8_recipe
    if recipe is None:
        return
    if spec.training.precision != Precision.FP8:
        raise SpecError(
            f"--fp8-recipe {recipe.value} scales FP8 tensors; add --precision fp8, or drop "
            "--fp8-recipe",
            field="training.fp8_recipe",
        )
    if recipe == Fp8Recipe.MXFP8 and not gpu.mx_formats:
        with_mx = ", ".join(g.key for g in list_gpus() if g.mx_formats)
        raise SpecError(
            f"{gpu.name} has no MXFP8 tensor cores; use --fp8-recipe blockwise or tensorwise, "
            f"or a GPU with them ({with_mx})",
            field="training.fp8_recipe",
        )


BLOCK_SCALED_FP8_RATE = 0.92
"""Share of the FP8 peak a block-scaled recipe's GEMMs reach against a per-tensor one's (they
load and apply a scale per block of 32 values under MXFP8, of 128 under blockwise). Calibrated on TorchAO's B200 benchmark, Llama 3 8B under FSDP2 on one node, where mxfp8_cublas
trains at 9969 tokens/s against float8 tensorwise's 10417 on the same layout (4.5 % apart;
torchao/prototype/mx_formats/README.md, tests/data/published_runs.json): this model
reproduces that ratio at 0.92. Megatron-Bridge's same-layout pairs (25.09 blockwise against
per-tensor, 25.11 FP8-MX against FP8-CS) measure 2-7 % apart and are held out."""


def hardware(spec: Spec, gpu: GpuType, precision: Precision) -> Hardware:
    """The machines as the time model sees them: peak FLOP/s, link bandwidths, price."""
    net = get_network(spec.network.tier)
    cal = spec.calibration
    if cal is not None and cal.applies_to(gpu.key) and cal.network_applies(net.tier.value):
        net = apply_network(net, cal)
    inter = net.bytes_per_s
    if spec.network.bandwidth_gbps:
        inter = spec.network.bandwidth_gbps * 1e9 / 8 * net.efficiency
    elif gpu.nic_gbps_per_gpu:
        # A NIC per GPU (NVL72): the node's share of the fabric is its GPUs' NICs, whatever
        # the tier's per-node figure.
        nic = gpu.nic_gbps_per_gpu * spec.hardware.gpus_per_node
        inter = nic * 1e9 / 8 * net.efficiency
    intra = gpu.intra_gbps * 1e9
    if spec.hardware.intra_node_link == IntraNodeLink.PCIE:
        intra = min(intra, gpu.pcie_gbps * 1e9)
    price = spec.training.price_per_gpu_hour
    if price is None:
        price = gpu.price_per_hour or None
    return Hardware(
        peak_flops=(gpu.peak_tflops(precision) or gpu.fp32_tflops) * 1e12,
        achievable_mfu=gpu.achievable_mfu,
        intra_bytes_per_s=intra,
        inter_bytes_per_s=inter,
        pcie_bytes_per_s=gpu.pcie_gbps * 1e9,
        gpus_per_node=spec.hardware.gpus_per_node,
        nodes=spec.hardware.nodes,
        price_per_gpu_hour=price,
        gemm_efficiency=gpu.gemm_efficiency,
        hbm_bytes_per_s=(gpu.hbm_gbps or 2000.0) * 1e9,
        nvlink_domain=job_domain(gpu, spec.hardware.gpus_per_node, spec.hardware.world_size),
        attention_eager=gpu.flash_attention_vs_gemm,
        attention_fused=gpu.fused_attention_vs_gemm,
        softmax_head_dim=(
            gpu.peak_tflops(Precision.BF16) / (4 * gpu.exp_tops) if gpu.exp_tops else 0.0
        ),
        linear_peak_flops=(
            gpu.fp8_peak_tflops() * 1e12 * _fp8_rate(spec) if precision == Precision.FP8 else 0.0
        ),
    )


def _fp8_rate(spec: Spec) -> float:
    """The share of the FP8 peak the recipe's GEMMs reach: all of it per-tensor scaled,
    :data:`BLOCK_SCALED_FP8_RATE` block-scaled."""
    recipe = spec.training.fp8_recipe
    return BLOCK_SCALED_FP8_RATE if recipe and recipe.block_scaled else 1.0

"""The accelerator and network catalog: memory, dense peak, scale-up and scale-out bandwidth.

Figures are vendors' published datasheet numbers for *dense* math (no 2:4 sparsity); bandwidths are
one direction per GPU (scale-up) or per node (scale-out; per GPU where the system gives each GPU
its own NIC, as NVL72 does). An NVLink domain may span hosts (:attr:`GpuType.nvlink_domain`,
:func:`job_domain`); a node is always one host (:func:`host_gpus_problem`). Each entry cites its source. The planner
reads them through :func:`get_gpu` and :func:`get_network`; the wizard lists :func:`list_gpus`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from engine.plan.names import IntraNodeLink, NetworkTier, Precision

GIB = 1024**3
GB = 1000**3


class Vendor(StrEnum):
    """Who makes the accelerator; ``cpu`` is a CPU rank over gloo (smoke tests)."""

    NVIDIA = "nvidia"
    AMD = "amd"
    CPU = "cpu"


CPU_KEY: Final = "cpu"
"""Catalog key of the CPU rank (gloo), whose figures are nominal."""


@dataclass(frozen=True, slots=True)
class GpuType:
    """One accelerator type."""

    key: str
    """Lower-case catalog key (``--gpu``)."""
    name: str
    vendor: Vendor
    memory_bytes: int
    bf16_tflops: float
    """Dense bf16 tensor-core peak (0 when the GPU has no bf16)."""
    fp16_tflops: float
    """Dense fp16 tensor-core peak."""
    fp32_tflops: float
    """fp32 peak used for fp32 training (TF32 tensor cores where the GPU has them)."""
    has_bf16: bool
    intra_link: IntraNodeLink
    """The usual scale-up link inside a node of this GPU."""
    intra_gbps: float
    """Scale-up bandwidth per GPU, GB/s, one direction (NVLink/xGMI, or PCIe when that is the link)."""
    pcie_gbps: float
    """Host link per GPU, GB/s, one direction (bounds CPU offload and PCIe-only nodes)."""
    achievable_mfu: float
    """Fraction of dense peak a well-tuned LLM training step reaches (public MFU reports)."""
    price_per_hour: float
    """On-demand list price per GPU-hour, USD (approximate, for estimates only)."""
    source: str
    gemm_efficiency: float = 0.0
    """Fraction of the dense peak a large 16-bit GEMM reaches (cuBLAS / hipBLASLt at sizes of
    8192 and up, as published GEMM benchmarks show); the time model scales it down for small
    per-GPU shapes. 0: derived from ``achievable_mfu``."""
    hbm_gbps: float = 0.0
    """Memory bandwidth, GB/s (bounds element-wise work and the optimizer step)."""
    fp8_tflops: float = 0.0
    """Dense FP8 tensor-core peak (0 where the hardware has no FP8)."""
    nvlink_domain: int = 0
    """GPUs one NVLink / xGMI domain joins when it spans hosts (72 for an NVL72 rack: TP, EP and
    CP stay on NVLink across its trays); 0: the node."""
    host_gpus: int = 0
    """GPUs one host holds where the NVLink domain is larger than a host (an NVL72 compute tray:
    4): the most ``--gpus-per-node`` can be, since a node is what torchrun starts ranks on;
    0: not fixed by the system."""
    nic_gbps_per_gpu: float = 0.0
    """Scale-out bandwidth per GPU, Gbit/s one direction, where the system gives every GPU its
    own NIC (NVL72: a ConnectX per GPU): a node's network is this times its GPUs, whatever the
    network tier's per-node figure (a DGX node's eight NICs). 0: the tier's figure."""
    mx_formats: bool = False
    """Tensor cores that apply MX block scales in the matmul (OCP microscaling: an E8M0 scale per
    32 elements; NVIDIA Blackwell, SM100 and up), which MXFP8 training needs."""
    flash_attention_vs_gemm: float = 0.5
    """A causal FlashAttention-2 kernel's rate (forward and backward averaged, as PyTorch SDPA
    runs it under FSDP / DeepSpeed / torchtitan) relative to a large GEMM on this GPU. FA2 was
    written for Ampere (about half a large GEMM's rate there, Dao 2023); on Hopper it uses none
    of the new tensor-core instructions (see :data:`HOPPER_FA2`)."""
    fused_attention_vs_gemm: float = 0.0
    """The same for the attention kernel Megatron-Core runs through Transformer Engine (cuDNN
    fused attention, FlashAttention-3 class on Hopper, see :data:`HOPPER_FA3`); 0: as
    ``flash_attention_vs_gemm``."""
    exp_tops: float = 0.0
    """Special-function (exponential) rate, T ops/s: NVIDIA's SFUs, 16 a clock per SM, times the
    SMs and the boost clock. A fused attention kernel computes one exponential per score
    beside ``4 x head_dim`` matmul FLOPs, so heads narrower than the 128 its rate is stated at
    leave the tensor cores waiting on the SFUs (:func:`engine.plan.perf.head_dim_factor`).
    0: not modelled for this GPU."""

    @property
    def is_cpu(self) -> bool:
        """A CPU rank (gloo), not an accelerator: fp32, no offload, no Megatron, no FlashAttention."""
        return self.vendor == Vendor.CPU

    @property
    def dist_backend(self) -> str:
        """torch.distributed backend: gloo for cpu ranks, nccl otherwise (RCCL answers to nccl)."""
        return "gloo" if self.is_cpu else "nccl"

    def peak_tflops(self, precision: Precision) -> float:
        """Dense peak for ``precision`` in TFLOP/s."""
        if precision in (Precision.BF16, Precision.FP8):
            # FP8 training: the bf16 peak, which MFU is quoted against and the non-linear work
            # runs at; its linear GEMMs' FP8 peak is :meth:`fp8_peak_tflops`.
            return self.bf16_tflops if self.has_bf16 else self.fp16_tflops
        if precision == Precision.FP16:
            return self.fp16_tflops
        return self.fp32_tflops

    def fp8_peak_tflops(self) -> float:
        """Dense FP8 peak in TFLOP/s (0 where the hardware has none)."""
        return self.fp8_tflops

    def default_precision(self) -> Precision:
        """bf16 where the hardware has it, fp16 otherwise, fp32 on cpu."""
        if self.is_cpu:
            return Precision.FP32
        return Precision.BF16 if self.has_bf16 else Precision.FP16


HOPPER_FA2 = 0.38
"""FlashAttention-2 on H100/H200: "only 35% utilization" of the dense peak in the forward
(Shah et al. 2024, FlashAttention-3, arXiv:2407.08608, §1), the backward and causal masking
lower (~27 %): about 0.28 of peak forward and backward together, 0.38 of a large GEMM (0.74)."""
HOPPER_FA3 = 0.62
"""FlashAttention-3 class kernels (cuDNN fused attention in Transformer Engine) on H100/H200:
up to 75 % of peak forward (740 TFLOP/s bf16), the backward 1.5-1.75x FA2's (Shah et al. 2024):
about 0.46 of peak forward and backward together for a causal kernel, 0.62 of a large GEMM."""

# Each row's ``source`` cites its memory, dense peaks and scale-up link; every other figure names
# its own source on its line. The GEMM efficiencies (and the networks' efficiencies) are what the
# accuracy harness (benchmarks/estimate_accuracy.py) times its rows with: where a calibration-set
# row runs on the part, its line says so; elsewhere the figure was not chosen on any row.
#
# exp_tops: A100 108 SMs x 16 x 1.41 GHz = 2.44; H100 SXM 3.9 ("989 TFLOPS of FP16 matmul but
# only 3.9 TFLOPS of special functions", Shah et al. 2024, FlashAttention-3, section 3); H100 PCIe
# 114 x 16 x 1.755 GHz = 3.2; the 500 W SXM part at its lower clock (3.9 x 912 / 989); H200 and
# H800 the H100 SXM die; B200 / GB200 148 x 16 x 1.965 GHz = 4.65; Blackwell Ultra (B300 /
# GB300) twice that, NVIDIA's "2x attention-layer acceleration" being doubled SFU throughput.
_GPUS: tuple[GpuType, ...] = (
    GpuType(
        key="v100-32gb",
        name="NVIDIA V100 SXM2 32GB",
        vendor=Vendor.NVIDIA,
        source="NVIDIA V100 datasheet: 125 TFLOPS tensor fp16, 15.7 fp32, NVLink 300 GB/s (both ways)",
        memory_bytes=32 * GIB,
        bf16_tflops=0.0,
        fp16_tflops=125.0,
        fp32_tflops=15.7,
        has_bf16=False,
        intra_link=IntraNodeLink.NVLINK,
        intra_gbps=150.0,  # one direction: half the source's both-ways figure
        pcie_gbps=16.0,  # PCIe Gen3 x16, one direction
        achievable_mfu=0.40,  # estimate from public MFU reports
        price_per_hour=2.48,  # approximate on-demand list price
        # Large 16-bit GEMMs (cuBLAS / hipBLASLt at 8192 and up, published GEMM benchmarks); no
        # calibration row runs on this GPU.
        gemm_efficiency=0.78,
        hbm_gbps=900.0,  # the vendor's published memory bandwidth
    ),
    GpuType(
        key="a100-40gb",
        name="NVIDIA A100 SXM4 40GB",
        vendor=Vendor.NVIDIA,
        source="NVIDIA A100 datasheet: 312 TFLOPS bf16 dense, 156 TF32, NVLink 600 GB/s (both ways)",
        memory_bytes=40 * GIB,
        bf16_tflops=312.0,
        fp16_tflops=312.0,
        fp32_tflops=156.0,
        has_bf16=True,
        intra_link=IntraNodeLink.NVLINK,
        intra_gbps=300.0,  # one direction: half the source's both-ways figure
        pcie_gbps=32.0,  # PCIe Gen4 x16, one direction
        achievable_mfu=0.50,  # estimate from public MFU reports
        price_per_hour=1.29,  # approximate on-demand list price
        # Large 16-bit GEMMs (cuBLAS / hipBLASLt at 8192 and up, published GEMM benchmarks); no
        # calibration row runs on this GPU.
        gemm_efficiency=0.80,
        hbm_gbps=1555.0,  # the vendor's published memory bandwidth
        exp_tops=2.44,  # special-function rate: the note above the rows
    ),
    GpuType(
        key="a100-80gb",
        name="NVIDIA A100 SXM4 80GB",
        vendor=Vendor.NVIDIA,
        source="NVIDIA A100 datasheet: 312 TFLOPS bf16 dense, 156 TF32, NVLink 600 GB/s (both ways)",
        memory_bytes=80 * GIB,
        bf16_tflops=312.0,
        fp16_tflops=312.0,
        fp32_tflops=156.0,
        has_bf16=True,
        intra_link=IntraNodeLink.NVLINK,
        intra_gbps=300.0,  # one direction: half the source's both-ways figure
        pcie_gbps=32.0,  # PCIe Gen4 x16, one direction
        achievable_mfu=0.50,  # estimate from public MFU reports
        price_per_hour=1.79,  # approximate on-demand list price
        # Large 16-bit GEMMs (cuBLAS / hipBLASLt at 8192 and up, published GEMM benchmarks); the
        # calibration set's A100 rows (Narayanan 2021, Korthikanti 2022, torchtitan) are timed with
        # it.
        gemm_efficiency=0.80,
        hbm_gbps=2039.0,  # the vendor's published memory bandwidth
        exp_tops=2.44,  # special-function rate: the note above the rows
    ),
    GpuType(
        key="h100-sxm",
        name="NVIDIA H100 SXM5 80GB",
        vendor=Vendor.NVIDIA,
        source="NVIDIA H100 datasheet: 989 TFLOPS bf16 dense (1979 sparse), NVLink4 900 GB/s (both ways)",
        memory_bytes=80 * GIB,
        bf16_tflops=989.0,
        fp16_tflops=989.0,
        fp32_tflops=494.0,
        has_bf16=True,
        intra_link=IntraNodeLink.NVLINK,
        intra_gbps=450.0,  # one direction: half the source's both-ways figure
        pcie_gbps=64.0,  # PCIe Gen5 x16, one direction
        achievable_mfu=0.45,  # estimate from public MFU reports
        price_per_hour=2.99,  # approximate on-demand list price
        # Large 16-bit GEMMs (cuBLAS / hipBLASLt at 8192 and up, published GEMM benchmarks); the
        # calibration set's H100 rows (MoE Parallel Folding, Liu et al. 2025) are timed with it.
        gemm_efficiency=0.74,
        hbm_gbps=3350.0,  # the vendor's published memory bandwidth
        fp8_tflops=1979.0,  # the vendor's published dense FP8 peak
        flash_attention_vs_gemm=HOPPER_FA2,
        fused_attention_vs_gemm=HOPPER_FA3,
        exp_tops=3.9,  # special-function rate: the note above the rows
    ),
    GpuType(
        key="h100-pcie",
        name="NVIDIA H100 PCIe 80GB",
        vendor=Vendor.NVIDIA,
        source="NVIDIA H100 datasheet: 756 TFLOPS bf16 dense (PCIe), PCIe Gen5 128 GB/s (both ways)",
        memory_bytes=80 * GIB,
        bf16_tflops=756.0,
        fp16_tflops=756.0,
        fp32_tflops=378.0,
        has_bf16=True,
        intra_link=IntraNodeLink.PCIE,
        intra_gbps=64.0,  # PCIe Gen5 x16, one direction
        pcie_gbps=64.0,  # PCIe Gen5 x16, one direction
        achievable_mfu=0.42,  # estimate from public MFU reports
        price_per_hour=2.49,  # approximate on-demand list price
        # Large 16-bit GEMMs (cuBLAS / hipBLASLt at 8192 and up, published GEMM benchmarks); no
        # calibration row runs on this GPU.
        gemm_efficiency=0.68,
        hbm_gbps=2000.0,  # the vendor's published memory bandwidth
        fp8_tflops=1513.0,  # the vendor's published dense FP8 peak
        flash_attention_vs_gemm=HOPPER_FA2,
        fused_attention_vs_gemm=HOPPER_FA3,
        exp_tops=3.2,  # special-function rate: the note above the rows
    ),
    GpuType(
        key="h100-sxm-500w",
        name="NVIDIA H100 SXM 96GB HBM2e, 500 W",
        vendor=Vendor.NVIDIA,
        source="torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Meta Grand Teton): H100 SXM "
        "with 96GB HBM2e at 2.4 TB/s, default 500 W power limit, peak between SXM and NVL",
        memory_bytes=96 * GB,
        # Between the SXM part (989) and the NVL part (835 dense bf16): the torchtitan team's
        # own footnote ("the actual peak TFLOPs number is between SXM and NVL, and we don't know
        # its exact value"); the midpoint.
        bf16_tflops=912.0,
        fp16_tflops=912.0,
        fp32_tflops=456.0,
        has_bf16=True,
        intra_link=IntraNodeLink.NVLINK,
        intra_gbps=450.0,  # one direction: half the source's both-ways figure
        pcie_gbps=64.0,  # PCIe Gen5 x16, one direction
        achievable_mfu=0.45,  # estimate from public MFU reports
        price_per_hour=2.99,  # approximate on-demand list price
        # Large 16-bit GEMMs (cuBLAS / hipBLASLt at 8192 and up, published GEMM benchmarks); the
        # calibration set's torchtitan H100 rows are timed with it.
        gemm_efficiency=0.74,
        hbm_gbps=2400.0,  # the source
        fp8_tflops=1824.0,  # twice the bf16 peak, as on every H100
        flash_attention_vs_gemm=HOPPER_FA2,
        fused_attention_vs_gemm=HOPPER_FA3,
        exp_tops=3.6,  # special-function rate: the note above the rows
    ),
    GpuType(
        key="h200",
        name="NVIDIA H200 SXM 141GB",
        vendor=Vendor.NVIDIA,
        source="NVIDIA H200 datasheet: 141 GB HBM3e, 989 TFLOPS bf16 dense, NVLink 900 GB/s (both ways)",
        memory_bytes=141 * GB,
        bf16_tflops=989.0,
        fp16_tflops=989.0,
        fp32_tflops=494.0,
        has_bf16=True,
        intra_link=IntraNodeLink.NVLINK,
        intra_gbps=450.0,  # one direction: half the source's both-ways figure
        pcie_gbps=64.0,  # PCIe Gen5 x16, one direction
        achievable_mfu=0.45,  # estimate from public MFU reports
        price_per_hour=3.79,  # approximate on-demand list price
        # Large 16-bit GEMMs (cuBLAS / hipBLASLt at 8192 and up, published GEMM benchmarks); no
        # calibration row runs on this GPU.
        gemm_efficiency=0.76,
        hbm_gbps=4800.0,  # the vendor's published memory bandwidth
        fp8_tflops=1979.0,  # the vendor's published dense FP8 peak
        flash_attention_vs_gemm=HOPPER_FA2,
        fused_attention_vs_gemm=HOPPER_FA3,
        exp_tops=3.9,  # special-function rate: the note above the rows
    ),
    GpuType(
        key="b200",
        name="NVIDIA B200 180GB",
        vendor=Vendor.NVIDIA,
        source="NVIDIA HGX B200 datasheet: 180 GB per GPU, 2.25 PFLOPS bf16 dense, NVLink5 1.8 TB/s (both ways)",
        memory_bytes=180 * GB,
        bf16_tflops=2250.0,
        fp16_tflops=2250.0,
        fp32_tflops=1100.0,
        has_bf16=True,
        intra_link=IntraNodeLink.NVLINK,
        intra_gbps=900.0,  # one direction: half the source's both-ways figure
        pcie_gbps=64.0,  # PCIe Gen5 x16, one direction
        achievable_mfu=0.40,  # estimate from public MFU reports
        price_per_hour=4.99,  # approximate on-demand list price
        # Checked against the HGX B200 datasheet (8 GPUs: 72 PFLOPS FP8 and 36 PFLOPS bf16 with
        # sparsity, so 4.5 and 2.25 dense per GPU; 1.44 TB HBM3e at 64 TB/s: 180 GB, 8 TB/s each).
        # Large 16-bit GEMMs (cuBLAS / hipBLASLt at 8192 and up, published GEMM benchmarks); no
        # calibration row runs on this GPU.
        gemm_efficiency=0.7,
        hbm_gbps=8000.0,  # the vendor's published memory bandwidth
        fp8_tflops=4500.0,  # the vendor's published dense FP8 peak
        exp_tops=4.65,  # special-function rate: the note above the rows
        mx_formats=True,
    ),
    GpuType(
        key="mi300x",
        name="AMD Instinct MI300X 192GB",
        vendor=Vendor.AMD,
        source="AMD MI300X datasheet: 1307.4 TFLOPS bf16 dense, Infinity Fabric 896 GB/s aggregate (both ways)",
        memory_bytes=192 * GB,
        bf16_tflops=1307.4,
        fp16_tflops=1307.4,
        fp32_tflops=653.7,
        has_bf16=True,
        intra_link=IntraNodeLink.NVLINK,
        intra_gbps=448.0,  # one direction: half the source's both-ways figure
        pcie_gbps=64.0,  # PCIe Gen5 x16, one direction
        achievable_mfu=0.35,  # estimate from public MFU reports
        price_per_hour=2.50,  # approximate on-demand list price
        # Large 16-bit GEMMs (cuBLAS / hipBLASLt at 8192 and up, published GEMM benchmarks); no
        # calibration row runs on this GPU.
        gemm_efficiency=0.5,
        hbm_gbps=5300.0,  # the vendor's published memory bandwidth
        fp8_tflops=2614.9,  # the vendor's published dense FP8 peak
    ),
    GpuType(
        key="h800",
        name="NVIDIA H800 SXM5 80GB",
        vendor=Vendor.NVIDIA,
        source="NVIDIA H800: H100's compute with NVLink cut to 400 GB/s (both ways); DeepSeek-V3 "
        "report §3.1",
        memory_bytes=80 * GIB,
        bf16_tflops=989.0,
        fp16_tflops=989.0,
        fp32_tflops=494.0,
        has_bf16=True,
        intra_link=IntraNodeLink.NVLINK,
        intra_gbps=200.0,  # one direction: half the source's both-ways figure
        pcie_gbps=64.0,  # PCIe Gen5 x16, one direction
        achievable_mfu=0.45,  # estimate from public MFU reports
        price_per_hour=2.99,  # approximate on-demand list price
        # Large 16-bit GEMMs (cuBLAS / hipBLASLt at 8192 and up, published GEMM benchmarks); no
        # calibration row runs on this GPU.
        gemm_efficiency=0.74,
        hbm_gbps=3350.0,  # the vendor's published memory bandwidth
        fp8_tflops=1979.0,  # the vendor's published dense FP8 peak
        flash_attention_vs_gemm=HOPPER_FA2,
        fused_attention_vs_gemm=HOPPER_FA3,
        exp_tops=3.9,  # special-function rate: the note above the rows
    ),
    GpuType(
        key="gb200",
        name="NVIDIA GB200 NVL72 186GB",
        vendor=Vendor.NVIDIA,
        source="NVIDIA GB200 NVL72 datasheet: 180 PFLOPS bf16 dense over 72 GPUs, 13.4 TB HBM3e, "
        "NVLink5 1.8 TB/s per GPU (both ways) across the rack",
        memory_bytes=186 * GB,
        bf16_tflops=2500.0,
        fp16_tflops=2500.0,
        fp32_tflops=1250.0,
        has_bf16=True,
        intra_link=IntraNodeLink.NVLINK,
        intra_gbps=900.0,  # one direction: half the source's both-ways figure
        # The host link is NVLink-C2C to the Grace CPU: 900 GB/s both ways per superchip (one
        # Grace, two GPUs), so 450 one way shared by two: 225 per GPU.
        pcie_gbps=225.0,
        achievable_mfu=0.40,  # estimate from public MFU reports
        price_per_hour=6.50,  # approximate on-demand list price
        # Checked against the GB200 NVL72 datasheet (72 GPUs: 720 PFLOPS FP8 and 360 PFLOPS bf16
        # with sparsity, so 5.0 and 2.5 dense per GPU; 130 TB/s NVLink domain: 1.8 TB/s per GPU;
        # 576 TB/s HBM3e: 8 TB/s per GPU).
        # Large 16-bit GEMMs (cuBLAS / hipBLASLt at 8192 and up, published GEMM benchmarks); no
        # calibration row runs on this GPU.
        gemm_efficiency=0.70,
        hbm_gbps=8000.0,  # the vendor's published memory bandwidth
        fp8_tflops=5000.0,  # the vendor's published dense FP8 peak
        nvlink_domain=72,  # the rack: 18 compute trays on the NVLink switch trays
        host_gpus=4,  # a compute tray: two Grace CPUs, four Blackwell GPUs
        nic_gbps_per_gpu=400.0,  # a ConnectX-7 400 Gb/s per GPU (GB200 NVL72 datasheet)
        exp_tops=4.65,  # special-function rate: the note above the rows
        mx_formats=True,
    ),
    GpuType(
        key="b300",
        name="NVIDIA B300 (Blackwell Ultra) 288GB",
        vendor=Vendor.NVIDIA,
        source="NVIDIA HGX B300 datasheet: 288 GB HBM3e per GPU at 8 TB/s, 2.25 PFLOPS bf16 and 4.5 "
        "PFLOPS FP8 dense (as B200), NVLink5 1.8 TB/s (both ways), 800 Gb/s ConnectX-8 per GPU; "
        "no list price in the catalog (pass --price)",
        memory_bytes=288 * GB,
        bf16_tflops=2250.0,
        fp16_tflops=2250.0,
        fp32_tflops=1100.0,
        has_bf16=True,
        intra_link=IntraNodeLink.NVLINK,
        intra_gbps=900.0,  # one direction: half the source's both-ways figure
        pcie_gbps=128.0,  # PCIe Gen6 x16, one direction
        achievable_mfu=0.40,  # estimate from public MFU reports
        price_per_hour=0.0,  # no list price (pass --price)
        # HGX B300 NVL16 (8 packages): 72 PFLOPS FP8 and 36 PFLOPS bf16 with sparsity, the same as
        # HGX B200; its gains are FP4 and "2x attention performance" (twice the exponentials per
        # clock, which bound Blackwell's attention kernels): twice B200's 0.5 of a large GEMM.
        # Large 16-bit GEMMs (cuBLAS / hipBLASLt at 8192 and up, published GEMM benchmarks); no
        # calibration row runs on this GPU.
        gemm_efficiency=0.7,
        hbm_gbps=8000.0,  # the source
        fused_attention_vs_gemm=1.0,
        fp8_tflops=4500.0,  # the vendor's published dense FP8 peak
        exp_tops=9.3,  # special-function rate: the note above the rows
        mx_formats=True,
    ),
    GpuType(
        key="gb300",
        name="NVIDIA GB300 NVL72 288GB",
        vendor=Vendor.NVIDIA,
        source="NVIDIA GB300 NVL72 datasheet: 360 PFLOPS FP8 dense over 72 GPUs (5.0 each, bf16 2.5), "
        "288 GB HBM3e per GPU at 8 TB/s, NVLink5 1.8 TB/s per GPU (both ways) across the rack; "
        "no list price in the catalog (pass --price)",
        memory_bytes=288 * GB,
        bf16_tflops=2500.0,
        fp16_tflops=2500.0,
        fp32_tflops=1250.0,
        has_bf16=True,
        intra_link=IntraNodeLink.NVLINK,
        intra_gbps=900.0,  # one direction: half the source's both-ways figure
        # The host link is NVLink-C2C to the Grace CPU: 900 GB/s both ways per superchip (one
        # Grace, two GPUs), so 450 one way shared by two: 225 per GPU.
        pcie_gbps=225.0,
        achievable_mfu=0.40,  # estimate from public MFU reports
        price_per_hour=0.0,  # no list price (pass --price)
        # Blackwell Ultra's attention, as B300: twice B200's 0.5 of a large GEMM.
        # Large 16-bit GEMMs (cuBLAS / hipBLASLt at 8192 and up, published GEMM benchmarks); no
        # calibration row runs on this GPU.
        gemm_efficiency=0.70,
        hbm_gbps=8000.0,  # the source
        fused_attention_vs_gemm=1.0,
        fp8_tflops=5000.0,  # the vendor's published dense FP8 peak
        nvlink_domain=72,  # the rack: 18 compute trays on the NVLink switch trays
        host_gpus=4,  # a compute tray: two Grace CPUs, four Blackwell Ultra GPUs
        nic_gbps_per_gpu=800.0,  # a ConnectX-8 800 Gb/s per GPU (GB300 NVL72 datasheet)
        exp_tops=9.3,  # special-function rate: the note above the rows
        mx_formats=True,
    ),
    GpuType(
        key="mi325x",
        name="AMD Instinct MI325X 256GB",
        vendor=Vendor.AMD,
        source="AMD MI325X datasheet: 256 GB HBM3E at 6 TB/s, 1307.4 TFLOPS bf16 dense, 2614.9 fp8",
        memory_bytes=256 * GB,
        bf16_tflops=1307.4,
        fp16_tflops=1307.4,
        fp32_tflops=653.7,
        has_bf16=True,
        intra_link=IntraNodeLink.NVLINK,
        intra_gbps=448.0,  # one direction: as MI300X (Infinity Fabric 896 GB/s both ways)
        pcie_gbps=64.0,  # PCIe Gen5 x16, one direction
        achievable_mfu=0.35,  # estimate from public MFU reports
        price_per_hour=3.00,  # approximate on-demand list price
        # Large 16-bit GEMMs (cuBLAS / hipBLASLt at 8192 and up, published GEMM benchmarks); no
        # calibration row runs on this GPU.
        gemm_efficiency=0.50,
        hbm_gbps=6000.0,  # the source
        fp8_tflops=2614.9,  # the vendor's published dense FP8 peak
    ),
    GpuType(
        key="l40s",
        name="NVIDIA L40S 48GB",
        vendor=Vendor.NVIDIA,
        source="NVIDIA L40S datasheet: 362.05 TFLOPS bf16 dense (733 sparse), PCIe Gen4 x16 64 GB/s",
        memory_bytes=48 * GB,
        bf16_tflops=362.05,
        fp16_tflops=362.05,
        fp32_tflops=183.0,
        has_bf16=True,
        intra_link=IntraNodeLink.PCIE,
        intra_gbps=32.0,  # PCIe Gen4 x16, one direction
        pcie_gbps=32.0,  # PCIe Gen4 x16, one direction
        achievable_mfu=0.40,  # estimate from public MFU reports
        price_per_hour=1.00,  # approximate on-demand list price
        # Large 16-bit GEMMs (cuBLAS / hipBLASLt at 8192 and up, published GEMM benchmarks); no
        # calibration row runs on this GPU.
        gemm_efficiency=0.7,
        hbm_gbps=864.0,  # the vendor's published memory bandwidth
        fp8_tflops=733.0,  # the vendor's published dense FP8 peak
    ),
    GpuType(
        key="a10g",
        name="NVIDIA A10G 24GB",
        vendor=Vendor.NVIDIA,
        source="AWS G5 (A10G): NVIDIA publishes no A10G sheet; ~70 TFLOPS bf16 dense as commonly measured; "
        "price: g5.xlarge on-demand",
        memory_bytes=24 * GB,
        bf16_tflops=70.0,
        fp16_tflops=70.0,
        fp32_tflops=35.0,
        has_bf16=True,
        intra_link=IntraNodeLink.PCIE,
        intra_gbps=32.0,  # PCIe Gen4 x16, one direction
        pcie_gbps=32.0,  # PCIe Gen4 x16, one direction
        achievable_mfu=0.40,  # estimate from public MFU reports
        price_per_hour=1.01,  # g5.xlarge on-demand (the source)
        # Large 16-bit GEMMs (cuBLAS / hipBLASLt at 8192 and up, published GEMM benchmarks); no
        # calibration row runs on this GPU.
        gemm_efficiency=0.7,
        hbm_gbps=600.0,  # the vendor's published memory bandwidth
    ),
    GpuType(
        key="l4",
        name="NVIDIA L4 24GB",
        vendor=Vendor.NVIDIA,
        source="NVIDIA L4 datasheet: 121 TFLOPS bf16 dense (242 sparse), PCIe Gen4 x16 64 GB/s",
        memory_bytes=24 * GB,
        bf16_tflops=121.0,
        fp16_tflops=121.0,
        fp32_tflops=60.0,
        has_bf16=True,
        intra_link=IntraNodeLink.PCIE,
        intra_gbps=32.0,  # PCIe Gen4 x16, one direction
        pcie_gbps=32.0,  # PCIe Gen4 x16, one direction
        achievable_mfu=0.40,  # estimate from public MFU reports
        price_per_hour=0.80,  # approximate on-demand list price
        # Large 16-bit GEMMs (cuBLAS / hipBLASLt at 8192 and up, published GEMM benchmarks); no
        # calibration row runs on this GPU.
        gemm_efficiency=0.7,
        hbm_gbps=300.0,  # the vendor's published memory bandwidth
        fp8_tflops=242.0,  # the vendor's published dense FP8 peak
    ),
    GpuType(
        key=CPU_KEY,
        name="CPU rank (gloo)",
        vendor=Vendor.CPU,
        source="A local CPU process over gloo; 8 GiB and 0.5 TFLOPS per rank are nominal, for smoke tests",
        memory_bytes=8 * GIB,  # nominal
        bf16_tflops=0.0,
        fp16_tflops=0.0,
        fp32_tflops=0.5,  # nominal
        has_bf16=False,
        intra_link=IntraNodeLink.PCIE,
        intra_gbps=5.0,  # nominal
        pcie_gbps=5.0,  # nominal
        achievable_mfu=0.30,  # nominal
        price_per_hour=0.0,  # no price
        gemm_efficiency=0.5,  # nominal
        hbm_gbps=50.0,  # nominal
    ),
)

_BY_KEY = {g.key: g for g in _GPUS}

# Forgiving spellings people type: H100 means the SXM part, A100 the 80 GB one.
_ALIASES = {
    "h100": "h100-sxm",
    "h10080gb": "h100-sxm",
    "h100sxm5": "h100-sxm",
    "h100sxm80gb": "h100-sxm",
    "h100pcie80gb": "h100-pcie",
    "h10096gbhbm2e": "h100-sxm-500w",
    "h100500w": "h100-sxm-500w",
    "a100": "a100-80gb",
    "a10080gbsxm": "a100-80gb",
    "a100sxm480gb": "a100-80gb",
    "a100sxm440gb": "a100-40gb",
    "a10040gbsxm": "a100-40gb",
    "v100": "v100-32gb",
    "v10032gbsxm2": "v100-32gb",
    "h200141gb": "h200",
    "h200sxm": "h200",
    "b200180gb": "b200",
    "b200192gb": "b200",
    "h800sxm": "h800",
    "h80080gb": "h800",
    "gb200nvl72": "gb200",
    "b300288gb": "b300",
    "blackwellultra": "b300",
    "gb300nvl72": "gb300",
    "gb300288gb": "gb300",
    "mi325": "mi325x",
    "mi300": "mi300x",
    "l40s48gb": "l40s",
    "a10": "a10g",
    "a10g24gb": "a10g",
    "l424gb": "l4",
    "gloo": "cpu",
}


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def resolve_gpu_key(text: str) -> str:
    """Map what a person typed (``H100``, ``A100 80GB``, ``h100-sxm``) to a catalog key."""
    if text in _BY_KEY:
        return text
    squashed = _squash(text)
    for key in _BY_KEY:
        if _squash(key) == squashed:
            return key
    if squashed in _ALIASES:
        return _ALIASES[squashed]
    for g in _GPUS:  # the catalog's own name: "NVIDIA H100 SXM5 80GB", "H100 SXM5 80GB"
        name = _squash(g.name)
        if squashed in (name, name.removeprefix("nvidia"), name.removeprefix("amdinstinct")):
            return g.key
    for prefix in ("nvidia", "amd", "instinct", "tesla"):
        if squashed.startswith(prefix) and squashed[len(prefix) :]:
            return resolve_gpu_key(squashed[len(prefix) :])
    raise ValueError(
        f"unknown GPU {text!r}; choose one of {', '.join(_BY_KEY)} (`dtrain-tui gpus` lists them)"
    )


def get_gpu(key: str) -> GpuType:
    """The catalog entry for ``key`` (aliases accepted)."""
    return _BY_KEY[resolve_gpu_key(key)]


def host_gpus_problem(gpu: GpuType, gpus_per_node: int) -> str | None:
    """What is wrong with ``gpus_per_node`` on ``gpu``'s systems, in one line naming the fix, or
    None: a node is one host (torchrun starts its ranks there), and an NVL72 host is a 4-GPU
    tray; its 72-GPU NVLink domain spans trays and the planner already places TP, EP and CP
    inside it."""
    if not gpu.host_gpus or gpus_per_node <= gpu.host_gpus:
        return None
    trays = -(-gpus_per_node // gpu.host_gpus)
    return (
        f"a {gpu.name} host (compute tray) holds {gpu.host_gpus} GPUs, "
        f"not {gpus_per_node}; the {gpu.nvlink_domain}-GPU NVLink domain is the rack, which the "
        f"planner already knows (TP, EP and CP stay on NVLink across its trays): pass "
        f"--gpus-per-node {gpu.host_gpus} --nodes {trays} for {trays * gpu.host_gpus} GPUs"
    )


def job_domain(gpu: GpuType, gpus_per_node: int, world: int) -> int:
    """The GPUs of one NVLink domain a job of ``world`` GPUs is placed in: where the domain is
    larger than a node (NVL72), the job takes whole nodes of it in domains of equal size, the
    largest multiple of a node that divides the job and the domain holds (256 GPUs on 72-GPU
    racks: four of 64; 144: two of 72), or the whole job where it fits in one; else the node."""
    if gpu.nvlink_domain <= gpus_per_node:
        return gpus_per_node
    if world <= gpu.nvlink_domain:
        return world
    fits = [n for n in range(gpus_per_node, gpu.nvlink_domain + 1, gpus_per_node) if world % n == 0]
    return max(fits, default=gpus_per_node)


def list_gpus() -> list[GpuType]:
    """All catalog entries, in catalog order."""
    return list(_GPUS)


def short_aliases(key: str) -> tuple[str, ...]:
    """The short names ``--gpu`` also takes for ``key`` (``h100`` for ``h100-sxm``), for the
    catalog listing; any spelling of the part's name is taken too (:func:`resolve_gpu_key`)."""
    return tuple(a for a, k in _ALIASES.items() if k == key and len(a) <= 5)


@dataclass(frozen=True, slots=True)
class NetworkType:
    """One inter-node fabric tier, per node."""

    tier: NetworkTier
    name: str
    gbps_per_node: float
    """Nominal scale-out bandwidth per node, Gbit/s, one direction."""
    efficiency: float
    """Fraction of nominal bandwidth NCCL collectives reach (bus bandwidth / line rate)."""
    latency_us: float
    """Latency of one message across nodes, µs, as listed; the time model charges its own
    per-step latency (:data:`engine.plan.perf.RING_STEP_LATENCY_S`)."""
    nccl_net: str
    """What NCCL prints as ``Using network …``: IB, AWS Libfabric, Socket."""
    source: str
    pick: str = ""
    """When to pick it, in a few words (``dtrain-tui gpus``)."""

    @property
    def bytes_per_s(self) -> float:
        """Achievable bytes/s per node, one direction."""
        return self.gbps_per_node * 1e9 / 8 * self.efficiency


_NETWORKS: dict[NetworkTier, NetworkType] = {
    NetworkTier.IB: NetworkType(
        tier=NetworkTier.IB,
        pick="InfiniBand whose generation you do not know",
        name="InfiniBand (HDR assumed)",
        source="8 x HDR 200 Gb/s HCAs per node, as in DGX A100 (NVIDIA DGX A100 user guide)",
        gbps_per_node=1600.0,  # the source
        efficiency=0.85,  # NCCL bus bandwidth over line rate, estimated
        latency_us=2.0,  # estimated
        nccl_net="IB",
    ),
    NetworkTier.IB_HDR: NetworkType(
        tier=NetworkTier.IB_HDR,
        pick="A100 clusters: 8 x 200 Gb/s HDR per node",
        name="InfiniBand HDR",
        source="8 x HDR 200 Gb/s HCAs per node, as in DGX A100 (NVIDIA DGX A100 user guide)",
        gbps_per_node=1600.0,  # the source
        # efficiency: NCCL bus bandwidth over line rate, estimated; the calibration set's A100 rows
        # (Selene's 8 x HDR) use it.
        efficiency=0.85,
        latency_us=2.0,  # estimated
        nccl_net="IB",
    ),
    NetworkTier.IB_NDR: NetworkType(
        tier=NetworkTier.IB_NDR,
        pick="H100 / H200 / B200 clusters: 8 x 400 Gb/s NDR per node",
        name="InfiniBand NDR",
        source="8 x NDR 400 Gb/s ConnectX-7 per node, as in DGX H100 (NVIDIA DGX H100 datasheet)",
        gbps_per_node=3200.0,  # the source
        # efficiency: NCCL bus bandwidth over line rate, estimated; the calibration set's MoE
        # Parallel Folding rows use it.
        efficiency=0.85,
        latency_us=2.0,  # estimated
        nccl_net="IB",
    ),
    NetworkTier.EFA: NetworkType(
        tier=NetworkTier.EFA,
        pick="AWS p5 / p5e (3200 Gb/s); p4d: add --bandwidth-gbps 400",
        name="AWS EFA",
        source="p5.48xlarge: 3200 Gbps EFAv2 (AWS EC2 P5 page); p4d has 400 Gbps: pass --bandwidth-gbps 400",
        gbps_per_node=3200.0,  # the source
        efficiency=0.70,  # NCCL bus bandwidth over line rate, estimated
        latency_us=15.0,  # estimated
        nccl_net="AWS Libfabric",
    ),
    NetworkTier.ROCE: NetworkType(
        tier=NetworkTier.ROCE,
        pick="RDMA over Ethernet (8 x 200 Gb/s); other rates: --bandwidth-gbps",
        name="RoCE v2",
        source="8 x 200 Gb/s RoCE NICs per node (common H100/A100 Ethernet fabrics); override with --bandwidth-gbps",
        gbps_per_node=1600.0,  # the source
        # efficiency: NCCL bus bandwidth over line rate, estimated; the calibration set's torchtitan
        # rows (at 3200 Gb/s) use it.
        efficiency=0.75,
        latency_us=4.0,  # estimated
        nccl_net="IB",
    ),
    NetworkTier.TCP: NetworkType(
        tier=NetworkTier.TCP,
        pick="no RDMA fabric: plain Ethernet between the nodes",
        name="TCP (sockets)",
        source="Standard cloud Ethernet 25-100 Gbps (dtrain-tui's decision flowchart: 'Standard "
        "TCP networking ~25-100 Gbps')",
        gbps_per_node=100.0,  # the source
        efficiency=0.50,  # NCCL bus bandwidth over line rate, estimated
        latency_us=30.0,  # estimated
        nccl_net="Socket",
    ),
}


def get_network(tier: NetworkTier | str) -> NetworkType:
    """The catalog entry for a network tier."""
    return _NETWORKS[NetworkTier(tier)]

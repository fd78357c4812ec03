"""A time-model ``Hardware`` for unit tests of single terms: an H100 SXM node (989 TFLOP/s bf16,
450 GB/s NVLink a GPU, 8 GPUs) and 400 GB/s of network a node."""

from __future__ import annotations

from engine.plan.perf import Hardware


def h100_hardware(nodes: int) -> Hardware:
    return Hardware(
        peak_flops=989e12,
        achievable_mfu=0.45,
        intra_bytes_per_s=450e9,
        inter_bytes_per_s=400e9,
        pcie_bytes_per_s=64e9,
        gpus_per_node=8,
        nodes=nodes,
    )

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine.plan.catalog import (
    get_gpu,
    get_network,
    list_gpus,
    resolve_gpu_key,
    short_aliases,
)
from engine.plan.names import NetworkTier, Precision
from engine.plan.specs import HardwareSpec

REQUIRED = {
    "v100-32gb",
    "a100-40gb",
    "a100-80gb",
    "h100-sxm",
    "h100-pcie",
    "h200",
    "b200",
    "mi300x",
    "l40s",
    "a10g",
    "l4",
    "cpu",
}


def test_catalog_has_the_required_keys() -> None:
    assert REQUIRED <= {g.key for g in list_gpus()}


@pytest.mark.parametrize(
    "typed,key",
    [
        ("H100", "h100-sxm"),
        ("A100 80GB", "a100-80gb"),
        ("a100-40GB", "a100-40gb"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("V100", "v100-32gb"),
        ("MI300X", "mi300x"),
        ("cpu", "cpu"),
        ("H100 SXM5 80GB", "h100-sxm"),  # the catalog's name, as `dtrain-tui gpus` prints it
        ("NVIDIA H200 SXM 141GB", "h200"),
        ("MI325X 256GB", "mi325x"),
    ],
)
def test_aliases(typed: str, key: str) -> None:
    assert resolve_gpu_key(typed) == key
    assert HardwareSpec(gpu=typed).gpu == key


def test_unknown_gpu_names_the_field_and_choices() -> None:
    with pytest.raises(ValidationError) as e:
        HardwareSpec(gpu="tpu-v5")
    assert "gpu" in str(e.value) and "h100-sxm" in str(e.value)


def test_precision_facts() -> None:
    assert not get_gpu("v100-32gb").has_bf16
    assert get_gpu("v100-32gb").default_precision() == Precision.FP16
    assert get_gpu("cpu").default_precision() == Precision.FP32
    assert get_gpu("cpu").dist_backend == "gloo"
    assert get_gpu("h100-sxm").peak_tflops(Precision.BF16) == 989.0


def test_networks_ordered_by_speed() -> None:
    assert get_network(NetworkTier.IB_NDR).bytes_per_s > get_network(NetworkTier.IB_HDR).bytes_per_s
    assert get_network(NetworkTier.IB_HDR).bytes_per_s > get_network(NetworkTier.TCP).bytes_per_s


def test_new_accelerators_and_fp8_peaks() -> None:
    assert get_gpu("H800").intra_gbps < get_gpu("h100-sxm").intra_gbps  # NVLink cut to 400 GB/s
    gb200 = get_gpu("gb200")
    assert gb200.nvlink_domain == 72 and gb200.memory_bytes > get_gpu("b200").memory_bytes
    assert get_gpu("mi325x").memory_bytes == 256 * 1000**3
    for key in ("h100-sxm", "h200", "b200", "mi300x", "h800", "gb200", "mi325x"):
        g = get_gpu(key)
        assert g.fp8_peak_tflops() == pytest.approx(2 * g.bf16_tflops, rel=0.02), key
    assert get_gpu("a100-80gb").fp8_peak_tflops() == 0
    # Every accelerator states its GEMM efficiency and memory bandwidth for the time model.
    for g in list_gpus():
        assert 0.3 <= g.gemm_efficiency <= 0.9 and g.hbm_gbps > 0, g.key


def test_every_catalog_row_is_keyword_rows_with_a_source_per_figure() -> None:
    """A reader tells ``achievable_mfu`` from ``price_per_hour`` by name, not by counting commas,
    and every figure the row's ``source`` does not cite names its own source on its line or in a
    comment right above it."""
    import ast
    from pathlib import Path

    import engine.plan.catalog as catalog

    path = Path(catalog.__file__)
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    cited_by_source = {"memory_bytes", "bf16_tflops", "fp16_tflops", "fp32_tflops"}
    facts = {
        "key",
        "name",
        "vendor",
        "has_bf16",
        "intra_link",
        "source",
        "tier",
        "nccl_net",
        "pick",
    }
    shared = {
        "flash_attention_vs_gemm",
        "fused_attention_vs_gemm",
        "mx_formats",
        "nvlink_domain",
        "host_gpus",
        "nic_gbps_per_gpu",
    }
    rows = [
        node
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("GpuType", "NetworkType")
    ]
    assert len(rows) == len(list_gpus()) + len(NetworkTier)
    for row in rows:
        assert not row.args, f"catalog.py:{row.lineno}: positional figures; name each one"
        gpu_row = isinstance(row.func, ast.Name) and row.func.id == "GpuType"
        for kw in row.keywords:
            if kw.arg in facts | shared or (gpu_row and kw.arg in cited_by_source):
                continue
            line = lines[kw.lineno - 1]
            above = lines[kw.lineno - 2].strip()
            assert "#" in line or above.startswith("#"), (
                f"catalog.py:{kw.lineno}: {kw.arg} has no source; add one on its line"
            )


def test_every_listed_short_name_resolves_to_its_key() -> None:
    """The names `dtrain-tui gpus` shows under 'also' are taken by --gpu, each for its own key."""
    shown = {g.key: short_aliases(g.key) for g in list_gpus()}
    assert shown["h100-sxm"] == ("h100",) and shown["a100-80gb"] == ("a100",)
    for key, names in shown.items():
        assert all(resolve_gpu_key(n) == key for n in names), (key, names)


def test_every_network_says_when_to_pick_it() -> None:
    assert all(get_network(t).pick for t in NetworkTier)
    assert "NDR" in get_network(NetworkTier.IB_NDR).pick

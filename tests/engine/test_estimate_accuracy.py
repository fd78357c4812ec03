"""The accuracy harness (``benchmarks/estimate_accuracy.py``) against the published runs in
``tests/data/published_runs.json``: it scores the real model within a bound, it can fail (a
deliberately wrong model scores far worse), and every layout that really trained on an 80 GB GPU
in the Megatron papers is judged to fit."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from engine.plan import perf
from engine.plan.catalog import get_gpu
from engine.plan.memory import gpu_reserves, gpu_usable_bytes

ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "estimate_accuracy", ROOT / "benchmarks" / "estimate_accuracy.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["estimate_accuracy"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def harness() -> ModuleType:
    return _harness()


def _mape(h: ModuleType, prefixes: tuple[str, ...]) -> float:
    rows = [r for r in h.load_rows() if r.id.startswith(prefixes)]
    for r in rows:
        h.evaluate(r)
    return float(h.mape([r.error for r in rows if not math.isnan(r.error)]))


def test_the_model_is_within_its_recorded_accuracy(harness: ModuleType) -> None:
    # Korthikanti 2022 Table 5 (Megatron, A100, layouts and recompute as published).
    assert _mape(harness, ("korthikanti2022",)) < 0.15


def test_a_wrong_model_fails_the_harness(
    harness: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every GEMM twice as slow as the GPU really runs it: the harness must see it.
    monkeypatch.setattr(perf, "GEMM_HALF_DIM", 4096)
    assert _mape(harness, ("korthikanti2022",)) > 0.5


def test_spearman_and_ranks() -> None:
    h = _harness()
    assert h.ranks([3.0, 1.0, 2.0, 2.0]) == [4.0, 1.0, 2.5, 2.5]
    assert h.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert h.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)


def test_named_reserves_leave_most_of_an_80_gb_part() -> None:
    mem = get_gpu("a100-80gb").memory_bytes
    reserves = gpu_reserves(mem)
    assert set(reserves) == {"cuda_context", "nccl_buffers", "fragmentation"}
    usable = gpu_usable_bytes(mem)
    assert usable == mem - sum(reserves.values())
    assert 74 * GIB < usable < 77 * GIB


def test_published_megatron_layouts_on_80_gb_fit(harness: ModuleType) -> None:
    rows = [
        r
        for r in harness.load_rows()
        if r.id.startswith(("korthikanti2022_t5", "narayanan2021_t1", "llama3_405b"))
    ]
    for r in rows:
        harness.evaluate(r)
    judged = [r for r in rows if r.predicted is not None]
    assert len(judged) >= 15
    assert [r.id for r in judged if not r.predicted.fits] == []


def test_zero3_against_ptd_p_ranks_as_measured(harness: ModuleType) -> None:
    # Narayanan et al. 2021 Table 2: at every GPU count DeepSpeed ZeRO-3 trained GPT-3 175B and
    # 530B slower per GPU than Megatron's PTD-P; the fastest layout of each sweep is a PTD-P one.
    rows = [r for r in harness.load_rows() if r.id.startswith("narayanan2021_t2")]
    for r in rows:
        harness.evaluate(r)
    sweeps = harness.sweeps(rows)
    assert len(sweeps) == 2
    for sw in sweeps:
        rho, best_ok = sw.figures()
        assert rho >= 0.9, sw.key
        assert best_ok, sw.key


def test_no_published_run_is_timed_with_offload(harness: ModuleType) -> None:
    # A layout that does not fit the memory model must still be timed as it ran (no offload).
    rows = [r for r in harness.load_rows() if r.id.startswith("torchtitan_dec24_t1_8b")]
    for r in rows:
        harness.evaluate(r)
    assert rows and all(r.predicted is not None for r in rows)
    assert all(r.predicted.offload.value == "none" for r in rows)  # type: ignore[union-attr]

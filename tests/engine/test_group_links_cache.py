"""The collectives' cached group figures (:data:`engine.plan.perf._GROUP_LINKS`) give the seconds
the plain formula gives, for every group a search times, warm or cold, and a look-up never
answers for another hardware object."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.plan import perf
from engine.plan.perf import (
    COLLECTIVE_LAUNCH_S,
    NCCL_HALF_BANDWIDTH_BYTES,
    RING_STEP_LATENCY_INTRA_S,
    RING_STEP_LATENCY_S,
    Hardware,
    collective_time,
    group_bandwidth,
)
from tests.engine.test_search_pruning import SPECS, _ctx

GROUPS = [(r, s) for r in (1, 2, 4, 8, 16, 64, 256, 2048) for s in (1, 2, 4, 8, 16, 64)]


def _plain(hw: Hardware, nbytes: float, ranks: int, stride: int, steps: int) -> float:
    """collective_time as it read before the cache."""
    if ranks <= 1:
        return 0.0
    spans = ranks > 1 and hw.nodes > 1 and ranks * stride > hw.domain
    hop = RING_STEP_LATENCY_S if spans else RING_STEP_LATENCY_INTRA_S
    bandwidth = group_bandwidth(hw, ranks, stride) * nbytes / (nbytes + NCCL_HALF_BANDWIDTH_BYTES)
    return COLLECTIVE_LAUNCH_S + steps * hop + nbytes / bandwidth


@pytest.mark.parametrize("spec", SPECS, ids=[s[0] for s in SPECS])
def test_cached_collectives_equal_the_plain_formula(spec: tuple[str, int, int, int]) -> None:
    hw = _ctx(*spec).hw
    perf._GROUP_LINKS.clear()
    for nbytes in (1e3, 3.5e6, 2.2e9):
        for ranks, stride in GROUPS:
            want = _plain(hw, nbytes, ranks, stride, max(0, ranks - 1))
            cold = collective_time(hw, nbytes, ranks, stride, max(0, ranks - 1))
            warm = collective_time(hw, nbytes, ranks, stride, max(0, ranks - 1))
            assert cold == warm == want
    assert perf._GROUP_LINKS


def test_a_hit_is_for_the_same_hardware_only() -> None:
    hw = _ctx(*SPECS[2]).hw
    slow = replace(hw, inter_bytes_per_s=hw.inter_bytes_per_s / 10)
    perf._GROUP_LINKS.clear()
    fast_s = collective_time(hw, 1e9, 256, 8, 255)
    slow_s = collective_time(slow, 1e9, 256, 8, 255)
    assert slow_s > fast_s
    assert slow_s == _plain(slow, 1e9, 256, 8, 255)
    # A key whose id was reused by another object is recomputed, not answered.
    perf._GROUP_LINKS[(id(slow), 256, 8)] = (hw, 1.0, 0.0)
    assert collective_time(slow, 1e9, 256, 8, 255) == slow_s

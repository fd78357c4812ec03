"""The flowchart's own pick is always among the alternatives, however many faster ones there are."""

from __future__ import annotations

import pytest

from engine.plan import annotate
from engine.plan.planner import plan
from engine.plan.specs import Spec


def _spec() -> Spec:
    # 70B on 4 x 8 H100 over TCP: the flowchart says FSDP, a 3D layout is many times faster.
    return Spec.model_validate(
        {
            "model": {"preset": "llama-3-70b"},
            "hardware": {"gpu": "h100", "gpus_per_node": 8, "nodes": 4},
            "network": {"tier": "tcp"},
            "training": {"seq_len": 4096, "global_batch": 64},
        }
    )


@pytest.mark.parametrize("limit", [1, 2, annotate.MAX_ALTERNATIVES])
def test_the_flowcharts_pick_is_listed_even_when_the_list_is_cut(
    monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    monkeypatch.setattr(annotate, "MAX_ALTERNATIVES", limit)
    p = plan(_spec())
    assert p.recommended.strategy == "3d"
    assert len(p.alternatives) == limit
    flow = [a for a in p.alternatives if "the flowchart's choice" in (a.rejected_because or "")]
    assert len(flow) == 1 and flow[0].strategy == "fsdp-full"

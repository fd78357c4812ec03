"""A forced --virtual-stages follows Megatron-Core's rule with lighter end stages: 126 layers
over 16 stages cannot interleave evenly (126 % 32), but 8 x 15 + 6 with v=2 can."""

from __future__ import annotations

import pytest

from engine.errors import SpecError
from engine.plan.planner import plan
from engine.plan.specs import Spec


def _spec(v: int, pp: int = 16) -> Spec:
    return Spec.model_validate(
        {
            "model": {"preset": "llama-3.1-405b"},
            "hardware": {"gpu": "h100", "gpus_per_node": 8, "nodes": 1024},
            "network": {"tier": "ib-ndr"},
            "training": {"seq_len": 8192, "global_batch": 1024},
            "layout": {"tp": 8, "pp": pp, "virtual_stages": v},
        }
    )


def test_interleaving_with_a_lighter_end_stage_is_accepted_when_forced() -> None:
    r = plan(_spec(2)).recommended
    assert (r.pp, r.virtual_stages) == (16, 2)
    split = [r.first_stage_layers or None, r.last_stage_layers or None]
    assert any(split), "126 layers over 16 stages interleave only with a lighter end stage"


def test_a_virtual_stage_count_no_split_allows_is_one_line_naming_the_field() -> None:
    # (VP4 runs: 126 layers with the embedding and the loss are 8 units a stage, two a chunk;
    # no split gives three.)
    with pytest.raises(SpecError) as e:
        plan(_spec(3))
    assert e.value.field == "layout.virtual_stages" and "\n" not in str(e.value)


def test_a_forced_layout_is_named_as_a_person_writes_it() -> None:
    spec = Spec.model_validate(
        {
            "model": {"preset": "llama-3-8b"},
            "hardware": {"gpu": "h100", "gpus_per_node": 4, "nodes": 1},
            "training": {"seq_len": 2048, "global_batch": 8},
            "layout": {"tp": 2, "pp": 1},
        }
    )
    step = plan(spec).path[-1]
    assert step.reason.startswith("tp=2 pp=1: ") and "{" not in step.reason

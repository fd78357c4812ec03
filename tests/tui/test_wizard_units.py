"""The wizard's small pure helpers: number parsing, path completion, bars, flowchart outcome."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, ModelSpec, Spec, demo_spec
from tui.screens.step import field_of, parse_value
from tui.suggesters import complete_path
from tui.widgets.flowchart import outcome_level
from tui.widgets.memory_bars import _bar


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("1_024", "int", 1024),
        ("2e3", "int", 2000),
        ("1,000", "int", 1000),
        ("８", "int", 8),
        ("3.5", "float", 3.5),
        ("1e-4", "float", 1e-4),
        ("7B", "count", "7B"),
    ],
)
def test_parse_value_accepts(text: str, kind: str, value: object) -> None:
    assert parse_value(text, kind) == value


@pytest.mark.parametrize(
    ("text", "kind", "message"),
    [
        ("3.5", "int", "not a whole number"),
        ("八", "int", "not a whole number"),
        ("9" * 5000, "int", "not a whole number"),
        ("inf", "float", "finite"),
        ("nan", "float", "finite"),
        ("12 heads", "int", "not a whole number"),
    ],
)
def test_parse_value_refuses_with_a_message(text: str, kind: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_value(text, kind)


def test_field_of_reads_model_level_messages() -> None:
    assert field_of("model.kv_heads: 3 must divide model.heads (32)") == "kv_heads"
    assert field_of("no field here") == ""


def test_complete_path(tmp_path: Path) -> None:
    (tmp_path / "models" / "llama").mkdir(parents=True)
    (tmp_path / "models" / "config.json").write_text("{}")
    (tmp_path / ".hidden").mkdir()
    assert complete_path(f"{tmp_path}/mo") == f"{tmp_path}/models/"
    assert complete_path(f"{tmp_path}/models/con") == f"{tmp_path}/models/config.json"
    assert complete_path(f"{tmp_path}/models/ll") == f"{tmp_path}/models/llama/"
    assert complete_path(f"{tmp_path}/nothing-like-this") is None
    assert complete_path(f"{tmp_path}/") in (f"{tmp_path}/models/",)  # dot-files stay hidden
    assert complete_path("bad\0path") is None


def test_bar_resolution_and_limit_mark() -> None:
    assert _bar(0.5, 8, "").plain == "████░░░░"
    assert _bar(1 / 16, 8, "").plain == "▌░░░░░░░"
    assert _bar(2.0, 4, "").plain == "████"  # over the GPU: capped, never wider
    assert "│" in _bar(0.2, 10, "", limit=0.5).plain


def test_flowchart_outcome_follows_the_recommended_layout() -> None:
    assert outcome_level(plan(demo_spec())) == 1  # the tiny demo fits: DDP
    big = Spec(
        model=ModelSpec(preset="llama-3-70b"),
        hardware=HardwareSpec(gpu="a100-40gb", gpus_per_node=8, nodes=1),
    )
    assert outcome_level(plan(big)) >= 3  # 70B on one node of 40 GB GPUs must shard or split


def test_start_run_carries_the_profiles_ssh_user(tmp_path: Path) -> None:
    # The wizard's launch uses the profile's launch.ssh_user for hosts without user@.
    from engine.write import write_bundle
    from tui.services import start_run

    spec = demo_spec()
    spec = spec.model_copy(
        update={"launch": spec.launch.model_copy(update={"ssh_user": "trainer"})}
    )
    write_bundle(plan(spec), tmp_path / "b")
    backend, _ = start_run(spec, tmp_path / "b", tmp_path / "runs")
    assert backend.options.ssh_user == "trainer"


def test_session_refuses_forward_moves_past_an_invalid_step_and_ignores_stale_plans() -> None:
    from pathlib import Path

    from tui.session import Step, WizardSession

    session = WizardSession(demo_spec(), demo_spec, out_dir=Path("out"), run_root=None)
    assert [s.label for s in Step][:2] == ["Model", "Hardware"] and Step.LAUNCH.number == 7
    session.record(Step.HARDWARE, ["nodes: must be >= 1"])
    assert session.blocker(Step.NETWORK) == Step.HARDWARE
    assert session.blocker(Step.MODEL) is None  # back (or staying) is always allowed
    session.refuse_plan()
    assert session.errors(Step.DECISION) == ["fix the hardware step first: nodes: must be >= 1"]
    session.record(Step.HARDWARE, [])
    assert session.blocker(Step.CONFIGS) == Step.DECISION  # no plan yet
    spec, generation = session.begin_plan()
    assert not session.plan_failed("stale", generation - 1)  # an older spec's answer
    assert session.plan_computed(plan(spec), generation, 0.01)
    assert session.blocker(Step.CONFIGS) is None and "tok/s" in session.plan_summary()

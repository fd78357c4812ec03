"""SVG snapshots of every wizard step at 80×24 and 160×48. Repeatable: no clock in the header,
no planning time, no cursor blink, a relative output directory that never exists.

Update them after an intended change with ``make test-snapshot-update``."""

from __future__ import annotations

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from engine.plan.names import NetworkTier
from engine.plan.specs import HardwareSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
from tests.tui.wizard_support import settle
from tui.app import DtrainApp
from tui.session import Step

SIZES = [(80, 24), (160, 48)]


def snapshot_spec() -> Spec:
    return Spec(
        model=ModelSpec(preset="llama-3-8b"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=2),
        network=NetworkSpec(tier=NetworkTier.IB_NDR, socket_ifname="eth0"),
        training=TrainingSpec(seq_len=4096, global_batch=512, tokens=1e12),
    )


def _app() -> DtrainApp:
    from pathlib import Path

    return DtrainApp(
        snapshot_spec(),
        out_dir=Path("never-written-snapshot-bundle"),
        run_root=Path("never-written-snapshot-runs"),
        plan_delay_s=0.01,
        show_timings=False,
    )


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("step", [s.value for s in Step])
def test_step_snapshot(step: str, size: tuple[int, int], snap_compare) -> None:  # type: ignore[no-untyped-def]
    async def go(pilot: Pilot[int]) -> None:
        app = pilot.app
        assert isinstance(app, DtrainApp)
        await settle(pilot)
        assert await app.wizard.go(step)
        await settle(pilot)
        for inp in app.screen.query(Input):
            inp.cursor_blink = False
        pane = app.wizard.pane(step)
        assert pane is not None
        pane.scroll_home(animate=False)
        await pilot.pause()

    assert snap_compare(_app(), terminal_size=size, run_before=go)

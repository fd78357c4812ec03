"""The launch step with the Slurm backend, for real: choosing ``slurm`` shows the Slurm fields
(a bad time limit is refused on its row), Ctrl+L writes the bundle, submits ``slurm.sbatch`` to
the local two-node Slurm (:mod:`tests.e2e.slurm_cluster`) and the monitor watches the job to its
end."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from textual.widgets import Select

from engine.plan.specs import demo_spec
from tests.e2e.launch_util import free_port
from tests.e2e.slurm_cluster import SlurmCluster, slurm_cluster
from tests.tui.wizard_support import at_step, settle, until
from tui.app import DtrainApp
from tui.widgets.field_row import FieldRow

__all__ = ["slurm_cluster"]  # the fixture, used by name


@pytest.mark.slow
def test_wizard_launches_with_the_slurm_backend(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    asyncio.run(_launch(tmp_path))


async def _launch(tmp_path: Path) -> None:
    from tui.screens.monitor import MonitorScreen

    spec = demo_spec()
    spec = spec.model_copy(
        update={
            "training": spec.training.model_copy(update={"steps": 3}),
            "launch": spec.launch.model_copy(update={"master_port": free_port()}),
        }
    )
    app = DtrainApp(
        spec, out_dir=tmp_path / "bundle", run_root=tmp_path / "runs", plan_delay_s=0.05
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press(*["ctrl+n"] * 6)
        await settle(pilot)
        await at_step(pilot, "launch")
        rows = {r.field_name: r for r in app.screen.query(FieldRow)}
        assert not rows["slurm_partition"].display  # local: no Slurm fields
        app.screen.query_one("#f-backend", Select).value = "slurm"
        await until(pilot, lambda: rows["slurm_partition"].display, "the Slurm rows never showed")
        rows["slurm_time_limit"].value = "1h"
        await until(
            pilot,
            lambda: "not a Slurm time limit" in rows["slurm_time_limit"].error,
            lambda: f"time limit row says {rows['slurm_time_limit'].error!r}",
        )
        rows["slurm_time_limit"].value = "10"
        rows["slurm_partition"].value = "debug"
        await until(pilot, lambda: not rows["slurm_time_limit"].error, "the error stayed")
        await settle(pilot)
        assert app.session.spec.launch.backend == "slurm"
        assert app.session.spec.launch.slurm_partition == "debug"
        await pilot.press("ctrl+l")
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "no monitor screen", 60)
        sbatch = (tmp_path / "bundle" / "slurm.sbatch").read_text()
        assert "#SBATCH --partition=debug" in sbatch and "#SBATCH --time=10" in sbatch
        runs = list((tmp_path / "runs").iterdir())
        assert len(runs) == 1
        run_json = runs[0] / "run.json"

        def final() -> bool:
            if not run_json.exists():
                return False
            return json.loads(run_json.read_text()).get("state") in (
                "succeeded",
                "failed",
                "stopped",
            )

        await until(pilot, final, "the Slurm run never ended", 240)
        state = json.loads(run_json.read_text())
        assert state["state"] == "succeeded", state
        assert state["backend"] == "slurm" and state["hosts"][0] in ("n1", "n2")
        assert "step=3/3" in (runs[0] / "logs" / "rank1.stdout.log").read_text()
        assert json.loads((runs[0] / "slurm.json").read_text())["state"] == "COMPLETED"

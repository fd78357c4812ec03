"""Round trip: a profile saved from the wizard's profile dialog, reloaded headless through the CLI
(``--profile NAME``), gives the identical spec, the identical plan and a byte-identical bundle."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli import build_parser, main
from cli.spec_options import spec_from_args
from engine.plan.planner import plan
from engine.plan.specs import LayoutSpec, Spec
from engine.write import render_bundle
from profiles.store import ProfileStore
from tui.app import DtrainApp
from tui.screens.profiles import ProfilesScreen


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _headless_spec(name: str, cfg: Path) -> Spec:
    args = build_parser().parse_args(["plan", "--profile", name, "--config-dir", str(cfg)])
    return spec_from_args(args)


def _bundle_bytes(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _wizard_spec(store: ProfileStore) -> Spec:
    """A set-up as a person leaves it in the wizard: a preset, edited in every section."""
    spec = store.load("4-node-h100-ib").spec
    spec.model.preset = "llama-3-70b"
    spec.hardware.nodes = 2
    spec.network.ib_hca = "mlx5_0,mlx5_1"
    spec.training.global_batch = 128
    spec.training.steps = 5
    spec.training.lr = 3e-4
    spec.training.reference_batch = 256
    spec.layout = LayoutSpec(tp=8)
    spec.launch.hosts = ["trainer@10.0.0.1", "trainer@10.0.0.2:2222"]
    spec.launch.env = {"NCCL_IB_GID_INDEX": "3", "HF_HOME": "/scratch/hf"}
    spec.launch.script_args = ["--data", "/scratch/tokens", "--seed", "7"]
    spec.launch.nccl_debug_subsys = "INIT,NET"
    spec.launch.hang_timeout_s = 120.5
    return Spec.model_validate(spec.model_dump())


@pytest.mark.anyio
async def test_wizard_save_then_headless_reload_is_identical(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    store = ProfileStore(cfg)
    spec = _wizard_spec(store)
    app = DtrainApp(spec, config_dir=cfg, out_dir=tmp_path / "wizard")
    async with app.run_test(size=(130, 40)) as pilot:
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert isinstance(app.screen, ProfilesScreen)
        await pilot.press("a", *"team-70b", "enter")
        await pilot.pause()
        assert not isinstance(app.screen, ProfilesScreen)
        assert app.profile_name == "team-70b"
        assert app.spec == spec  # saving does not change what the wizard holds
        # the wizard plans in a worker, then writes its bundle (waits are bounded, not timed)
        for _ in range(200):
            if app.plan is not None and app.bundle:
                break
            await pilot.pause(0.05)
        assert app.plan is not None
        wizard_plan = app.plan
        app.action_write_bundle()
        for _ in range(200):
            if (tmp_path / "wizard" / "bundle.json").exists():
                break
            await pilot.pause(0.05)
        await app.workers.wait_for_complete()

    again = _headless_spec("team-70b", cfg)
    assert again == spec
    headless_plan = plan(again)
    assert headless_plan.model_dump_json() == wizard_plan.model_dump_json()
    assert wizard_plan.recommended.tp == 8

    # the bundle: the wizard wrote it from its plan; the CLI writes it from the profile
    code = main(
        ["write", "--profile", "team-70b", "--config-dir", str(cfg), "--out", str(tmp_path / "cli")]
    )
    assert code == 0
    wiz, cli = _bundle_bytes(tmp_path / "wizard"), _bundle_bytes(tmp_path / "cli")
    assert set(wiz) == set(cli) and "plan.json" in wiz
    for name in wiz:
        assert wiz[name] == cli[name], f"{name} differs"


@pytest.mark.parametrize("builtin", ["local-cpu-demo", "skypilot-2x8-h100", "mixtral-moe-2-nodes"])
def test_saved_copy_of_each_preset_renders_the_same_bundle(tmp_path: Path, builtin: str) -> None:
    store = ProfileStore(tmp_path / "config")
    spec = store.load(builtin).spec
    store.save_spec("copy", spec)
    again = _headless_spec("copy", store.config_dir)
    a, b = render_bundle(plan(spec)), render_bundle(plan(again))
    assert {k: (v.text, v.mode) for k, v in a.items()} == {
        k: (v.text, v.mode) for k, v in b.items()
    }

"""Issue 15, configs and launch, driven by Pilot: a write lists what it would replace or remove
and waits for a second ^s; a written file opens in $EDITOR and the edit is then protected; ^y
copies the launch command; a 3D plan's launch says "smoke test"; the SSH summary; the header
names the profile and unsaved changes; the footer shows ^l.

Each test fails on the code before issue 15 (the write deleted at once, there was no editor, no
copy, no smoke-test label, the header showed the step names and the footer hid ^l)."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest
from textual.widgets import Button, OptionList, Select

from engine.plan.names import Strategy
from engine.plan.specs import LayoutSpec, Spec, demo_spec
from profiles.store import ProfileStore
from tests.tui.wizard_support import at_step, settle, text_of, until
from tui.app import DtrainApp
from tui.screens.configs import launch_command


def spec_3d() -> Spec:
    """The demo model on 2 CPU ranks, forced to a 3D (Megatron-LM) layout: tp 1 x pp 1 x dp 2."""
    return demo_spec().model_copy(update={"layout": LayoutSpec(strategy=Strategy.THREE_D)})


def editor_script(tmp_path: Path) -> Path:
    """An $EDITOR that appends a line to the file it is given and exits."""
    script = tmp_path / "editor.sh"
    script.write_text('#!/bin/sh\necho "# edited by hand" >> "$1"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


async def to_configs(pilot) -> None:  # type: ignore[no-untyped-def]
    app = pilot.app
    await settle(pilot)
    assert await app.wizard.go("configs")
    await at_step(pilot, "configs")
    await settle(pilot)


def labels(app: DtrainApp) -> list[str]:
    ol = app.screen.query_one("#file-list", OptionList)
    return [str(ol.get_option_at_index(i).prompt) for i in range(ol.option_count)]


async def highlight(pilot, name: str) -> None:  # type: ignore[no-untyped-def]
    ol = pilot.app.screen.query_one("#file-list", OptionList)
    ol.highlighted = next(i for i in range(ol.option_count) if ol.get_option_at_index(i).id == name)
    await pilot.pause()


def test_write_lists_removals_and_changes_and_waits_for_a_second_ctrl_s(tmp_path: Path) -> None:
    asyncio.run(_removals(tmp_path))


async def _removals(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    app = DtrainApp(spec_3d(), out_dir=out, plan_delay_s=0.01)
    async with app.run_test(size=(140, 44)) as pilot:
        await to_configs(pilot)
        assert "pretrain_gpt.sh" in app.bundle and "megatron_args.txt" in app.bundle
        await pilot.press("ctrl+s")  # a fresh directory: only new files, written at once
        await settle(pilot)
        assert text_of(app, "#write-result").startswith("✓ wrote")
        assert (out / "megatron_args.txt").is_file()
        # The plan changes to DDP: the Megatron files are no longer part of the bundle.
        app.load_spec(demo_spec())
        await settle(pilot)
        assert "megatron_args.txt" not in app.bundle
        assert "- megatron_args.txt" in labels(app) and "- pretrain_gpt.sh" in labels(app)
        await highlight(pilot, "megatron_args.txt")
        assert "the next write removes it" in text_of(app, "#preview-body")
        await pilot.press("ctrl+s")
        await settle(pilot)
        result = text_of(app, "#write-result")
        assert result.startswith("⚠ Writing to"), result
        assert "remove megatron_args.txt, pretrain_gpt.sh" in result
        assert "replace " in result and "plan.json" in result
        assert "press ^s again" in result
        assert (out / "megatron_args.txt").is_file(), "removed before the user confirmed"
        await pilot.press("ctrl+s")
        await settle(pilot)
        result = text_of(app, "#write-result")
        assert result.startswith("✓ wrote") and "removed megatron_args.txt" in result
        assert not (out / "megatron_args.txt").exists()
        assert not (out / "pretrain_gpt.sh").exists()


def test_a_confirmation_is_for_the_plan_it_listed(tmp_path: Path) -> None:
    asyncio.run(_stale_confirm(tmp_path))


async def _stale_confirm(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    app = DtrainApp(spec_3d(), out_dir=out, plan_delay_s=0.01)
    async with app.run_test(size=(140, 44)) as pilot:
        await to_configs(pilot)
        await pilot.press("ctrl+s")
        await settle(pilot)
        app.load_spec(demo_spec())
        await settle(pilot)
        await pilot.press("ctrl+s")  # lists the removals
        await settle(pilot)
        assert "press ^s again" in text_of(app, "#write-result")
        app.replan()  # a new plan generation: the list shown is no longer what would happen
        await settle(pilot)
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert "press ^s again" in text_of(app, "#write-result")
        assert (out / "megatron_args.txt").is_file()


def test_edit_in_editor_is_kept_and_protected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VISUAL", raising=False)
    monkeypatch.setenv("EDITOR", str(editor_script(tmp_path)))
    asyncio.run(_edit(tmp_path))


async def _edit(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    app = DtrainApp(spec_3d(), out_dir=out, plan_delay_s=0.01)
    async with app.run_test(size=(140, 44)) as pilot:
        await to_configs(pilot)
        await highlight(pilot, "megatron_args.txt")
        await pilot.press("ctrl+e")  # not written yet: says so, runs nothing
        assert "not written yet" in text_of(app, "#write-result")
        await pilot.press("ctrl+s")
        await settle(pilot)
        await highlight(pilot, "megatron_args.txt")
        assert app.focused is app.screen.query_one("#file-list")
        await pilot.press("ctrl+e")
        await settle(pilot)
        edited = (out / "megatron_args.txt").read_text()
        assert edited.endswith("# edited by hand\n")
        assert text_of(app, "#write-result").startswith("✓ edited")
        assert "! megatron_args.txt" in labels(app)
        # Write again: the edit is listed first, then backed up, never lost.
        await pilot.press("ctrl+s")
        await settle(pilot)
        result = text_of(app, "#write-result")
        assert result.startswith("✗") and "back up megatron_args.txt" in result
        assert (out / "megatron_args.txt").read_text() == edited
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert "backed up 1 edited file" in text_of(app, "#write-result")
    backups = list(out.glob("megatron_args.txt.bak-*"))
    assert len(backups) == 1 and backups[0].read_text() == edited


def test_copy_the_launch_command(tmp_path: Path) -> None:
    asyncio.run(_copy(tmp_path))


async def _copy(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    app = DtrainApp(spec_3d(), out_dir=out, plan_delay_s=0.01)
    async with app.run_test(size=(140, 44)) as pilot:
        await to_configs(pilot)
        await highlight(pilot, "launch_node0.sh")
        await pilot.press("ctrl+y")
        assert app.clipboard == f"cd {out} && ./launch_node0.sh"
        assert any(n.message == app.clipboard for n in app._notifications)
        await highlight(pilot, "pretrain_gpt.sh")
        await pilot.click("#copy")
        assert "./pretrain_gpt.sh" in app.clipboard and "MEGATRON_LM=" in app.clipboard
        await highlight(pilot, "plan.json")
        await pilot.press("ctrl+y")
        assert app.clipboard == f"dtrain-tui launch {out}"
        # The palette has it too, by name.
        app._clipboard = ""
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        await pilot.press(*"copy the launch command")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await until(pilot, lambda: app.clipboard == f"dtrain-tui launch {out}", "palette copy")
    assert launch_command(Path("/b"), "sky.yaml", "r1") == "cd /b && sky launch -c r1 sky.yaml"


def test_3d_and_moe_launches_are_labelled_smoke_tests(tmp_path: Path) -> None:
    asyncio.run(_smoke(tmp_path))


async def _smoke(tmp_path: Path) -> None:
    def summary() -> str:
        return text_of(app, "#launch-summary")

    def start_label() -> str:
        return str(app.screen.query_one("#start", Button).label)

    app = DtrainApp(spec_3d(), out_dir=tmp_path / "b", plan_delay_s=0.01)
    async with app.run_test(size=(140, 44)) as pilot:
        await settle(pilot)
        assert await app.wizard.go("launch")
        await at_step(pilot, "launch")
        await settle(pilot)
        assert "SMOKE TEST" in summary() and "pretrain_gpt.sh" in summary()
        assert start_label().startswith("Start smoke test")
        # The example trainer has no experts: a MoE plan launched with it trains a dense model.
        demo = demo_spec()
        moe = demo.model.model_copy(update={"num_experts": 4, "experts_per_token": 2})
        app.load_spec(demo.model_copy(update={"model": moe}))
        await settle(pilot)
        await until(pilot, lambda: "no experts" in summary(), summary)
        assert "--script" in summary() and start_label().startswith("Start smoke test")
        # A dense profile loaded after it: a real run (the Model step keeps no expert count).
        app.load_spec(demo)
        await settle(pilot)
        await until(pilot, lambda: "SMOKE" not in summary(), summary)
        assert start_label().startswith("Start run")
        assert app.session.spec.model.num_experts is None


def test_ssh_summary_does_not_say_this_machine(tmp_path: Path) -> None:
    asyncio.run(_ssh(tmp_path))


async def _ssh(tmp_path: Path) -> None:
    app = DtrainApp(demo_spec(), out_dir=tmp_path / "b", plan_delay_s=0.01)
    async with app.run_test(size=(140, 44)) as pilot:
        await settle(pilot)
        assert await app.wizard.go("launch")
        await at_step(pilot, "launch")
        assert "this machine" in text_of(app, "#launch-summary")
        app.screen.query_one("#f-backend", Select).value = "ssh"
        await settle(pilot)
        summary = text_of(app, "#launch-summary")
        assert "this machine" not in summary and "SSH hosts" in summary, summary
        app.screen.query_one("#f-hosts").value = "gpu-a"  # type: ignore[attr-defined]
        await settle(pilot)
        summary = text_of(app, "#launch-summary")
        assert "over SSH: gpu-a" in summary and "this machine" not in summary, summary


def test_header_names_the_profile_and_unsaved_changes(tmp_path: Path) -> None:
    asyncio.run(_header(tmp_path))


async def _header(tmp_path: Path) -> None:
    config = tmp_path / "profiles"
    app = DtrainApp(None, config_dir=config, out_dir=tmp_path / "b", plan_delay_s=0.01)
    async with app.run_test(size=(140, 44)) as pilot:
        await settle(pilot)
        await until(
            pilot,
            lambda: app.wizard.sub_title == "local CPU demo — Ctrl+L twice runs it",
            lambda: f"header: {app.wizard.sub_title!r}",
        )
        # The footer shows ^l (Launch) on every step.
        shown = [(k.key, k.description) for k in app.screen.query("FooterKey")]
        assert ("ctrl+l", "Launch") in shown, shown
        # An edit: the header says the spec is not saved.
        await pilot.press("ctrl+a", "ctrl+k", "6")  # the first field (layers): 6
        await settle(pilot)
        assert "unsaved changes" in app.wizard.sub_title
        # Save it as a profile, rename it, close: the header and the save dialog follow.
        store = ProfileStore(config)
        store.save_spec("mine", app.spec)
        app._profile_chosen(store.load("mine"))
        await until(
            pilot,
            lambda: app.wizard is not None and app.wizard.sub_title == "profile mine",
            "the header never named profile mine",
        )
        await pilot.press("ctrl+o")
        await until(pilot, lambda: type(app.screen).__name__ == "ProfilesScreen", "no dialog")
        table = app.screen.query_one("DataTable")
        table.move_cursor(row=table.get_row_index("mine"))  # type: ignore[attr-defined]
        await pilot.press("r", "ctrl+a", "ctrl+k", *"ours", "enter")
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is app.wizard, "the dialog did not close")
        assert app.profile_name == "ours" and app.wizard.sub_title == "profile ours"
        await pilot.press("ctrl+o")
        await until(pilot, lambda: type(app.screen).__name__ == "ProfilesScreen", "no dialog")
        await pilot.press("a")
        await until(
            pilot,
            lambda: app.screen.query_one("#profiles-prompt").value == "ours",  # type: ignore[attr-defined]
            "the save prompt never offered the profile's name",
        )


def test_launch_lists_what_it_would_remove_first(tmp_path: Path) -> None:
    asyncio.run(_launch_confirm(tmp_path))


async def _launch_confirm(tmp_path: Path) -> None:
    from tests.tui.test_wizard_canned_launch import CannedBackend

    calls: list[Path] = []

    def factory(spec: Spec, bundle_dir: Path, run_root: Path | None) -> tuple[CannedBackend, Path]:
        calls.append(bundle_dir)
        return CannedBackend(), tmp_path / "runs" / "canned"

    out = tmp_path / "bundle"
    app = DtrainApp(spec_3d(), out_dir=out, plan_delay_s=0.01, backend_factory=factory)
    async with app.run_test(size=(140, 44)) as pilot:
        await to_configs(pilot)
        await pilot.press("ctrl+s")
        await settle(pilot)
        app.load_spec(demo_spec())
        await settle(pilot)
        assert await app.wizard.go("launch")
        await at_step(pilot, "launch")
        await settle(pilot)
        await pilot.press("ctrl+l")
        await settle(pilot)
        result = text_of(app, "#launch-result")
        assert "remove megatron_args.txt" in result and "press ^l again" in result, result
        assert not calls and (out / "megatron_args.txt").is_file()
        await pilot.press("ctrl+l")
        await until(pilot, lambda: bool(calls), "the second ^l did not launch")
        assert not (out / "megatron_args.txt").exists()


def test_ctrl_l_from_the_first_screen_shows_launch_then_runs(tmp_path: Path) -> None:
    asyncio.run(_first_ctrl_l(tmp_path))


async def _first_ctrl_l(tmp_path: Path) -> None:
    from tests.tui.test_wizard_canned_launch import CannedBackend

    calls: list[Path] = []

    def factory(spec: Spec, bundle_dir: Path, run_root: Path | None) -> tuple[CannedBackend, Path]:
        calls.append(bundle_dir)
        return CannedBackend(), tmp_path / "runs" / "canned"

    app = DtrainApp(
        None,
        config_dir=tmp_path / "profiles",
        out_dir=tmp_path / "b",
        plan_delay_s=0.01,
        backend_factory=factory,
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert app.wizard is not None and "Ctrl+L twice runs it" in str(app.wizard.sub_title)
        await pilot.press("ctrl+l")
        await at_step(pilot, "launch")
        await until(
            pilot,
            lambda: "Ctrl+L again starts the run" in text_of(app, "#launch-result"),
            "no hint on the launch step",
        )
        assert not calls
        await pilot.press("ctrl+l")
        await until(pilot, lambda: bool(calls), "the second Ctrl+L did not start the run")

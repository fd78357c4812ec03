"""``preview_write``: what a write would create, replace, back up and remove, without touching
the directory; and it agrees with what ``write_bundle`` then does."""

from __future__ import annotations

from pathlib import Path

from engine.plan.names import Strategy
from engine.write import render_bundle, write_bundle
from engine.write.bundle import preview_write
from tests.engine.writers_fixtures import make_plan


def _texts(plan) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {n: f.text for n, f in render_bundle(plan).items()}


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_preview_lists_removals_changes_and_edits_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "b"
    three_d = make_plan(strategy=Strategy.THREE_D)
    fresh = preview_write(_texts(three_d), out)
    assert not fresh.touches_existing and "megatron_args.txt" in fresh.new and not out.exists()
    write_bundle(three_d, out)
    same = preview_write(_texts(three_d), out)
    assert not same.touches_existing and not same.new and "plan.json" in same.unchanged

    (out / "nccl.env").write_text((out / "nccl.env").read_text() + "# mine\n")
    (out / "notes.txt").write_text("not ours\n")
    ddp = make_plan(strategy=Strategy.DDP, micro_batch=1, grad_accum=2)
    before = _snapshot(out)
    prev = preview_write(_texts(ddp), out)
    assert _snapshot(out) == before  # nothing written, renamed or removed
    assert prev.touches_existing
    assert set(prev.removed) == {"megatron_args.txt", "pretrain_gpt.sh"}
    assert prev.conflicts == {"nccl.env": "edited since dtrain-tui wrote it"}
    assert "plan.json" in prev.changed and "notes.txt" not in str(prev.lines())
    text = "\n".join(prev.lines())
    assert "remove megatron_args.txt, pretrain_gpt.sh" in text and "back up nccl.env" in text

    report = write_bundle(ddp, out, force=True)
    assert sorted(report.removed) == sorted(prev.removed)
    assert list(report.backed_up) == list(prev.conflicts)
    assert set(prev.changed) <= set(report.written)


def test_preview_keeps_an_edited_stale_file(tmp_path: Path) -> None:
    out = tmp_path / "b"
    write_bundle(make_plan(strategy=Strategy.THREE_D), out)
    (out / "megatron_args.txt").write_text("--my-flag\n")
    prev = preview_write(_texts(make_plan()), out)
    assert prev.kept == ["megatron_args.txt"] and "pretrain_gpt.sh" in prev.removed
    assert any(line.startswith("keep megatron_args.txt") for line in prev.lines())

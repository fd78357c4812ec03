"""Golden files pin every writer's output for a handful of plans. Update them after an
intended change with ``make golden-update`` (``DTRAIN_UPDATE_GOLDEN=1``) and review the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.write import example_trainer_text, manifest_for, render_bundle
from engine.write.bundle import manifest_text
from tests.engine.writers_fixtures import golden_plans

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("DTRAIN_UPDATE_GOLDEN") == "1"
# The example trainer is the launch engineer's file, pinned by its own tests: checked by
# content equality below, not by a golden copy.
SKIP = {"train.py"}


@pytest.mark.parametrize("name", sorted(golden_plans()))
def test_golden_bundle(name: str) -> None:
    plan = golden_plans()[name]
    files = render_bundle(plan)
    texts = {n: f.text for n, f in files.items() if n not in SKIP}
    texts["bundle.json"] = manifest_text(manifest_for(plan, files)).replace(
        files["train.py"].sha256 if "train.py" in files else "\0", "<sha256 of train.py>"
    )
    if "train.py" in files:
        assert files["train.py"].text == example_trainer_text()
    d = GOLDEN / name
    if UPDATE:
        d.mkdir(parents=True, exist_ok=True)
        for old in d.iterdir():
            if old.name not in texts:
                old.unlink()
        for n, text in texts.items():
            (d / n).write_text(text, encoding="utf-8")
        return
    assert d.is_dir(), f"no golden files for {name}: run `make golden-update`"
    on_disk = {p.name for p in d.iterdir()}
    assert on_disk == set(texts), f"{name}: file set changed: {sorted(on_disk ^ set(texts))}"
    for n, text in texts.items():
        want = (d / n).read_text(encoding="utf-8")
        assert text == want, f"{name}/{n} differs from golden; `make golden-update` if intended"


def test_golden_output_is_deterministic() -> None:
    """Two renders of the same plan are byte-identical (no timestamps, no dict-order drift)."""
    for plan in golden_plans().values():
        a = {n: f.text for n, f in render_bundle(plan).items()}
        b = {n: f.text for n, f in render_bundle(plan).items()}
        assert a == b

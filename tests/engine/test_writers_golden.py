"""Golden files pin every writer's output for a handful of plans. Update them after an
intended change with ``make golden-update`` (``DTRAIN_UPDATE_GOLDEN=1``) and review the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.write import example_trainer_text, manifest_for, render_bundle
from engine.write.bundle import agent_text, manifest_text, preflight_text
from tests.engine.writers_fixtures import golden_plans

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("DTRAIN_UPDATE_GOLDEN") == "1"
# The example trainer, the preflight and the rank agent are shipped scripts (engine/trainer/),
# pinned by their own tests: checked by content equality below, not by golden copies.
SHIPPED = {
    "train.py": example_trainer_text,
    "preflight.py": preflight_text,
    "dtrain_agent.py": agent_text,
}


@pytest.mark.parametrize("name", sorted(golden_plans()))
def test_golden_bundle(name: str) -> None:
    plan = golden_plans()[name]
    files = render_bundle(plan)
    texts = {n: f.text for n, f in files.items() if n not in SHIPPED}
    manifest = manifest_text(manifest_for(plan, files))
    for n, text_of in SHIPPED.items():
        if n in files:
            assert files[n].text == text_of()
            manifest = manifest.replace(files[n].sha256, f"<sha256 of {n}>")
    texts["bundle.json"] = manifest
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

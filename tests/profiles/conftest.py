"""Fixtures for the profile tests: every test gets its own config dir (never the user's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiles.store import ProfileStore


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cfg = tmp_path / "env-config"
    monkeypatch.setenv("DTRAIN_CONFIG_DIR", str(cfg))
    return cfg


@pytest.fixture
def store(tmp_path: Path) -> ProfileStore:
    return ProfileStore(tmp_path / "config")


def write_profile(store: ProfileStore, name: str, text: str) -> Path:
    """Put a hand-written file into the store's profiles dir."""
    store.profiles_dir.mkdir(parents=True, exist_ok=True)
    path = store.profiles_dir / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path

"""Saving never changes the mode of anything reached through a symlink (a shared 1777 directory
linked as the profiles dir stays 1777; a planted link never receives a backup)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from engine.plan.specs import demo_spec
from profiles.store import ProfileStore
from tests.profiles.conftest import write_profile


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_symlinked_profiles_dir_keeps_its_mode(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    config = tmp_path / "config"
    config.mkdir()
    (config / "profiles").symlink_to(shared, target_is_directory=True)
    store = ProfileStore(config)
    store.save_spec("mine", demo_spec())
    store.mark_used("local-cpu-demo")  # writes .state.toml there too
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
    assert (shared / "mine.toml").is_file() and _mode(shared / "mine.toml") == 0o600
    assert store.load("mine").spec == demo_spec()


def test_an_own_profiles_dir_is_still_made_private(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "config")
    store.profiles_dir.mkdir(parents=True)
    os.chmod(store.profiles_dir, 0o755)
    store.save_spec("mine", demo_spec())
    assert _mode(store.profiles_dir) == 0o700


def test_a_backup_never_writes_through_a_planted_symlink(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "config")
    broken = write_profile(store, "mine", "[hardware]\nnodes = 'x'\n")
    outside = tmp_path / "outside.txt"
    (broken.parent / "mine.toml.broken.bak").symlink_to(outside)  # dangling
    target = tmp_path / "target.txt"
    target.write_text("keep\n")
    os.chmod(target, 0o644)
    (broken.parent / "mine.toml.broken-1.bak").symlink_to(target)
    store.save_spec("mine", demo_spec())
    assert not outside.exists()
    assert target.read_text() == "keep\n" and _mode(target) == 0o644
    backups = [p for p in broken.parent.iterdir() if p.name.endswith(".bak") and not p.is_symlink()]
    assert len(backups) == 1 and backups[0].read_text() == "[hardware]\nnodes = 'x'\n"
    assert _mode(backups[0]) == 0o600

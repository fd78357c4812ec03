"""ProfileStore: built-ins, save/load, comments kept, permissions, broken files, migration,
delete/rename/export/import, last use."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from engine.plan.catalog import get_gpu
from engine.plan.models import resolve_model
from engine.plan.names import Backend
from engine.plan.specs import HardwareSpec, ModelSpec, Spec, TrainingSpec, demo_spec
from profiles.schema import SCHEMA_VERSION, Profile, ProfileError
from profiles.store import PRESETS_DIR, ProfileStore, default_config_dir
from tests.profiles.conftest import write_profile

BUILTINS = {
    "local-cpu-demo",
    "single-node-8xh100",
    "4-node-h100-ib",
    "2-node-a100-tcp",
    "skypilot-2x8-h100",
    "mixtral-moe-2-nodes",
}

COMMENTED = """\
# My cluster. Ask Ana before changing the hosts.
schema_version = 2

[profile]
name = "team"
description = "team cluster"

[model]
preset = "llama-3-8b"  # the one we fine-tune

# ---- machines ----
[hardware]
gpu = "H100"      # an alias: kept as written
gpus_per_node = 8
nodes = 2         # two of the four nodes are ours

[training]
seq_len = 4096
tokens = "2B"     # budget, as typed
steps = 20        # the default, written out on purpose

[launch]
backend = "ssh"
hosts = ["n0", "n1"]
identity_file = "~/.ssh/team_ed25519"
"""


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


# ---------------------------------------------------------------- built-ins


def test_builtins_listed_and_valid(store: ProfileStore) -> None:
    entries = {e.name: e for e in store.list()}
    assert BUILTINS <= set(entries)
    for name in BUILTINS:
        e = entries[name]
        assert e.source == "builtin" and e.ok, e.error
        prof = store.load(name)
        spec = prof.spec
        get_gpu(spec.hardware.gpu)  # a real catalog key
        assert resolve_model(spec.model).params_total > 0
        assert prof.profile.description
        # every shipped file says what it is in a comment
        assert (PRESETS_DIR / f"{name}.toml").read_text().startswith("# Built-in preset")


def test_local_cpu_demo_is_the_embedded_default(store: ProfileStore) -> None:
    assert store.load("local-cpu-demo").spec == demo_spec()


def test_builtin_specs_match_their_promise(store: ProfileStore) -> None:
    ib = store.load("4-node-h100-ib").spec
    assert (ib.hardware.nodes, ib.hardware.gpus_per_node) == (4, 8)
    assert ib.network.tier.value.startswith("ib") and ib.launch.backend is Backend.SSH
    tcp = store.load("2-node-a100-tcp").spec
    assert tcp.hardware.gpu == "a100-80gb" and tcp.network.tier.value == "tcp"
    sky = store.load("skypilot-2x8-h100").spec
    assert sky.launch.backend is Backend.SKYPILOT and sky.hardware.world_size == 16
    moe = store.load("mixtral-moe-2-nodes").spec
    assert resolve_model(moe.model).is_moe and moe.hardware.nodes == 2
    one = store.load("single-node-8xh100").spec
    assert one.hardware.nodes == 1 and one.hardware.gpus_per_node == 8


# ---------------------------------------------------------------- save / load


@pytest.mark.parametrize("builtin", sorted(BUILTINS))
def test_save_then_load_gives_the_same_spec(store: ProfileStore, builtin: str) -> None:
    spec = store.load(builtin).spec
    store.save_spec("copy", spec, description="a copy")
    back = store.load("copy")
    assert back.spec == spec
    assert back.profile.name == "copy" and back.profile.description == "a copy"
    assert back.profile.created is not None


def test_save_writes_user_only_files_atomically(store: ProfileStore) -> None:
    path = store.save_spec("mine", demo_spec())
    assert _mode(path) == 0o600
    assert _mode(store.profiles_dir) == 0o700
    assert [p.name for p in store.profiles_dir.iterdir()] == ["mine.toml"]  # no temp left
    text = path.read_text()
    assert f"schema_version = {SCHEMA_VERSION}" in text and "[profile]" in text


def test_comments_survive_a_save(store: ProfileStore) -> None:
    path = write_profile(store, "team", COMMENTED)
    prof = store.load("team")
    assert prof.hardware.gpu == "h100-sxm" and prof.training.tokens == 2e9
    spec = prof.spec
    spec.hardware.nodes = 4
    spec.training.global_batch = 128
    store.save_spec("team", spec)
    text = path.read_text()
    for line in COMMENTED.splitlines():
        if line.startswith("nodes"):
            continue
        assert line in text, f"lost line: {line!r}"
    assert "nodes = 4         # two of the four nodes are ours" in text  # its comment too
    assert "global_batch = 128" in text
    again = store.load("team")
    assert again.spec == spec and again.profile.description == "team cluster"


def test_unchanged_save_keeps_the_file_byte_for_byte(store: ProfileStore) -> None:
    path = write_profile(store, "team", COMMENTED)
    store.save(store.load("team"))
    # only the creation time, missing in the hand-written file, is added
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("created = ")]
    assert "\n".join(lines) + "\n" == COMMENTED


def test_removed_value_is_removed_from_the_file(store: ProfileStore) -> None:
    path = write_profile(store, "team", COMMENTED)
    spec = store.load("team").spec
    spec.training.tokens = None
    spec.launch.identity_file = None
    store.save_spec("team", spec)
    text = path.read_text()
    assert "tokens" not in text and "identity_file" not in text
    assert "# the one we fine-tune" in text
    assert store.load("team").spec == spec


def test_save_refuses_to_overwrite_when_asked(store: ProfileStore) -> None:
    store.save_spec("mine", demo_spec())
    with pytest.raises(ProfileError, match="already exists"):
        store.save_spec("mine", demo_spec(), overwrite=False)


def test_saving_over_a_broken_file_keeps_it_as_backup(store: ProfileStore) -> None:
    path = write_profile(store, "mine", "[hardware\n")
    store.save_spec("mine", demo_spec())
    assert store.load("mine").spec == demo_spec()
    assert (store.profiles_dir / "mine.toml.broken.bak").read_text() == "[hardware\n"
    assert path.exists()


@pytest.mark.parametrize("bad", ["../evil", "a/b", "", ".hidden", "two words", "x.toml", "a" * 65])
def test_names_are_validated(store: ProfileStore, bad: str) -> None:
    with pytest.raises(ProfileError, match="not a profile name"):
        store.save_spec(bad, demo_spec())
    assert not store.profiles_dir.exists() or not any(store.profiles_dir.iterdir())


def test_a_cluster_only_profile_is_allowed(store: ProfileStore) -> None:
    spec = Spec(hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=2))
    store.save_spec("cluster", spec)
    prof = store.load("cluster")
    assert not prof.model.has_source and prof.model_summary().startswith("—")


# ---------------------------------------------------------------- broken files

VALID = 'schema_version = 2\n\n[model]\npreset = "llama-3-8b"\n\n[hardware]\ngpu = "h100-sxm"\n'
BROKEN = {
    "corrupted": (b"schema_version = 2\n\x00\xff\xfe\x9c garbage", "not UTF-8"),
    "truncated": (VALID.encode()[: VALID.index("gpu =") + 5], "not valid TOML"),
    "wrong-typed": (b"schema_version = 2\n[hardware]\nnodes = 'four'\n", "hardware.nodes"),
    "future": (b"schema_version = 99\n", "newer dtrain-tui"),
    "unknown-key": (b"[training]\nseq_lenn = 4096\n", "training.seq_lenn: unknown key"),
    "unknown-section": (b"[traning]\nseq_len = 4096\n", "traning: unknown key"),
    "empty": (b"", "empty"),
    "bad-version": (b"schema_version = 'two'\n", "schema_version"),
    "bad-value": (b"[launch]\nhosts = ['no spaces allowed']\n", "launch.hosts"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_file_one_line_error_file_untouched_others_listed(
    store: ProfileStore, case: str
) -> None:
    content, expected = BROKEN[case]
    store.save_spec("good", demo_spec())
    store.profiles_dir.mkdir(parents=True, exist_ok=True)
    path = store.profiles_dir / "broken.toml"
    path.write_bytes(content)
    before = path.stat().st_mtime_ns
    with pytest.raises(ProfileError) as exc:
        store.load("broken")
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg and expected in msg, msg
    assert path.read_bytes() == content and path.stat().st_mtime_ns == before
    entries = {e.name: e for e in store.list()}
    assert not entries["broken"].ok and entries["broken"].error == msg
    assert entries["good"].ok and BUILTINS <= set(entries)
    store.mark_used("broken")  # best effort: leaves it alone
    assert path.read_bytes() == content
    assert sorted(p.name for p in store.profiles_dir.iterdir()) == ["broken.toml", "good.toml"]


def test_unknown_profile_suggests_the_close_name(store: ProfileStore) -> None:
    with pytest.raises(ProfileError, match="did you mean 'local-cpu-demo'"):
        store.load("local-cpu-dem")


# ---------------------------------------------------------------- migration

V1 = """\
# old file, hand-written for 0.0.3
schema_version = 1
name = "old"
description = "from last year"  # keep me

[model]
preset = "llama-2-7b"

[network]
tier = "tcp"
ifname = "eth1"   # the fast NIC

[launch]
backend = "ssh"
hosts = ["a", "b"]
ssh_key = "~/.ssh/old_key"
"""


def test_older_schema_is_migrated_and_original_kept(store: ProfileStore) -> None:
    path = write_profile(store, "old", V1)
    assert next(e for e in store.list() if e.name == "old").needs_migration
    assert path.read_text() == V1  # listing never rewrites
    prof = store.load("old")
    assert prof.network.socket_ifname == "eth1"
    assert str(prof.launch.identity_file) == "~/.ssh/old_key"
    assert prof.profile.description == "from last year"
    backup = store.profiles_dir / "old.toml.v1.bak"
    assert backup.read_text() == V1 and _mode(backup) == 0o600
    text = path.read_text()
    assert f"schema_version = {SCHEMA_VERSION}" in text and "ssh_key" not in text
    assert "# the fast NIC" in text and "# keep me" in text and "# old file" in text
    assert _mode(path) == 0o600
    assert store.load("old").spec == prof.spec  # now current: loads without another backup
    assert len(list(store.profiles_dir.glob("*.bak"))) == 1


def test_broken_old_file_is_not_migrated(store: ProfileStore) -> None:
    text = V1.replace('tier = "tcp"', 'tier = "carrier-pigeon"')
    path = write_profile(store, "old", text)
    with pytest.raises(ProfileError, match="network.tier"):
        store.load("old")
    assert path.read_text() == text and not list(store.profiles_dir.glob("*.bak"))


# ---------------------------------------------------------------- shadowing, delete, rename


def test_user_profile_shadows_builtin_and_delete_reveals_it(store: ProfileStore) -> None:
    spec = demo_spec()
    spec.training.steps = 7
    store.save_spec("local-cpu-demo", spec)
    entries = [e for e in store.list() if e.name == "local-cpu-demo"]
    assert len(entries) == 1 and entries[0].source == "user" and entries[0].shadows_builtin
    assert store.load("local-cpu-demo").training.steps == 7
    # a shadowing copy starts from the built-in's file, comments included
    assert store.user_path("local-cpu-demo").read_text().startswith("# Built-in preset")
    store.delete("local-cpu-demo")
    assert store.load("local-cpu-demo").spec == demo_spec()
    with pytest.raises(ProfileError, match="built-in preset and cannot be deleted"):
        store.delete("local-cpu-demo")


def test_rename_keeps_comments(store: ProfileStore) -> None:
    write_profile(store, "team", COMMENTED)
    dst = store.rename("team", "team2")
    assert not store.user_path("team").exists()
    text = dst.read_text()
    assert "Ask Ana before" in text and 'name = "team2"' in text and _mode(dst) == 0o600
    assert store.load("team2").profile.name == "team2"
    store.save_spec("other", demo_spec())
    with pytest.raises(ProfileError, match="already exists"):
        store.rename("team2", "other")
    with pytest.raises(ProfileError, match="built-in"):
        store.rename("local-cpu-demo", "x")


def test_export_import_round_trip(store: ProfileStore, tmp_path: Path) -> None:
    write_profile(store, "team", COMMENTED)
    out = tmp_path / "team-export.toml"
    text = store.export("team", out)
    assert out.read_text() == text == COMMENTED and _mode(out) == 0o600
    out.write_text("# someone's file\n")
    with pytest.raises(ProfileError, match="already exists"):
        store.export("team", out)
    assert out.read_text() == "# someone's file\n"
    store.export("team", out, overwrite=True)
    other = ProfileStore(tmp_path / "other-config")
    name, path = other.import_file(out)
    assert name == "team" and other.load("team").spec == store.load("team").spec
    assert "Ask Ana before" in path.read_text()
    with pytest.raises(ProfileError, match="already exists"):
        other.import_file(out)
    name, _ = other.import_file(out, name="team-b")
    assert other.load("team-b").profile.name == "team-b"
    assert other.export("local-cpu-demo").startswith("# Built-in preset")


def test_import_refuses_a_broken_file(store: ProfileStore, tmp_path: Path) -> None:
    src = tmp_path / "x.toml"
    src.write_text("[hardware]\nnodez = 2\n")
    with pytest.raises(ProfileError, match="hardware.nodez"):
        store.import_file(src)
    assert not store.profiles_dir.exists()


# ---------------------------------------------------------------- last use, config dir


def test_mark_used_records_last_use_and_keeps_comments(store: ProfileStore) -> None:
    path = write_profile(store, "team", COMMENTED)
    assert store.load("team").profile.last_used is None
    store.mark_used("team")
    assert store.load("team").profile.last_used is not None
    assert "Ask Ana before" in path.read_text()
    store.mark_used("local-cpu-demo")
    entry = next(e for e in store.list() if e.name == "local-cpu-demo")
    assert entry.last_used is not None
    assert store.load("local-cpu-demo").spec == demo_spec()


def test_config_dir_from_env_and_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTRAIN_CONFIG_DIR", str(tmp_path / "envdir"))
    assert default_config_dir() == tmp_path / "envdir"
    assert ProfileStore().profiles_dir == tmp_path / "envdir" / "profiles"
    assert ProfileStore(tmp_path / "arg").profiles_dir == tmp_path / "arg" / "profiles"
    monkeypatch.delenv("DTRAIN_CONFIG_DIR")
    assert default_config_dir().name == "dtrain-tui"


def test_profile_from_spec_carries_every_section() -> None:
    spec = Spec(
        model=ModelSpec(preset="llama-3-8b"),
        hardware=HardwareSpec(gpu="a100-80gb", gpus_per_node=4, nodes=3),
        training=TrainingSpec(seq_len=1024, global_batch=48, micro_batch=2),
    )
    prof = Profile.from_spec("x", spec)
    assert prof.spec == spec and prof.schema_version == SCHEMA_VERSION


def test_unwritable_config_dir_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the config dir should be")
    store = ProfileStore(blocker)
    with pytest.raises(ProfileError) as exc:
        store.save_spec("mine", demo_spec())
    assert "cannot write" in str(exc.value) and "\n" not in str(exc.value)
    assert blocker.read_text() == "a file where the config dir should be"


def test_saving_over_an_old_file_keeps_the_original(store: ProfileStore) -> None:
    path = write_profile(store, "old", V1)
    prof = Profile.from_spec("old", demo_spec())
    store.save(prof)
    assert (store.profiles_dir / "old.toml.v1.bak").read_text() == V1
    assert store.load("old").spec == demo_spec()
    assert "# old file" in path.read_text()

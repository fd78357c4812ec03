"""A profile never holds a password, a private key or a token: saving one is refused, and so is
loading a hand-written file that holds one (the file is left as it is)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.plan.specs import demo_spec
from profiles.schema import SecretError, find_secret
from profiles.store import ProfileStore
from tests.profiles.conftest import write_profile

PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)
RSA = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----"


def _launch(**kw: object) -> dict[str, object]:
    return {"launch": kw}


REFUSED = {
    "hf-token-env": (_launch(env={"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz012345"}), "HF_TOKEN"),
    "wandb-key-env": (_launch(env={"WANDB_API_KEY": "0123456789abcdef"}), "WANDB_API_KEY"),
    "aws-secret-env": (_launch(env={"AWS_SECRET_ACCESS_KEY": "abc/def"}), "AWS_SECRET"),
    "password-env": (_launch(env={"DB_PASSWORD": "hunter2"}), "DB_PASSWORD"),
    "pem-in-setup": (_launch(remote_setup=f"echo '{PEM}' > ~/.ssh/id"), "private key"),
    "rsa-in-env": (_launch(env={"DEPLOY": RSA}), "private key"),
    "export-in-setup": (
        _launch(remote_setup="export WANDB_API_KEY=abc123; source v/bin/activate"),
        "WANDB_API_KEY",
    ),
    "token-pattern": (_launch(script_args=["--resume", "ghp_" + "a" * 36]), "GitHub token"),
    "password-flag": (_launch(script_args=["--password", "hunter2"]), "--password"),
    "token-flag-eq": (_launch(script_args=["--hf-token=hf_x"]), "--hf-token"),
    "url-password": (
        _launch(remote_setup="pip install git+https://me:pw@git.example.com/x"),
        "URL",
    ),
    "aws-key-id": (_launch(env={"X": "AKIAABCDEFGHIJKLMNOP"}), "AWS"),
    "password-key": ({"launch": {"password": "hunter2"}}, "launch.password"),
    "passphrase-key": ({"launch": {"ssh_passphrase": "x"}}, "launch.ssh_passphrase"),
}

ALLOWED = {
    "cuda-visible": _launch(env={"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_IB_PKEY": "0"}),
    "key-path": _launch(env={"SSH_KEY_PATH": "~/.ssh/id_ed25519"}),
    "token-reference": _launch(env={"HF_TOKEN": "$HF_TOKEN"}),
    "empty-token": _launch(env={"HF_TOKEN": ""}),
    "identity-file": _launch(identity_file="~/.ssh/id_ed25519"),
    "token-budget": {"training": {"tokens": 2e12}},
    "max-tokens-flag": _launch(script_args=["--max-tokens", "4096", "--token-budget-file", "x"]),
    "setup-from-file": _launch(
        remote_setup="source ~/.secrets/env && export HF_TOKEN=$(cat ~/.hf)"
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_secret_found(case: str) -> None:
    data, expected = REFUSED[case]
    found = find_secret(data)
    assert found is not None, case
    assert expected in f"{found[0]} {found[1]}"


@pytest.mark.parametrize("case", sorted(ALLOWED))
def test_not_a_secret(case: str) -> None:
    assert find_secret(ALLOWED[case]) is None


def test_saving_a_password_or_key_material_is_refused(store: ProfileStore) -> None:
    spec = demo_spec()
    spec.launch.env = {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz012345"}
    with pytest.raises(SecretError, match=r"launch\.env\.HF_TOKEN.*never stores"):
        store.save_spec("leaky", spec)
    spec = demo_spec()
    spec.launch.remote_setup = f"printf '%s' '{RSA}' > k"
    with pytest.raises(SecretError, match="private key material"):
        store.save_spec("leaky", spec)
    spec = demo_spec()
    spec.launch.script_args = ["--db-password", "hunter2"]
    with pytest.raises(SecretError, match="--db-password"):
        store.save_spec("leaky", spec)
    assert not store.user_path("leaky").exists()


def test_saving_a_secret_never_overwrites_the_good_file(store: ProfileStore) -> None:
    path = store.save_spec("mine", demo_spec())
    before = path.read_bytes()
    spec = demo_spec()
    spec.launch.env = {"GITHUB_TOKEN": "x"}
    with pytest.raises(SecretError):
        store.save_spec("mine", spec)
    assert path.read_bytes() == before


def test_hand_written_secret_is_refused_on_load_and_left_alone(store: ProfileStore) -> None:
    text = '[launch]\nbackend = "ssh"\nhosts = ["a"]\npassword = "hunter2"\n'
    path = write_profile(store, "hand", text)
    with pytest.raises(SecretError) as exc:
        store.load("hand")
    assert "launch.password" in str(exc.value) and str(path) in str(exc.value)
    assert "\n" not in str(exc.value)
    assert path.read_text() == text
    entry = next(e for e in store.list() if e.name == "hand")
    assert not entry.ok and "never stores" in (entry.error or "")


def test_importing_a_file_with_a_secret_is_refused(store: ProfileStore, tmp_path: Path) -> None:
    src = tmp_path / "shared.toml"
    src.write_text('[launch]\nremote_setup = "export HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123"\n')
    with pytest.raises(SecretError, match=r"launch\.remote_setup"):
        store.import_file(src)
    assert not store.user_path("shared").exists()

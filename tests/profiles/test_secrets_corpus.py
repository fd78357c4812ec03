"""The secret guard over a corpus (tests/data/secrets_corpus.json): disguised secrets (secret-like
names, known value shapes, flags, shell text in remote_setup) are all found; harmless look-alikes
(paths, token budgets, model names, hashes in URLs, references to variables) all pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.plan.specs import Spec, demo_spec
from profiles.schema import SecretError, find_secret
from profiles.store import ProfileStore

CORPUS = json.loads(
    (Path(__file__).resolve().parents[1] / "data" / "secrets_corpus.json").read_text("utf-8")
)
SECRETS: dict[str, Any] = CORPUS["secrets"]
HARMLESS: dict[str, Any] = CORPUS["harmless"]


def test_the_corpus_is_big_enough() -> None:
    assert len(SECRETS) >= 88 and len(HARMLESS) >= 54


@pytest.mark.parametrize("case", sorted(SECRETS))
def test_every_disguised_secret_is_found(case: str) -> None:
    assert find_secret(SECRETS[case]) is not None, case


@pytest.mark.parametrize("case", sorted(HARMLESS))
def test_no_harmless_look_alike_is_refused(case: str) -> None:
    assert find_secret(HARMLESS[case]) is None, (case, find_secret(HARMLESS[case]))


def _spec(data: dict[str, Any]) -> Spec | None:
    base = demo_spec().model_dump(mode="json")
    for section, values in data.items():
        if section != "profile":  # the [profile] table: the description, passed on its own
            base[section] = {**base[section], **values}
    try:
        return Spec.model_validate(base)
    except Exception:  # noqa: BLE001 - a shape the spec refuses on its own
        return None


def _description(data: dict[str, Any]) -> str | None:
    description: str | None = data.get("profile", {}).get("description")
    return description


@pytest.mark.parametrize("case", sorted(SECRETS))
def test_saving_a_disguised_secret_is_refused(store: ProfileStore, case: str) -> None:
    spec = _spec(SECRETS[case])
    if spec is None:
        pytest.skip("the spec itself refuses this value")
    with pytest.raises(SecretError):
        store.save_spec("leaky", spec, description=_description(SECRETS[case]))
    assert not store.user_path("leaky").exists()


@pytest.mark.parametrize("case", sorted(HARMLESS))
def test_saving_a_look_alike_works(store: ProfileStore, case: str) -> None:
    spec = _spec(HARMLESS[case])
    if spec is None:
        pytest.skip("the spec itself refuses this value")
    store.save_spec("fine", spec, description=_description(HARMLESS[case]))
    assert store.load("fine").spec == spec

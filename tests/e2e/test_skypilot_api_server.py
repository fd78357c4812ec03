"""``--backend skypilot`` does not leave behind a SkyPilot API server it started (about 1.5 GB):
the SDK starts a local one on its first call when none runs; when the launch ends (failed here)
dtrain-tui stops it (``sky.api_stop``), and leaves alone one that was running before. SkyPilot's
own health probe of the local server runs for real (none runs in the test); the SDK calls are
stood in for at the ``sky`` module boundary, bound to the installed SkyPilot's signatures
(tests/e2e/test_launch_skypilot.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.rundir.files import read_run
from tests.e2e.launch_util import collect
from tests.e2e.test_launch_skypilot import FAIL_LOG, FAILED, FakeSky, _backend, bundle

sky = pytest.importorskip("sky")
__all__ = ["bundle"]  # the fixture


def _launch(bundle: Path, tmp_path: Path, mp: pytest.MonkeyPatch) -> list[str]:
    fake = FakeSky(FAIL_LOG, FAILED)
    fake.install(mp)  # sky.api_stop among the calls it stands in for
    b = _backend(bundle, tmp_path)
    b.start()
    collect(b, timeout=60)
    assert read_run(tmp_path / "run")["state"] == "failed"
    return [name for name, _ in fake.calls if name.startswith("api_")]


def test_a_failed_launch_stops_the_api_server_it_started(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sky.server import common

    assert common.get_api_server_status().status != common.ApiServerStatus.HEALTHY
    assert _launch(bundle, tmp_path, monkeypatch) == ["api_stop"]


def test_an_api_server_running_before_is_left_running(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sky.server import common

    def healthy(*args: Any, **kw: Any) -> Any:
        return common.ApiServerInfo(status=common.ApiServerStatus.HEALTHY)

    monkeypatch.setattr(common, "get_api_server_status", healthy)
    assert _launch(bundle, tmp_path, monkeypatch) == []

"""The secret guard is linear: a megabyte of text is scanned in a fraction of a second (the
patterns it replaced backtracked on runs of letters: 20 s for 128 KB, minutes for 1 MB), and a
profile whose field is over the 64 KiB cap is refused at once, in one line naming the field,
by ``profiles import`` and shown broken by ``profiles list`` (what the wizard's Ctrl+O lists).

Each scan runs in a child process killed after DEADLINE_S, so a quadratic scanner fails the test
instead of hanging it; times are the child's CPU time, which a loaded machine inflates far less
than wall time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.plan.specs import demo_spec
from profiles.schema import MAX_FIELD_BYTES, ProfileError
from profiles.store import ProfileStore
from tests.profiles.conftest import write_profile

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 90
"""Wall-clock kill for a child: far above what a linear scan needs on a loaded machine, far below
the minutes a quadratic one takes on a megabyte."""
MB = 1024 * 1024

_SCAN = """
import json, sys, time
from profiles.schema import find_secret

size = int(sys.argv[1])
shapes = json.loads(sys.argv[2])
fields = {
    "description": lambda t: {"profile": {"description": t}},
    "remote_setup": lambda t: {"launch": {"remote_setup": t}},
    "env": lambda t: {"launch": {"env": {"X": t}}},
    "script_args": lambda t: {"launch": {"script_args": ["--note", t]}},
}
out = {}
for unit in shapes:
    text = (unit * (size // len(unit) + 1))[:size]
    for field, wrap in fields.items():
        data = wrap(text)
        t0 = time.process_time()
        found = find_secret(data)
        out[f"{unit!r} in {field}"] = [time.process_time() - t0, found is not None]
print(json.dumps(out))
"""


def _scan_times(size: int, shapes: list[str]) -> dict[str, list[float | bool]]:
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _SCAN, str(size), json.dumps(shapes)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            check=True,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"scanning {size} bytes took over {DEADLINE_S} s: the scanner is not linear")
    result: dict[str, list[float | bool]] = json.loads(proc.stdout)
    return result


def test_a_megabyte_of_letters_is_scanned_in_half_a_second() -> None:
    times = _scan_times(MB, ["a", "Ab", "abcdefgh "])
    slow = {case: t for case, (t, _) in times.items() if t >= 0.5}
    assert not slow, slow
    assert not any(found for _, found in times.values())


def test_token_dense_text_stays_linear() -> None:
    """The shapes that cost the most per byte: many words, many separators, many starts of the
    token formats the scanner knows (each one looked at, none a secret)."""
    shapes = [
        "a b ",
        "-x ",
        "a=",
        "a://",
        "a:b@",
        "|a",
        "$(a",
        "'a' ",
        "hf_a",
        "sk-",
        "eyJ.",
        "MII",
    ]
    times = _scan_times(256 * 1024, shapes)
    slow = {case: t for case, (t, _) in times.items() if t >= 1.5}
    assert not slow, slow


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-c", "import sys; from cli import main; sys.exit(main(sys.argv[1:]))"]
            + list(argv),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"dtrain-tui {' '.join(argv[:2])} took over {DEADLINE_S} s on a 1 MB field")


def _huge_profile(kb: int) -> str:
    return f'[profile]\ndescription = "{"a" * (kb * 1024)}"\n\n[hardware]\ngpu = "cpu"\n'


def test_profiles_import_refuses_a_huge_field_in_one_line(tmp_path: Path) -> None:
    src = tmp_path / "huge.toml"
    src.write_text(_huge_profile(1024), encoding="utf-8")
    cfg = tmp_path / "cfg"
    proc = _cli("profiles", "import", str(src), "--config-dir", str(cfg))
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert "profile.description is 1,048,576 bytes" in err and "at most 65,536 bytes" in err
    assert "Traceback" not in proc.stderr
    assert not (cfg / "profiles" / "huge.toml").exists()


def test_profiles_list_shows_a_huge_profile_broken(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    store = ProfileStore(cfg)
    store.save_spec("fine", demo_spec(), description="small")
    write_profile(store, "huge", _huge_profile(1024))
    proc = _cli("profiles", "list", "--json", "--config-dir", str(cfg))
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["fine"]["ok"] is True
    assert rows["huge"]["ok"] is False
    assert "profile.description" in rows["huge"]["error"] and "64 KiB" in rows["huge"]["error"]
    assert "\n" not in rows["huge"]["error"]


def test_the_cap_is_per_field_and_generous(store: ProfileStore) -> None:
    """A long but real set-up script (just under the cap) saves and loads; one byte over is
    refused naming the field, and nothing is written."""
    line = "pip install --no-cache-dir torch==2.4.0 deepspeed==0.15.1  # pin the stack\n"
    script = line * ((MAX_FIELD_BYTES - 1) // len(line))
    spec = demo_spec()
    spec.launch.remote_setup = script
    store.save_spec("long", spec)
    assert store.load("long").spec.launch.remote_setup == script
    spec.launch.remote_setup = "a" * (MAX_FIELD_BYTES + 1)
    with pytest.raises(
        ProfileError, match=r"launch\.remote_setup is 65,537 bytes.*at most 65,536 bytes \(64 KiB\)"
    ):
        store.save_spec("toolong", spec)
    assert not store.user_path("toolong").exists()

"""What a run directory or a bundle directory holds is not trusted: escape sequences never reach
a terminal, a huge line never hides the lines after it, absurd sizes and unsafe file names are
refused with one line naming the file and field."""

from __future__ import annotations

import hashlib
import io
import json
import time
from pathlib import Path

import pytest

from cli.monitor_cmd import follow
from engine.errors import DtrainError
from engine.fsio import atomic_write_text
from engine.monitor.tail import RunDirSource
from engine.monitor.textsafe import has_control, safe_line, safe_lines, safe_text
from engine.rundir.events import LineBatch

HOSTILE = [
    "\x1b]52;c;ZWNobyBwd25lZA==\x07clipboard",  # OSC 52 clipboard write
    "\x1b]0;pwned title\x1b\\title",  # title change, ST-terminated
    "\x1b[2J\x1b[Hclear",  # clear screen, cursor home
    "\x1b[31mred\x1b[0m",  # plain colour
    "\x1b[?1049hsw\x1b[?1049l",  # alternate screen
    "\x1bcreset",  # RIS
    "\x1b(Bcharset",
    "\x1bP1$r0m\x1b\\dcs",  # DCS
    "\x1b_apc\x1b\\apc",
    "\x9b2Jc1csi",  # 8-bit CSI
    "\x9d0;t\x9cc1osc",  # 8-bit OSC
    "bell\x07bs\x08cr\rvt\x0bff\x0cdel\x7fnul\x00",
    "cut osc \x1b]0;never ends",
    "cut csi \x1b[3",
    "lone esc \x1b",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_safe_text_leaves_no_control_character(text: str) -> None:
    out = safe_text(text)
    assert not has_control(out)
    assert "\x1b" not in out and not any(0x80 <= ord(c) <= 0x9F for c in out)


def test_safe_text_keeps_what_is_harmless() -> None:
    clean = "step 1\tloss=2.5 ✓ 日本語 [rank 3] 100%|██████|"
    assert safe_text(clean) is clean
    assert safe_text("\x1b[31mred\x1b[0m and \x1b]0;t\x07text") == "red and text"
    assert safe_text("a\nb") == "a\nb" and safe_line("a\nb") == "a b"
    batch = ["ok", "ok 2"]
    assert safe_lines(batch) is batch
    assert safe_lines(["a", "\x1b]0;x", "b"]) == ["a", "", "b"]  # an open OSC stops at its line
    assert safe_lines(["a\nb", "\x1b[1mc"]) == ["a b", "c"]


def _run(run: Path, ranks: int = 1, **extra: object) -> None:
    info = {
        "state": "succeeded",
        "world_size": ranks,
        "nodes": 1,
        "ranks": [
            {"rank": r, "node_rank": 0, "host": "localhost", "exit_code": 0} for r in range(ranks)
        ],
        **extra,
    }
    atomic_write_text(run / "run.json", json.dumps(info))


def test_follow_prints_no_escape_sequence_and_files_stay_byte_exact(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    raw = "".join(f"{x}\n" for x in HOSTILE).encode()
    (logs / "rank0.stdout.log").write_bytes(raw)
    _run(tmp_path, reason="\x1b]0;reason title\x07done")
    out = io.StringIO()
    assert follow(tmp_path, out) == 0
    text = out.getvalue()
    assert not has_control(text), repr(text)
    assert "[rank 0] clipboard" in text and "[rank 0] red" in text
    assert (logs / "rank0.stdout.log").read_bytes() == raw


def _drain(src: RunDirSource, timeout: float = 20.0) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while not src.done and time.monotonic() < deadline:
        for ev in src.poll(0.05):
            if isinstance(ev, LineBatch):
                lines.extend(ev.lines)
    assert src.done
    return lines


@pytest.mark.parametrize("size", [600 << 10, 3 << 20])
def test_a_huge_line_is_cut_and_every_later_line_is_shown(tmp_path: Path, size: int) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    body = b"first\n" + b"x" * size + b"\n" + b"".join(b"after %d\n" % i for i in range(1000))
    body += b"y" * size  # and a huge last line without its newline
    (logs / "rank0.stdout.log").write_bytes(body)
    _run(tmp_path)
    lines = _drain(RunDirSource(tmp_path))
    assert lines[0] == "first"
    assert lines[1].startswith("x" * 1000) and lines[1].endswith(
        f"… [cut {size - (64 << 10)} bytes]"
    )
    assert len(lines[1]) < (64 << 10) + 100
    assert lines[2:1002] == [f"after {i}" for i in range(1000)]
    assert lines[1002].startswith("yyy") and lines[1002].endswith("bytes]")
    assert len(lines) == 1003
    out = io.StringIO()
    follow(tmp_path, out)
    assert "[rank 0] after 999\n" in out.getvalue()


def test_a_huge_world_size_in_run_json_is_refused(tmp_path: Path) -> None:
    _run(tmp_path, world_size=10**5)
    with pytest.raises(DtrainError) as e:
        RunDirSource(tmp_path).start()
    assert "run.json" in str(e.value) and "world_size" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_huge_rank_or_node_number_in_run_json_is_refused(tmp_path: Path) -> None:
    _run(tmp_path, ranks=1)
    info = json.loads((tmp_path / "run.json").read_text())
    info["ranks"][0]["rank"] = 10**9
    atomic_write_text(tmp_path / "run.json", json.dumps(info))
    with pytest.raises(DtrainError, match="rank"):
        RunDirSource(tmp_path).start()


# ---- bundle.json: names and sizes --------------------------------------------------------


def _bundle(tmp_path: Path) -> Path:
    from engine.write import write_bundle
    from tests.engine.writers_fixtures import make_plan

    out = tmp_path / "b"
    write_bundle(make_plan(), out)
    return out


def _edit_manifest(out: Path, **changes: object) -> None:
    data = json.loads((out / "bundle.json").read_text())
    data.update(changes)
    (out / "bundle.json").write_text(json.dumps(data))


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("where", ["../victim", "ABS", "sub/victim", "..", ""])
def test_write_never_deletes_outside_out_for_a_name_in_bundle_json(
    tmp_path: Path, where: str, force: bool
) -> None:
    from engine.write import write_bundle
    from tests.engine.writers_fixtures import make_plan

    out = _bundle(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (out / "sub").mkdir()
    (out / "sub" / "victim").write_text("precious\n")
    name = str(victim) if where == "ABS" else where
    digest = hashlib.sha256(b"precious\n").hexdigest()
    data = json.loads((out / "bundle.json").read_text())
    _edit_manifest(out, files={**data["files"], name: digest})
    before = (out / "bundle.json").read_text()
    with pytest.raises(DtrainError) as e:
        write_bundle(make_plan(), out, force=force)
    msg = str(e.value)
    assert "bundle.json" in msg and "files" in msg and "\n" not in msg
    assert victim.read_text() == "precious\n"
    assert (out / "sub" / "victim").read_text() == "precious\n"
    assert (out / "bundle.json").read_text() == before


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"gpus_per_node": 10**9}, "gpus_per_node"),
        ({"nodes": 10**7}, "nodes"),
        ({"nodes": 1000, "gpus_per_node": 1000}, "world_size"),
        ({"node_scripts": ["../../evil.sh"]}, "node_scripts"),
        ({"sky_yaml": "/etc/passwd"}, "sky_yaml"),
    ],
)
def test_launch_refuses_absurd_sizes_and_paths_in_bundle_json(
    tmp_path: Path, changes: dict[str, object], field: str
) -> None:
    from engine.write.manifest import read_manifest

    out = _bundle(tmp_path)
    _edit_manifest(out, **changes)
    with pytest.raises(DtrainError) as e:
        read_manifest(out)
    msg = str(e.value)
    assert "bundle.json" in msg and field in msg and "\n" not in msg

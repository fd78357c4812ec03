"""A bundle is written whole or not at all: on a full disk ``write`` leaves the previous bundle
byte for byte as it was, no stage directory behind, and says so in one line (security issue,
finding 7: it used to leave new ``launch_node0.sh`` and ``README.md`` beside the old
``plan.json`` and ``bundle.json``). Tested on a real, small tmpfs."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from cli import main
from tests.engine.fullfs import fill, small_tmpfs, snapshot

TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--gpu", "cpu"]
TINY += ["--gpus-per-node", "2", "--seq-len", "32", "--steps", "3"]


def _write(out: Path, batch: int) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["write", *TINY, "--global-batch", str(batch), "--out", str(out)])
    return code, err.getvalue()


def test_a_full_disk_midway_leaves_the_previous_bundle_byte_identical(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "small", "1m") as mnt:
        out = mnt / "bundle"
        assert _write(out, 4) == (0, "")
        before = snapshot(out)
        # Room for the first changed files (README.md, launch_node0.sh: a block each), not for
        # plan.json: a write file by file got that far.
        assert fill(mnt, leave_pages=2) > 0
        code, err = _write(out, 8)
        assert code == 2, err
        assert "Traceback" not in err and len(err.splitlines()) == 1, err
        assert f"--out: no space left on device writing {out}" in err
        assert "the previous bundle is unchanged" in err
        assert snapshot(out) == before
        assert sorted(p.name for p in mnt.iterdir()) == ["bundle", "filler"]  # no stage left
        # With room again the new bundle is written whole.
        (mnt / "filler").unlink()
        assert _write(out, 8) == (0, "")
        assert (out / "plan.json").read_bytes() != before["plan.json"][1]
        assert sorted(p.name for p in mnt.iterdir()) == ["bundle"]


def test_a_full_disk_on_a_first_write_leaves_no_directory(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "small", "1m") as mnt:
        fill(mnt, leave_pages=6)
        out = mnt / "bundle"
        code, err = _write(out, 4)
        assert code == 2 and len(err.splitlines()) == 1, err
        assert f"no space left on device writing {out}; nothing was written" in err
        assert sorted(p.name for p in mnt.iterdir()) == ["filler"]


def test_a_full_disk_under_force_backs_nothing_up(tmp_path: Path) -> None:
    # --force renames an edited file to NAME.bak-<time> only as part of the swap: a write that
    # fails leaves the edit where it was, under its own name.
    with small_tmpfs(tmp_path / "small", "1m") as mnt:
        out = mnt / "bundle"
        assert _write(out, 4) == (0, "")
        (out / "launch_node0.sh").write_text("#!/usr/bin/env bash\necho my edit\n")
        before = snapshot(out)
        fill(mnt, leave_pages=2)
        err = io.StringIO()
        argv = ["write", *TINY, "--global-batch", "8", "--out", str(out), "--force"]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main(argv)
        assert code == 2 and "the previous bundle is unchanged" in err.getvalue(), err.getvalue()
        assert snapshot(out) == before
        assert sorted(p.name for p in mnt.iterdir()) == ["bundle", "filler"]

"""Issue 15's journey in a real terminal: a Llama-3-70B plan on 4 x 8 H100 (forced 3D, so the
bundle carries Megatron-LM's files) → write → edit a file in $EDITOR (the app suspends, the
editor owns the terminal, the app comes back) → write again: the edit is listed before anything
happens and backed up, never lost. tmux runs the app at 120×40 (the helpers of
``test_tmux_wizard``)."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

from tests.e2e.test_tmux_wizard import (  # noqa: F401 - fixture, marker
    EXE,
    Tmux,
    exit_status,
    pytestmark,
    then_exit_status,
    tmux,
)

PROFILE = """\
schema_version = 2

[profile]
name = "seventy"
description = "Llama-3 70B on 4x8 H100, forced 3D"

[model]
preset = "llama-3-70b"

[hardware]
gpu = "h100-sxm"
gpus_per_node = 8
nodes = 4

[network]
tier = "ib-ndr"

[training]
seq_len = 4096
global_batch = 512

[layout]
strategy = "3d"
"""

EDITOR = '#!/bin/sh\necho "--log-interval 10  # edited by hand" >> "$1"\n'


def test_70b_plan_write_edit_in_editor_write_again(tmux: Tmux, tmp_path: Path) -> None:  # noqa: F811
    config = tmp_path / "cfg-dir"
    (config / "profiles").mkdir(parents=True)
    (config / "profiles" / "seventy.toml").write_text(PROFILE)
    editor = tmp_path / "editor.sh"
    editor.write_text(EDITOR)
    editor.chmod(editor.stat().st_mode | stat.S_IXUSR)
    done = tmp_path / "exit-code"
    tmux.start(
        then_exit_status(f"EDITOR={editor} {EXE} --config-dir {config} --profile seventy", done)
    )
    tmux.wait_for("profile seventy")  # the header names the profile
    tmux.wait_for("tok/s", timeout=90)  # the plan is ready
    tmux.keys("C-p")  # the command palette: straight to the configs step
    tmux.wait_for("Search for commands")
    tmux.keys("-l", "go to step 6")
    tmux.wait_for("Go to step 6: Configs")
    tmux.keys("Enter")
    tmux.wait_for("› 6 Configs")
    tmux.wait_for("pretrain_gpt.sh")
    tmux.keys("C-s")
    tmux.wait_for("✓ wrote")
    # A bundle directory no one chose is named after the set-up (dtrain-bundle-<model>-...).
    (bundle,) = tmp_path.glob("dtrain-bundle*")
    args = bundle / "megatron_args.txt"
    assert args.is_file() and (bundle / "pretrain_gpt.sh").is_file()
    # The file list has the focus, on its first file; the list is the bundle's files by name
    # (bundle.json records them): move down to megatron_args.txt (its preview names it).
    names = sorted(json.loads((bundle / "bundle.json").read_text())["files"])
    tmux.keys(*["Down"] * names.index("megatron_args.txt"))
    tmux.wait_for("megatron_args.txt · identical")
    tmux.keys("C-e")
    tmux.wait_for("✓ edited")
    edited = args.read_text()
    assert edited.endswith("# edited by hand\n")
    screen = tmux.wait_for("! megatron_args.txt")  # marked as the user's
    # Write again: the edit is listed first; nothing is touched until ^s again.
    tmux.keys("C-s")
    screen = tmux.wait_for("press ^s again")
    assert "back up megatron_args.txt" in screen.replace("\n", " ")
    assert args.read_text() == edited
    tmux.keys("C-s")
    deadline = time.monotonic() + 30
    while not list(bundle.glob("megatron_args.txt.bak-*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    tmux.wait_for("✓ wrote")  # the result (its line wraps where the path falls)
    backups = list(bundle.glob("megatron_args.txt.bak-*"))
    assert len(backups) == 1 and backups[0].read_text() == edited
    assert "edited by hand" not in args.read_text()
    tmux.keys("C-q")
    assert exit_status(done) == "0"

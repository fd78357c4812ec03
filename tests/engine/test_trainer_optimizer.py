"""The example trainer steps with the plan's optimizer (``training.optimizer``), whose states
the planner counted: SGD with momentum, AdamW, and 8-bit AdamW where bitsandbytes runs (a CUDA
GPU); elsewhere AdamW, said in a line. Run in a subprocess: train.py is a script (it masks
SIGUSR1 when loaded)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TRAIN = Path(__file__).resolve().parents[2] / "engine" / "trainer" / "train.py"
CHOICES = ("", "adamw", "sgd", "adam8bit")

PROBE = """
import contextlib, importlib.util, io, json, sys
import torch
spec = importlib.util.spec_from_file_location("dtrain_train", sys.argv[1])
train = importlib.util.module_from_spec(spec); spec.loader.exec_module(train)
out = {}
for bundle in sys.argv[2:]:
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        c = train.Config(train.parse_args(["--bundle", bundle, "--device", "cpu"]))
        opt = train.make_optimizer(torch.nn.Linear(4, 4).parameters(), c, torch.device("cpu"))
    out[bundle] = {"read": c.optimizer, "class": type(opt).__name__,
                   "momentum": opt.defaults.get("momentum"), "said": said.getvalue()}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    bundles = {}
    for choice in CHOICES:
        d = tmp_path_factory.mktemp(choice or "unset")
        training = {"seq_len": 8, "steps": 1} | ({"optimizer": choice} if choice else {})
        (d / "plan.json").write_text(json.dumps({"spec": {"training": training}}))
        bundles[choice] = str(d)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(TRAIN), *bundles.values()],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return {choice: got[path] for choice, path in bundles.items()}


@pytest.mark.parametrize(
    ("choice", "cls", "momentum"),
    [("", "AdamW", None), ("adamw", "AdamW", None), ("sgd", "SGD", 0.9)],
)
def test_the_trainer_steps_with_the_planned_optimizer(
    probed: dict[str, dict[str, Any]], choice: str, cls: str, momentum: float | None
) -> None:
    got = probed[choice]
    assert (got["read"], got["class"], got["momentum"]) == (choice or "adamw", cls, momentum)
    assert "note" not in got["said"]


def test_8bit_adam_without_bitsandbytes_on_a_gpu_says_what_it_runs(
    probed: dict[str, dict[str, Any]],
) -> None:
    got = probed["adam8bit"]
    assert got["class"] == "AdamW"  # on a CPU rank bitsandbytes' 8-bit AdamW cannot run
    assert "adam8bit needs bitsandbytes on a CUDA GPU" in got["said"] and "8 bytes" in got["said"]

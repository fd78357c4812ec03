"""The example trainer runs what the plan says, and says what it cannot: it steps with the
plan's optimizer (``training.optimizer``: SGD with momentum, AdamW, and 8-bit AdamW where
bitsandbytes runs, a CUDA GPU; elsewhere AdamW, said in a line), and a mixture-of-experts plan,
which it can only train as a dense model, is said in a line (a 3D plan's smoke-test note names
the experts too). One subprocess reads every bundle: train.py is a script (it masks SIGUSR1
when loaded)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TRAIN = Path(__file__).resolve().parents[2] / "engine" / "trainer" / "train.py"

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

DENSE = {"layers": 4, "hidden": 64, "heads": 4, "ffn": 128}
MOE = DENSE | {"num_experts": 8, "experts_per_token": 2}
BUNDLES: dict[str, tuple[dict[str, Any], dict[str, Any], str | None]] = {
    # name: (model, layout, training.optimizer)
    "unset": (DENSE, {"framework": "fsdp"}, None),
    "adamw": (DENSE, {"framework": "fsdp"}, "adamw"),
    "sgd": (DENSE, {"framework": "fsdp"}, "sgd"),
    "adam8bit": (DENSE, {"framework": "fsdp"}, "adam8bit"),
    "fsdp-moe": (MOE, {"framework": "fsdp", "ep": 4}, None),
    "megatron-moe": (MOE, {"framework": "megatron", "tp": 2}, None),
}


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    paths = {}
    for name, (model, layout, optimizer) in BUNDLES.items():
        d = tmp_path_factory.mktemp(name)
        training = {"seq_len": 8, "steps": 1} | ({"optimizer": optimizer} if optimizer else {})
        plan = {"model": model, "recommended": layout, "spec": {"training": training}}
        (d / "plan.json").write_text(json.dumps(plan))
        paths[name] = str(d)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(TRAIN), *paths.values()],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return {name: got[path] for name, path in paths.items()}


@pytest.mark.parametrize(
    ("name", "cls", "momentum"),
    [("unset", "AdamW", None), ("adamw", "AdamW", None), ("sgd", "SGD", 0.9)],
)
def test_the_trainer_steps_with_the_planned_optimizer(
    probed: dict[str, dict[str, Any]], name: str, cls: str, momentum: float | None
) -> None:
    got = probed[name]
    read = "adamw" if name == "unset" else name
    assert (got["read"], got["class"], got["momentum"]) == (read, cls, momentum)
    assert got["said"] == ""


def test_8bit_adam_without_bitsandbytes_on_a_gpu_says_what_it_runs(
    probed: dict[str, dict[str, Any]],
) -> None:
    got = probed["adam8bit"]
    assert got["class"] == "AdamW"  # on a CPU rank bitsandbytes' 8-bit AdamW cannot run
    assert "adam8bit needs bitsandbytes on a CUDA GPU" in got["said"] and "8 bytes" in got["said"]


def test_a_mixture_of_experts_plan_run_dense_is_said(probed: dict[str, dict[str, Any]]) -> None:
    fsdp = probed["fsdp-moe"]["said"]
    assert "has no experts" in fsdp and "8 experts, top-2, ep=4" in fsdp
    megatron = probed["megatron-moe"]["said"]
    assert "no TP/PP or experts" in megatron
    assert megatron.count("note:") == 1  # one note for the smoke test, not two

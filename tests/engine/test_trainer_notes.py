"""What the example trainer cannot run of a plan, it says: a mixture-of-experts plan trains here
as a dense model with one expert-sized MLP a block, and a 3D plan as a two-block data-parallel
smoke test. Run in a subprocess: train.py is a script (it masks SIGUSR1 when loaded)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[2] / "engine" / "trainer" / "train.py"

PROBE = """
import contextlib, importlib.util, io, json, sys
spec = importlib.util.spec_from_file_location("dtrain_train", sys.argv[1])
train = importlib.util.module_from_spec(spec); spec.loader.exec_module(train)
out = {}
for bundle in sys.argv[2:]:
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        train.Config(train.parse_args(["--bundle", bundle, "--device", "cpu"]))
    out[bundle] = said.getvalue()
print(json.dumps(out))
"""

MOE = {"layers": 4, "hidden": 64, "heads": 4, "ffn": 128, "num_experts": 8, "experts_per_token": 2}


def test_what_the_trainer_cannot_run_it_says(tmp_path: Path) -> None:
    cases = {
        "fsdp-moe": (MOE, {"framework": "fsdp", "ep": 4}),
        "megatron-moe": (MOE, {"framework": "megatron", "tp": 2}),
        "fsdp-dense": ({k: v for k, v in MOE.items() if "expert" not in k}, {"framework": "fsdp"}),
    }
    bundles = {}
    for name, (model, layout) in cases.items():
        d = tmp_path / name
        d.mkdir()
        plan = {"model": model, "recommended": layout, "spec": {"training": {"seq_len": 8}}}
        (d / "plan.json").write_text(json.dumps(plan))
        bundles[name] = str(d)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(TRAIN), *bundles.values()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    said = {n: json.loads(out.stdout.strip().splitlines()[-1])[b] for n, b in bundles.items()}
    assert "has no experts" in said["fsdp-moe"] and "8 experts, top-2, ep=4" in said["fsdp-moe"]
    assert "no TP/PP or experts" in said["megatron-moe"]
    assert said["megatron-moe"].count("note:") == 1  # one note for the smoke test, not two
    assert said["fsdp-dense"] == ""

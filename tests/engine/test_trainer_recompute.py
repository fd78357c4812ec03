"""The example trainer honours the plan's partial recompute (layout ``recompute = "mlp"``): each
block's MLP runs its forward again in backward, and the gradients are those of no recompute.
Run in a subprocess: train.py is a script (it masks SIGUSR1 when loaded)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[2] / "engine" / "trainer" / "train.py"

PROBE = """
import importlib.util, json, sys, types
import torch
spec = importlib.util.spec_from_file_location("dtrain_train", sys.argv[1])
train = importlib.util.module_from_spec(spec); spec.loader.exec_module(train)

def run(mode, recompute_layers=0):
    c = types.SimpleNamespace(hidden=32, heads=4, kv_heads=2, head_dim=8, ffn=64, gated=True, recompute=mode,
                              vocab=50, seq_len=8, layers=2, tie=False,
                              recompute_layers=recompute_layers)
    torch.manual_seed(0)
    model = train.GPT(c)
    calls = [0]
    for blk in model.blocks:
        blk.up.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    x = torch.randint(0, 50, (2, 8))
    model(x).float().pow(2).mean().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return calls[0], grads

n_none, g_none = run("none")
n_mlp, g_mlp = run("mlp")
n_full, g_full = run("full")
n_block, g_block = run("full", 1)
same = all(torch.allclose(g_none, g, atol=1e-6) for g in (g_mlp, g_full, g_block))
print(json.dumps({"none": n_none, "mlp": n_mlp, "full": n_full, "block": n_block, "same": same}))
"""


def test_mlp_recompute_reruns_each_mlp_forward_and_keeps_the_gradients() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(TRAIN)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["none"] == 2  # one MLP forward per block
    assert got["mlp"] == 4  # and once more in backward
    assert got["full"] == 4  # every block's forward again
    assert got["block"] == 3  # block recompute of the first layer only (Megatron's block method)
    assert got["same"]

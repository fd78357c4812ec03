"""The example trainer honours the plan's partial recompute (layout ``recompute = "mlp"``): each
block's MLP runs its forward again in backward, and the gradients are those of no recompute; a
light recompute (``"light"``) runs the norms again but no matrix product. Run in a subprocess:
train.py is a script (it masks SIGUSR1 when loaded)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

TRAIN = Path(__file__).resolve().parents[2] / "engine" / "trainer" / "train.py"

PROBE = """
import importlib.util, json, sys, types
import torch
spec = importlib.util.spec_from_file_location("dtrain_train", sys.argv[1])
train = importlib.util.module_from_spec(spec); spec.loader.exec_module(train)

def cfg(mode, recompute_layers=0):
    return types.SimpleNamespace(hidden=32, heads=4, kv_heads=2, head_dim=8, ffn=64, gated=True,
                                 recompute=mode, vocab=50, seq_len=8, layers=2, tie=False,
                                 recompute_layers=recompute_layers, cp=1, cp_group=None,
                                 cp_rank=0)

def run(mode, recompute_layers=0):
    torch.manual_seed(0)
    model = train.GPT(cfg(mode, recompute_layers))
    calls = [0]
    for blk in model.blocks:
        blk.up.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    x = torch.randint(0, 50, (2, 8))
    model(x).float().pow(2).mean().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return calls[0], grads

from torch.utils._python_dispatch import TorchDispatchMode

class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__(); self.ops = {}
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops[name] = self.ops.get(name, 0) + 1
        return func(*args, **(kwargs or {}))

def backward_ops(mode):
    torch.manual_seed(0)
    model = train.GPT(cfg(mode))
    loss = model(torch.randint(0, 50, (2, 8))).float().pow(2).mean()
    with Count() as n:
        loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return n.ops, grads

ops_none, gl_none = backward_ops("none")
ops_light, gl_light = backward_ops("light")
light = {
    "norms_redone": ops_light.get("native_layer_norm", 0) - ops_none.get("native_layer_norm", 0),
    "mm_redone": ops_light.get("mm", 0) - ops_none.get("mm", 0),
    "same": torch.allclose(gl_none, gl_light, atol=1e-6),
}

n_none, g_none = run("none")
n_mlp, g_mlp = run("mlp")
n_full, g_full = run("full")
n_block, g_block = run("full", 1)
same = all(torch.allclose(g_none, g, atol=1e-6) for g in (g_mlp, g_full, g_block))
print(json.dumps({"none": n_none, "mlp": n_mlp, "full": n_full, "block": n_block, "same": same,
                  "light": light}))
"""


@functools.cache
def _probe() -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(TRAIN)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def test_mlp_recompute_reruns_each_mlp_forward_and_keeps_the_gradients() -> None:
    got = _probe()
    assert got["none"] == 2  # one MLP forward per block
    assert got["mlp"] == 4  # and once more in backward
    assert got["full"] == 4  # every block's forward again
    assert got["block"] == 3  # block recompute of the first layer only (Megatron's block method)
    assert got["same"]


def test_light_recompute_reruns_the_norms_not_the_matrix_products() -> None:
    light = _probe()["light"]
    assert light["norms_redone"] == 4  # two norms a block, two blocks, run again in backward
    assert light["mm_redone"] == 0  # no linear layer runs its forward again
    assert light["same"]

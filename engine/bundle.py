"""The run bundle's manifest, ``bundle.json``: the contract between the config writers (which
write a bundle directory) and the launch backends (which start one).

A bundle directory holds, besides ``bundle.json``: ``plan.json``; ``launch_node{i}.sh`` for each
node i (run from the bundle directory, it sources ``nccl.env`` and starts torchrun with ``--tee 3``
so each line carries torchrun's ``[default{local_rank}]:`` prefix; global rank =
node_rank * gpus_per_node + local_rank); ``nccl.env``; ``hostfile``; ``sky.yaml``; the training
script (``train.py``, the example trainer, unless the user names their own); and, depending on the
plan, ``ds_config.json``, ``fsdp.json`` + ``accelerate_config.yaml``, ``megatron_args.txt``;
and a ``README.md``.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.errors import DtrainError

MANIFEST = "bundle.json"
BUNDLE_VERSION = 1


class BundleManifest(BaseModel):
    """What a launch backend needs to know about a written bundle."""

    model_config = ConfigDict(extra="forbid")

    version: int = BUNDLE_VERSION
    name: str
    """Run name (used for run directories and SkyPilot clusters)."""
    framework: str
    """ddp | deepspeed | fsdp | megatron."""
    launcher: str = "torchrun"
    """torchrun | deepspeed: how the node scripts start ranks."""
    dist_backend: str
    """gloo | nccl."""
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    hosts: list[str] = Field(default_factory=list)
    """``[user@]host[:port]`` per node in node-rank order (may be empty for local runs)."""
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    node_scripts: list[str]
    """``launch_node{i}.sh`` per node, relative to the bundle directory."""
    script: str
    """Training script path relative to the bundle (or absolute for a user's own script)."""
    script_args: list[str] = Field(default_factory=list)
    files: dict[str, str] = Field(default_factory=dict)
    """File name -> sha256 of the content dtrain-tui wrote; a file whose hash differs on disk
    was edited by the user and is never overwritten silently."""
    sky_yaml: str | None = "sky.yaml"
    backend: str = "local"
    """The launch backend the bundle was written for (local | ssh | skypilot)."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def read_manifest(bundle_dir: Path) -> BundleManifest:
    """Read ``bundle_dir/bundle.json``; errors say which file and what is wrong."""
    path = Path(bundle_dir) / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DtrainError(
            f"{bundle_dir} is not a bundle (no {MANIFEST}); write one with `dtrain-tui write --out DIR`",
            field="bundle",
        ) from None
    except (OSError, json.JSONDecodeError) as e:
        raise DtrainError(f"{path}: cannot read: {e}", field="bundle") from None
    try:
        return BundleManifest.model_validate(data)
    except ValidationError as e:
        from engine.errors import one_line

        raise DtrainError(f"{path}: {one_line(e)}", field="bundle") from None

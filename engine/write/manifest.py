"""The run bundle's manifest, ``bundle.json``: the contract between the config writers (which
write a bundle directory) and the launch backends (which start one).

A bundle directory holds, besides ``bundle.json``: ``plan.json``; ``launch_node{i}.sh`` for each
node i (run from the bundle directory, it sources ``nccl.env`` and starts torchrun with ``--tee 3``
so each line carries torchrun's ``[default{local_rank}]:`` prefix; global rank =
node_rank * gpus_per_node + local_rank); ``nccl.env``; ``hostfile``; ``sky.yaml``; the training
script (``train.py``, the example trainer, unless the user names their own); and, depending on the
plan, ``ds_config.json``, ``fsdp.json`` + ``accelerate_config.yaml``, ``megatron_args.txt`` +
``pretrain_gpt.sh`` (the Megatron-LM command); and a ``README.md``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from engine.errors import DtrainError, one_line
from engine.fsio import JSON_LIMIT, read_regular_text
from engine.plan.names import Backend, Framework

MANIFEST = "bundle.json"
BUNDLE_VERSION = 1

# Bounds on what a file read back may claim (bundle.json, run.json): far past any real cluster,
# and small enough that a launcher or a monitor sized from them stays small.
MAX_NODES = 16_384
MAX_GPUS_PER_NODE = 1_024
MAX_RANKS = 65_536
MAX_FILES = 4_096
"""Entries in a manifest's ``files``: a bundle has about a dozen."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def plain_name(name: str) -> str:
    """``name`` when it is a plain file name inside the bundle directory (no directory part,
    not ``.`` or ``..``, no control character); else ValueError. A manifest read back from disk
    names the files dtrain-tui may replace or delete: never anything outside the bundle."""
    if (
        not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or _CONTROL.search(name)
        or len(name) > 255
    ):
        raise ValueError(f"{name!r} is not a plain file name inside the bundle directory")
    return name


class BundleManifest(BaseModel):
    """What a launch backend needs to know about a written bundle."""

    model_config = ConfigDict(extra="forbid")

    version: int = BUNDLE_VERSION
    name: str
    """Run name (used for run directories and SkyPilot clusters)."""
    framework: Framework
    """ddp | deepspeed | fsdp | megatron (a StrEnum: it compares equal to those strings)."""
    launcher: str = "torchrun"
    """torchrun | deepspeed: how the node scripts start ranks."""
    dist_backend: str
    """gloo | nccl."""
    nodes: int = Field(ge=1, le=MAX_NODES)
    gpus_per_node: int = Field(ge=1, le=MAX_GPUS_PER_NODE)
    hosts: list[str] = Field(default_factory=list, max_length=MAX_NODES)
    """``[user@]host[:port]`` per node in node-rank order (may be empty for local runs)."""
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    node_scripts: list[str] = Field(max_length=MAX_NODES)
    """``launch_node{i}.sh`` per node, relative to the bundle directory."""
    script: str
    """Training script path relative to the bundle (or absolute for a user's own script)."""
    script_args: list[str] = Field(default_factory=list)
    files: dict[str, str] = Field(default_factory=dict, max_length=MAX_FILES)
    """File name -> sha256 of the content dtrain-tui wrote; a file whose hash differs on disk
    was edited by the user and is never overwritten silently."""
    sky_yaml: str | None = "sky.yaml"
    backend: Backend = Backend.LOCAL
    """The launch backend the bundle was written for (local | ssh | skypilot)."""

    @field_validator("node_scripts", "files")
    @classmethod
    def _plain_names(cls, value: list[str] | dict[str, str]) -> list[str] | dict[str, str]:
        for name in value:
            plain_name(name)
        return value

    @field_validator("sky_yaml")
    @classmethod
    def _plain_sky_yaml(cls, value: str | None) -> str | None:
        return None if value is None else plain_name(value)

    @model_validator(mode="after")
    def _bounded_world(self) -> BundleManifest:
        if self.world_size > MAX_RANKS:
            raise ValueError(
                f"world_size: nodes × gpus_per_node = {self.nodes} × {self.gpus_per_node} "
                f"= {self.world_size} is more than {MAX_RANKS} ranks"
            )
        return self

    @model_validator(mode="after")
    def _a_script_per_node(self) -> BundleManifest:
        # Every backend starts node i with node_scripts[i]: one short is node i never started
        # (an IndexError once the others run), one too many a script never run.
        if len(self.node_scripts) != self.nodes:
            raise ValueError(
                f"node_scripts: {len(self.node_scripts)} given for a {self.nodes}-node bundle; "
                f"it needs one launch_node<i>.sh per node (rewrite it with `dtrain-tui write`)"
            )
        return self

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def read_manifest(bundle_dir: Path) -> BundleManifest:
    """Read ``bundle_dir/bundle.json``; errors say which file and what is wrong."""
    path = Path(bundle_dir) / MANIFEST
    try:
        data = json.loads(read_regular_text(path, JSON_LIMIT, label=str(path)))
    except DtrainError as e:  # a symlink, device, FIFO, or too big
        raise DtrainError(e.message, field="bundle") from None
    except FileNotFoundError:
        raise DtrainError(
            f"{bundle_dir} is not a bundle (no {MANIFEST}); write one with `dtrain-tui write --out DIR`",
            field="bundle",
        ) from None
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DtrainError(f"{path}: cannot read: {e}", field="bundle") from None
    except RecursionError:
        raise DtrainError(f"{path}: cannot read: nested too deeply", field="bundle") from None
    try:
        return BundleManifest.model_validate(data)
    except ValidationError as e:
        raise DtrainError(f"{path}: {one_line(e)}", field="bundle") from None

"""Config writers: pure functions from a :class:`~engine.plan.Plan` to the text of each file a
run needs (one module per file kind), and :func:`write_bundle`, the separate atomic step that
puts a bundle on disk without ever destroying a file the user changed.

Called by ``dtrain-tui write``, the wizard's write step and the launch command.
"""

from __future__ import annotations

from engine.writers.bundle import (
    BundleFile,
    WriteOptions,
    WriteReport,
    example_trainer_text,
    manifest_for,
    render_bundle,
    write_bundle,
)
from engine.writers.ds_config import Scheduler, ds_config, ds_config_dict
from engine.writers.fsdp import accelerate_config, fsdp_settings, fsdp_settings_dict
from engine.writers.hostfile import hostfile
from engine.writers.launch_scripts import node_script, node_scripts, torchrun_argv
from engine.writers.megatron import megatron_args
from engine.writers.nccl_env import nccl_env
from engine.writers.plan_json import plan_json
from engine.writers.sky import sky_yaml

__all__ = [
    "BundleFile",
    "Scheduler",
    "WriteOptions",
    "WriteReport",
    "accelerate_config",
    "ds_config",
    "ds_config_dict",
    "example_trainer_text",
    "fsdp_settings",
    "fsdp_settings_dict",
    "hostfile",
    "manifest_for",
    "megatron_args",
    "nccl_env",
    "node_script",
    "node_scripts",
    "plan_json",
    "render_bundle",
    "sky_yaml",
    "torchrun_argv",
    "write_bundle",
]

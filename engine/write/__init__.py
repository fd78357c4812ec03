"""Config writers: pure functions from a :class:`~engine.plan.result.Plan` to the text of each file a
run needs (one module per file kind), and :func:`write_bundle`, the separate atomic step that
puts a bundle on disk without ever destroying a file the user changed.

Called by ``dtrain-tui write``, the wizard's write step and the launch command.
"""

from __future__ import annotations

from engine.write.bundle import (
    BundleFile,
    WriteOptions,
    WriteReport,
    example_trainer_text,
    manifest_for,
    render_bundle,
    write_bundle,
)
from engine.write.ds_config import Scheduler, ds_config, ds_config_dict
from engine.write.fsdp import accelerate_config, fsdp_settings, fsdp_settings_dict
from engine.write.hostfile import hostfile
from engine.write.launch_scripts import node_script, node_scripts, torchrun_argv
from engine.write.megatron import megatron_args
from engine.write.nccl_env import nccl_env
from engine.write.plan_json import plan_json
from engine.write.sky import sky_yaml

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

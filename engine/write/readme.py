"""The bundle's ``README.md``: what each file is and how to start the run by hand."""

from __future__ import annotations

from collections.abc import Iterable

from engine.plan.names import Framework
from engine.plan.result import Plan
from engine.write.learning_rate import lr_advice_lines
from engine.write.naming import natural_key, run_name
from engine.write.quoting import comment_text
from engine.write.summary import effective_batch_lines, plan_summary

_WHAT = {
    "plan.json": "the plan (`dtrain-tui plan --json` schema) plus the trainer's `training` settings",
    "bundle.json": "manifest for `dtrain-tui launch`: nodes, hosts, scripts, sha256 of every file",
    "nccl.env": "NCCL / torch.distributed environment, one reason per variable",
    "hostfile": "DeepSpeed-format host list (`host slots=N`)",
    "sky.yaml": "SkyPilot task: `sky launch -c NAME sky.yaml` from this directory",
    "slurm.sbatch": "Slurm batch script: `sbatch slurm.sbatch` from this directory",
    "ds_config.json": "DeepSpeed config (ZeRO, precision, batch, optimizer)",
    "fsdp.json": "FSDP settings the training script reads (FSDP2 with FSDP1 equivalents)",
    "accelerate_config.yaml": "`accelerate launch --config_file accelerate_config.yaml script.py`",
    "megatron_args.txt": "Megatron-LM arguments for the 3D layout",
    "pretrain_gpt.sh": "the real Megatron-LM run of the 3D layout: "
    "`MEGATRON_LM=/path/to/Megatron-LM NODE_RANK=i ./pretrain_gpt.sh` on node i "
    "(`dtrain-tui launch` starts the example trainer instead: a smoke test)",
    "train.py": "the example trainer (a small GPT on generated tokens; torch only)",
    "preflight.py": "the preflight (`dtrain-tui preflight .`: all-reduce busbw, node pairs, GEMM "
    "per GPU); node scripts run it instead of the training script when DTRAIN_PREFLIGHT=1",
    "dtrain_agent.py": "the rank agent: every rank runs its script through it (`torchrun ... "
    "dtrain_agent.py SCRIPT ARGS`), unchanged; it answers the launcher's stuck-rank request "
    "and prints CPU/GPU telemetry every DTRAIN_TELEMETRY_S seconds (default 5, 0: off)",
}


def bundle_readme(plan: Plan, files: Iterable[str]) -> str:
    """README.md text for a bundle holding ``files``."""
    name = run_name(plan)
    lines = [
        f"# Run bundle `{name}`",
        "",
        "Written by dtrain-tui. " + plan_summary(plan) + ".",
        "",
        *effective_batch_lines(plan),
        "",
        *lr_advice_lines(plan),
        "",
    ]
    lines.extend(f"> warning: {comment_text(w)}" for w in plan.warnings)
    if plan.warnings:
        lines.append("")
    lines += ["## Files", ""]
    for f in sorted(files, key=natural_key):
        what = _WHAT.get(f)
        if what is None and f.startswith("launch_node"):
            node = f.removeprefix("launch_node").removesuffix(".sh")
            what = f"starts node {node}'s {plan.gpus_per_node} ranks with torchrun"
        lines.append(f"- `{f}`: {what or 'written by dtrain-tui'}")
    lines += ["", "## Start it", ""]
    lines.append("With dtrain-tui, from this directory: `dtrain-tui launch .`")
    lines.append("")
    if plan.nodes == 1:
        lines += [
            "By hand, on the machine:",
            "",
            "```sh",
            "MASTER_PORT=29500 ./launch_node0.sh",
            "```",
        ]
    else:
        lines += [
            "By hand: copy this directory to every node, then on node i run its script",
            "(node 0 first is not required; all must start within the rendezvous timeout):",
            "",
            "```sh",
            *(f"./launch_node{i}.sh    # on node {i}" for i in range(plan.nodes)),
            "```",
        ]
    lines += [
        "",
        "`MASTER_ADDR`, `MASTER_PORT` and `TORCHRUN` in the environment override the written values.",
        "Each rank's output carries torchrun's `[default<local_rank>]:` prefix; torchrun also keeps",
        "per-rank files under `logs/`.",
    ]
    fw = plan.recommended.framework
    if fw == Framework.DEEPSPEED:
        lines += [
            "",
            "DeepSpeed runs under torchrun here (DeepSpeed reads torchrun's environment). The",
            "equivalent with DeepSpeed's own launcher, from node 0:",
            "`deepspeed --hostfile hostfile --master_port 29500 train.py --bundle .`",
        ]
    if fw == Framework.MEGATRON:
        lines += [
            "",
            "`megatron_args.txt` is for Megatron-LM's `pretrain_gpt.py` (pass it with `--script`);",
            "the example trainer runs this plan's data-parallel part only, as a smoke test.",
        ]
    lines += checkpoint_lines(plan)
    script = plan.spec.launch.script
    if script is not None and not script.startswith(("/", "~")):
        lines += [
            "",
            f"The training script `{comment_text(script)}` is a relative path: node scripts run from this",
            "directory, so copy the script here (or write the bundle with an absolute `--script`).",
        ]
    if plan.spec.launch.remote_setup:
        lines += [
            "",
            "`remote_setup` from the spec runs before launch on every node as a shell command,",
            "verbatim (it is the `setup` of sky.yaml).",
        ]
    return "\n".join(lines) + "\n"


def checkpoint_lines(plan: Plan) -> list[str]:
    """The README's "Checkpoints" section: where the run saves and how often (plan.json's
    checkpoint section, the plan's interval), the variables every rank's script gets, and the
    arguments the common trainers take for them."""
    from engine.write.plan_json import checkpoint_section

    section = checkpoint_section(plan)
    every = int(section["every"])
    res = plan.resilience
    why = ""
    if res is not None and plan.spec.training.ckpt_every is None and every:
        why = (
            f" (the plan's interval that loses the least work: one save about "
            f"{res.save_s:.3g} s, an interruption every {res.mtbf_s / 3600:.3g} h expected)"
        )
    where = comment_text(str(section["dir"]))
    said = (
        f"The run saves to `{where}` every {every} steps{why}; `--ckpt-dir` and `--ckpt-every` "
        "when writing the bundle change them."
        if every
        else f"The run saves no checkpoints: write the bundle with `--ckpt-every N` (several "
        f"nodes: and a `--ckpt-dir` every node reaches) to save to `{where}`."
    )
    lines = [
        "",
        "## Checkpoints",
        "",
        said,
        "Every rank's script gets:",
        "",
        "- `DTRAIN_CKPT_DIR`: where to save (an absolute path)",
        "- `DTRAIN_CKPT_EVERY`: save every N steps (0: never)",
        "- `DTRAIN_RESUME`: `auto` (resume from the newest complete checkpoint in the "
        "directory), `never`, or a checkpoint's path",
        "",
        "Set before starting a node script, each of them wins over the written value.",
        "The example trainer reads them itself. A script of your own passes them on:",
        "",
        '- Hugging Face Trainer: `--output_dir "$DTRAIN_CKPT_DIR" --save_steps '
        '"$DTRAIN_CKPT_EVERY" --resume_from_checkpoint "$DTRAIN_CKPT_DIR/<newest '
        'checkpoint-N>"` (or `trainer.train(resume_from_checkpoint=True)`, which finds the '
        "newest under `output_dir`)",
        '- Megatron-LM: `--save "$DTRAIN_CKPT_DIR" --load "$DTRAIN_CKPT_DIR" '
        '--save-interval "$DTRAIN_CKPT_EVERY"` (`pretrain_gpt.sh` passes them)',
        "- torchtitan: its `[checkpoint]` section, `enable_checkpoint = true`, `folder` = "
        "`$DTRAIN_CKPT_DIR`, `interval` = `$DTRAIN_CKPT_EVERY` (or `--checkpoint.folder` and "
        "`--checkpoint.interval` on its command line); it resumes from the newest step itself",
        "",
        "A plain PyTorch script, with `torch.distributed.checkpoint` (sharded; loads into "
        "another world size):",
        "",
        "```python",
        "import os, torch.distributed.checkpoint as dcp",
        'ckpt, every = os.environ["DTRAIN_CKPT_DIR"], int(os.environ["DTRAIN_CKPT_EVERY"])',
        'state = {"model": model.state_dict(), "optim": optim.state_dict()}',
        'if os.environ.get("DTRAIN_RESUME", "auto") != "never" and os.path.isdir(ckpt):',
        "    ...  # dcp.load(state, checkpoint_id=<newest complete step dir>), then load_state_dict",
        "if every and step % every == 0:",
        '    dcp.save(state, checkpoint_id=f"{ckpt}/step{step:08d}")',
        "```",
    ]
    return lines

"""The training script a bundle runs, as its node scripts name it: the shipped example trainer
(``train.py``) or the user's own, and the arguments after it.

Every value is refused if a script cannot carry it on one line; callers quote it with
:func:`engine.write.quoting.shell_word` where they write it.
"""

from __future__ import annotations

from engine.errors import DtrainError
from engine.plan.result import Plan
from engine.write.quoting import shell_line


def uses_example_trainer(plan: Plan) -> bool:
    """True when the bundle ships the example trainer as ``train.py``."""
    return plan.spec.launch.script is None


def script_path(plan: Plan) -> str:
    """The training script as node scripts name it (relative to the bundle, or the user's path)."""
    script = plan.spec.launch.script
    if script is None:
        return "train.py"
    if script.startswith("-"):
        # torchrun's parser would take it for one of its own options (--rdzv-endpoint=...).
        raise DtrainError(
            f"{script!r} starts with '-', so torchrun would read it as one of its own options; "
            f"name the script by a path (./{script})",
            field="launch.script",
        )
    return shell_line(script, "launch.script")


def script_args(plan: Plan) -> list[str]:
    """The arguments after the training script."""
    args = [shell_line(a, "launch.script_args") for a in plan.spec.launch.script_args]
    if uses_example_trainer(plan):
        return ["--bundle", ".", *args]
    return args

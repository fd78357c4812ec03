"""``hostfile`` in DeepSpeed's format: one ``host slots=N`` line per node, node 0 first
(``deepspeed --hostfile hostfile`` and pdsh/OpenMPI-style launchers read it)."""

from __future__ import annotations

from engine.plan.result import Plan
from engine.write.nodes import hosts
from engine.write.quoting import plain_word


def hostfile(plan: Plan) -> str:
    """``hostfile`` text. Without hosts: ``localhost`` for one node, ``node<i>`` placeholders
    (to replace) for several."""
    parsed = hosts(plan)
    slots = plan.gpus_per_node
    lines = [
        "# DeepSpeed hostfile written by dtrain-tui: <host> slots=<GPUs per node>, node 0 first."
    ]
    if parsed:
        names = [f"{h.user}@{h.host}" if h.user else h.host for h in parsed]
        if any(h.port for h in parsed):
            lines.append("# SSH ports are not part of this format: put them in ~/.ssh/config.")
        if len(set(names)) != len(names):
            lines.append(
                "# Some nodes share a name (same host, other SSH port): DeepSpeed's launcher needs "
                "distinct names; give each an alias in ~/.ssh/config. torchrun scripts are unaffected."
            )
    elif plan.nodes == 1:
        names = ["localhost"]
    else:
        names = [f"node{i}" for i in range(plan.nodes)]
        lines.append("# No hosts in the spec: replace node0..nodeN with your machines' names.")
    lines.extend(f"{plain_word(name, 'launch.hosts')} slots={slots}" for name in names)
    return "\n".join(lines) + "\n"

"""Where a plan's nodes run and meet: the host of each node and the rendezvous address, read
from the spec's ``launch`` section and checked against the plan's node count.

Used by the node scripts, the hostfile, the framework configs and the bundle manifest.
"""

from __future__ import annotations

from engine.errors import DtrainError
from engine.plan.result import Plan
from engine.plan.specs import Host
from engine.write.checks import check_addr


def master_addr(plan: Plan) -> str | None:
    """The rendezvous address: the spec's, else the first host, else 127.0.0.1 for one node.
    None for a multi-node plan with no hosts (SkyPilot fills it in at run time)."""
    spec = plan.spec.launch
    if spec.master_addr:
        return check_addr(spec.master_addr, "launch.master_addr")
    hosts = spec.parsed_hosts()
    if hosts:
        return hosts[0].host.strip("[]") if plan.nodes > 1 else "127.0.0.1"
    return "127.0.0.1" if plan.nodes == 1 else None


def hosts(plan: Plan) -> list[Host]:
    """One host per node, checked against the plan's node count."""
    parsed = plan.spec.launch.parsed_hosts()
    if parsed and len(parsed) != plan.nodes:
        raise DtrainError(
            f"{len(parsed)} hosts given for a {plan.nodes}-node plan; "
            f"pass exactly {plan.nodes} (one per node, node 0 first)",
            field="launch.hosts",
        )
    return parsed

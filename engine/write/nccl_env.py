"""``nccl.env``: the NCCL / torch.distributed environment the plan calls for, one ``KEY=value``
per setting with a one-line reason above it. Node scripts source it with ``set -a``; every line
is :func:`engine.write.quoting.env_line`: the name checked whole, the value shell-quoted, so a
user's ``launch.env`` value such as ``$(id)`` stays literal text and a name such as ``"reboot\n"``
is refused. The file carries launch.env values (tokens): the bundle writes it owner-only.

Fabric choices: InfiniBand and RoCE use NCCL's IB verbs transport (RoCE v2 needs the GID index);
AWS EFA goes through libfabric (the aws-ofi-nccl plugin); plain TCP disables IB probing and
spreads traffic over several sockets; CPU plans talk gloo and need none of the NCCL knobs.
"""

from __future__ import annotations

from engine.plan.names import NetworkTier
from engine.plan.result import Plan
from engine.plan.specs import LaunchSpec, NetworkSpec
from engine.write.quoting import env_line

Entry = tuple[str, str, str]
"""(name, value, one-line reason)."""


def nccl_env_entries(plan: Plan) -> list[Entry]:
    """The variables, in file order."""
    gloo = plan.gpu.dist_backend == "gloo"
    multi = plan.nodes > 1
    out = _every_run()
    if not gloo:
        out += _nccl_watchdog(plan.spec.launch)
    out += _sockets(plan.spec.network, multi=multi, gloo=gloo)
    if multi and not gloo:
        out += _fabric(plan)
    return out


def _every_run() -> list[Entry]:
    """What every rank gets, gloo or NCCL."""
    return [
        # torchrun defaults it to 1 with a warning; say so explicitly (raise it for data loaders).
        ("OMP_NUM_THREADS", "1", "one OpenMP thread per rank, so ranks do not oversubscribe cores"),
        # The Flight Recorder: every rank keeps its last collectives, so a hang can be diagnosed
        # (which rank never entered which collective). Gloo records too.
        (
            "TORCH_FR_BUFFER_SIZE",
            "2000",
            "Flight Recorder: keep each rank's last 2000 collectives to name a stuck rank",
        ),
    ]


def _nccl_watchdog(launch: LaunchSpec) -> list[Entry]:
    """NCCL's logging, and what turns a failed or hung collective into a dump and an exit."""
    out: list[Entry] = [
        (
            "NCCL_DEBUG",
            launch.nccl_debug or "WARN",
            "NCCL log level (INFO prints the chosen transport per ring)",
        )
    ]
    if launch.nccl_debug_subsys:
        out.append(
            ("NCCL_DEBUG_SUBSYS", launch.nccl_debug_subsys, "limit NCCL logs to these subsystems")
        )
    out += [
        (
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            "1",
            "a failed or timed-out collective aborts the process instead of hanging every rank",
        ),
        (
            "TORCH_NCCL_DUMP_ON_TIMEOUT",
            "1",
            "on a collective timeout, dump the flight recorder so the stuck rank can be found",
        ),
        (
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
            "logs/nccl_trace_rank_",
            "where those dumps go: one file per rank in the bundle's logs/",
        ),
        (
            "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
            f"{max(60, round(launch.hang_timeout_s))}",
            "kill a rank whose NCCL watchdog stalls this long (launch.hang_timeout_s)",
        ),
    ]
    return out


def _sockets(net: NetworkSpec, *, multi: bool, gloo: bool) -> list[Entry]:
    """The interfaces NCCL and gloo use: the one named, else (TCP between nodes) any but
    loopback and docker bridges."""
    out: list[Entry] = []
    if net.socket_ifname:
        if not gloo:
            out.append(
                (
                    "NCCL_SOCKET_IFNAME",
                    net.socket_ifname,
                    "interface NCCL bootstraps (and TCP-transfers) over",
                )
            )
        out.append(
            ("GLOO_SOCKET_IFNAME", net.socket_ifname, "interface gloo (and torch's store) uses")
        )
    elif multi and not gloo and net.tier == NetworkTier.TCP:
        out.append(
            (
                "NCCL_SOCKET_IFNAME",
                "^lo,docker",
                "never route inter-node traffic over loopback or docker bridges",
            )
        )
    return out


def _fabric(plan: Plan) -> list[Entry]:
    net = plan.spec.network
    tier = net.tier
    out: list[Entry] = []
    if tier in (NetworkTier.IB, NetworkTier.IB_HDR, NetworkTier.IB_NDR, NetworkTier.ROCE):
        out.append(("NCCL_IB_DISABLE", "0", "use the InfiniBand verbs transport between nodes"))
        if net.ib_hca:
            out.append(("NCCL_IB_HCA", net.ib_hca, "the HCAs (ports) NCCL may use"))
        out.append(
            (
                "NCCL_IB_TIMEOUT",
                "22",
                "IB retransmit timeout 4.096us x 2^22 (~17 s): rides out congestion on big fabrics",
            )
        )
        out.append(
            (
                "NCCL_NET_GDR_LEVEL",
                "PHB",
                "GPUDirect RDMA when GPU and NIC share a PCIe host bridge (NIC reads GPU memory)",
            )
        )
        if tier == NetworkTier.ROCE:
            out.append(
                (
                    "NCCL_IB_GID_INDEX",
                    "3",
                    "RoCE v2 GID (index 3 on most Mellanox set-ups; check `show_gids`)",
                )
            )
    elif tier == NetworkTier.EFA:
        out.append(
            ("FI_PROVIDER", "efa", "libfabric provider: AWS EFA (needs the aws-ofi-nccl plugin)")
        )
        out.append(("FI_EFA_USE_DEVICE_RDMA", "1", "GPUDirect RDMA over EFA (p4d, p5)"))
        out.append(
            ("FI_EFA_FORK_SAFE", "1", "data loader workers fork; keep libfabric safe across fork")
        )
        out.append(("NCCL_PROTO", "simple", "the protocol AWS recommends for EFA"))
    else:
        out.append(
            ("NCCL_IB_DISABLE", "1", "no InfiniBand on this fabric: skip probing, use sockets")
        )
        out.append(("NCCL_SOCKET_NTHREADS", "4", "more CPU threads per socket connection for TCP"))
        out.append(
            ("NCCL_NSOCKS_PERTHREAD", "4", "several sockets per thread to fill the TCP pipe")
        )
    return out


def nccl_env(plan: Plan) -> str:
    """``nccl.env`` text: comment, then ``KEY=value`` (shell-quoted), per setting."""
    lines = [
        "# NCCL / torch.distributed environment for this plan, written by dtrain-tui.",
        "# Node scripts read it with: set -a; source ./nccl.env; set +a",
    ]
    if plan.gpu.dist_backend == "gloo":
        lines.append("# CPU ranks talk gloo: no NCCL settings apply.")
    elif plan.nodes == 1:
        lines.append("# One node: GPUs talk over NVLink/PCIe, so no inter-node fabric settings.")
    for name, value, reason in nccl_env_entries(plan):
        lines.append(f"# {reason}")
        lines.append(env_line(name, value))
    extra = plan.spec.launch.env
    if extra:
        lines.append("# --- from the spec's launch.env ---")
        lines.extend(env_line(name, extra[name]) for name in sorted(extra))
    return "\n".join(lines) + "\n"

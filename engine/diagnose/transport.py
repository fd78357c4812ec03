"""The NCCL transport check: what NCCL chose on each node against what the plan assumed.

NCCL says at start-up, with ``NCCL_DEBUG=INFO``, which network it took (``Using network IB``,
``Socket``, ``AWS Libfabric``), why IB is missing (``NET/IB : No device found``), which socket
interfaces it uses (``NET/Socket : Using [0]eth0:…``, ``Bootstrap : Using eth0:…``), which
variables it saw (``NCCL_SOCKET_IFNAME set by environment to …``), which plugin it loaded and
whether the inter-node channels use GPUDirect RDMA (``via NET/IB/0/GDRDMA``). Each line is one
:class:`NcclFact` (parsed by :func:`engine.monitor.logparse.nccl_transport_facts`, where the
other NCCL lines are parsed); a :class:`TransportCheck` gathers them per node and judges them
against a :class:`TransportExpectation` (the plan's fabric from the catalog, the bundle's
``nccl.env``, the backend). The result, a :class:`TransportReport`, holds findings with a
likely cause and a fix: "plan assumes InfiniBand, NCCL chose Socket" (no IB device visible,
``NCCL_IB_DISABLE=1``, SkyPilot without ``network_tier: best``), EFA without the OFI plugin,
nodes on different interfaces, loopback or docker interfaces, an ``NCCL_SOCKET_IFNAME`` that
names no interface (NVIDIA/nccl#1837).

Fed by the monitor's rank state (:mod:`engine.monitor.state`), ``monitor --follow`` and the
launcher (which writes the report into run.json as ``transport``). Pure but for
:meth:`TransportExpectation.load`, which reads a bundle or run directory; every input is taken
as untrusted (a missing or garbled file leaves that part of the expectation unknown).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from engine.errors import DtrainError
from engine.fsio import read_regular_bytes
from engine.plan.catalog import get_network
from engine.plan.names import NetworkTier
from engine.rundir.record_parts import TransportRecord

MAX_FILE_BYTES = 4 << 20
"""plan.json, nccl.env, sky.yaml larger than this are not read (they come from disk, maybe
from another machine): the expectation stays unknown instead of a reader stalling."""
MAX_NODES_TRACKED = 4096
"""Nodes a check keeps facts for; lines of further nodes are ignored (a garbled log can name
any number of hosts)."""
MAX_VALUES = 64
"""Distinct values kept per fact kind and node (interfaces, plugins, variables)."""


class FactKind(StrEnum):
    """What one NCCL line says about the transport."""

    NETWORK = "network"
    """``Using network X``: IB, Socket, AWS Libfabric (or a plugin's name)."""
    IB_NO_DEVICE = "ib_no_device"
    """``NET/IB : No device found.``"""
    IB_DEVICE = "ib_device"
    """One HCA port from ``NET/IB : Using [0]mlx5_0:1/IB …``: ``mlx5_0:1/IB`` (``/RoCE``)."""
    SOCKET_IFACE = "socket_iface"
    """One interface from ``NET/Socket : Using [0]eth0:10.0.0.1<0> …``: ``eth0``."""
    BOOTSTRAP_IFACE = "bootstrap_iface"
    """``Bootstrap : Using eth0:10.0.0.1<0>``: ``eth0``."""
    ENV = "env"
    """``NCCL_X set by environment to V``: ``NCCL_X=V``."""
    PLUGIN = "plugin"
    """A network plugin in use: ``internal``, ``OFI``, ``IBext``…"""
    PLUGIN_FAILED = "plugin_failed"
    """A plugin that did not load (``Plugin load returned 2 : libnccl-net.so: cannot open…``)."""
    CHANNEL = "channel"
    """An inter-node channel's transport, indices dropped: ``NET/IB/GDRDMA``, ``NET/Socket``."""
    IFACE_ERROR = "iface_error"
    """NCCL found no usable socket interface (``no socket interface found``, nccl#1837's
    ``… is neither AF_INET(2) nor AF_INET6(10)``)."""


@dataclass(frozen=True, slots=True)
class NcclFact:
    kind: FactKind
    value: str = ""


class Severity(StrEnum):
    ERROR = "error"
    """Training is slower than planned by a large factor, or will not connect."""
    WARNING = "warning"
    """Probably wrong; worth a look."""
    NOTE = "note"
    """Worth knowing; may be intended."""


_SEVERITY_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.NOTE: 2}


class FindingKind(StrEnum):
    NETWORK_MISMATCH = "network_mismatch"
    NETWORKS_DIFFER = "networks_differ"
    IFNAME_NOT_FOUND = "ifname_not_found"
    LOOPBACK_IFACE = "loopback_iface"
    DOCKER_IFACE = "docker_iface"
    IFACES_DIFFER = "ifaces_differ"
    ENV_OVERRIDE = "env_override"
    NO_GDRDMA = "no_gdrdma"


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong with the transport: ``title`` is the headline ("plan assumes
    InfiniBand, NCCL chose Socket"), ``causes`` the likely causes, most likely first (each
    naming its evidence), ``fix`` what to do."""

    kind: FindingKind
    severity: Severity
    title: str
    causes: tuple[str, ...]
    fix: str
    nodes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "severity": self.severity.value,
            "title": self.title,
            "causes": list(self.causes),
            "fix": self.fix,
            "nodes": list(self.nodes),
        }

    def lines(self) -> list[str]:
        """The finding as text: title, ``likely cause:`` / ``also check:``, ``fix:``."""
        where = f" — on {_names(self.nodes)}" if self.nodes else ""
        out = [f"{self.title}{where}"]
        for i, cause in enumerate(self.causes):
            out.append(("  likely cause: " if i == 0 else "  also check: ") + cause)
        out.append(f"  fix: {self.fix}")
        return out


# ---- what the plan assumed ----------------------------------------------------------------

_FABRIC_NAMES = {
    NetworkTier.IB: "InfiniBand",
    NetworkTier.IB_HDR: "InfiniBand",
    NetworkTier.IB_NDR: "InfiniBand",
    NetworkTier.ROCE: "RoCE",
    NetworkTier.EFA: "AWS EFA",
    NetworkTier.TCP: "TCP",
}


@dataclass(frozen=True, slots=True)
class TransportExpectation:
    """What the plan and the bundle told NCCL to do. Any part may be unknown (None / empty)."""

    tier: NetworkTier | None = None
    """The plan's inter-node fabric (``spec.network.tier`` in plan.json)."""
    nodes: int = 0
    """Nodes in the plan (0: unknown). A one-node run needs no inter-node network."""
    dist_backend: str = ""
    """``nccl`` or ``gloo`` (gloo ranks print no NCCL lines: nothing to check)."""
    backend: str = ""
    """The launch backend: local, ssh, slurm, skypilot."""
    nccl_env: dict[str, str] = field(default_factory=dict)
    """The bundle's ``nccl.env`` (``KEY=value`` lines, unquoted)."""
    sky_network_tier_best: bool | None = None
    """Whether the bundle's sky.yaml asks for ``network_tier: best`` (None: no sky.yaml)."""

    @property
    def expected_net(self) -> str:
        """What NCCL should print as ``Using network …`` (the catalog's figure), or ""."""
        return get_network(self.tier).nccl_net if self.tier is not None else ""

    @property
    def fabric(self) -> str:
        """The fabric's name for a person: InfiniBand, RoCE, AWS EFA, TCP (or "")."""
        return _FABRIC_NAMES.get(self.tier, "") if self.tier is not None else ""

    @property
    def multi_node(self) -> bool | None:
        return None if self.nodes <= 0 else self.nodes > 1

    def to_json(self) -> dict[str, Any]:
        return {
            "tier": self.tier.value if self.tier is not None else None,
            "nccl_net": self.expected_net or None,
            "nodes": self.nodes,
            "dist_backend": self.dist_backend,
            "backend": self.backend,
        }

    @classmethod
    def load(cls, path: Path | str, *, backend: str = "") -> TransportExpectation:
        """From a bundle directory (``plan.json``, ``nccl.env``, ``sky.yaml``, ``bundle.json``)
        or a run directory (``plan.json``, ``bundle/…``, ``run.json``). Never raises: what
        cannot be read stays unknown. ``backend`` overrides the one the files name."""
        root = Path(path)
        bundle = root / "bundle" if (root / "bundle").is_dir() else root
        plan = _read_json(root / "plan.json") or _read_json(bundle / "plan.json")
        tier: NetworkTier | None = None
        nodes = 0
        dist = ""
        if plan is not None:
            spec = plan.get("spec")
            net = spec.get("network") if isinstance(spec, dict) else None
            raw_tier = net.get("tier", "tcp") if isinstance(net, dict) else None
            try:
                tier = NetworkTier(str(raw_tier)) if raw_tier is not None else None
            except ValueError:
                tier = None
            n = plan.get("nodes")
            nodes = n if isinstance(n, int) and 0 < n <= MAX_NODES_TRACKED else 0
            gpu = plan.get("gpu")
            d = gpu.get("dist_backend") if isinstance(gpu, dict) else None
            dist = d if isinstance(d, str) else ""
        if not backend:
            for name in ("run.json", "bundle.json"):
                data = _read_json(root / name) or {}
                b = data.get("backend")
                if isinstance(b, str) and b:
                    backend = b
                    break
        sky = _read_text(bundle / "sky.yaml")
        best = None if sky is None else bool(re.search(r"(?m)^\s*network_tier:\s*best\b", sky))
        env_text = _read_text(bundle / "nccl.env")
        return cls(
            tier=tier,
            nodes=nodes,
            dist_backend=dist,
            backend=backend,
            nccl_env=parse_env_file(env_text) if env_text is not None else {},
            sky_network_tier_best=best,
        )


def parse_env_file(text: str) -> dict[str, str]:
    """``KEY=value`` lines of a shell env file (comments skipped, values shell-unquoted)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[7:].lstrip()
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            continue
        try:
            words = shlex.split(value, comments=True)
        except ValueError:
            words = [value]
        out[key] = words[0] if len(words) == 1 else " ".join(words)
    return out


def _read_text(path: Path) -> str | None:
    try:
        data = read_regular_bytes(path, MAX_FILE_BYTES)
    except (OSError, DtrainError):  # absent, too big, or not a regular file: not known
        return None
    return data.decode("utf-8", errors="replace")


def _read_json(path: Path) -> dict[str, Any] | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


# ---- interfaces ----------------------------------------------------------------------------

TRANSPORT_KEYS = frozenset(
    {
        "NCCL_IB_DISABLE",
        "NCCL_NET",
        "NCCL_NET_PLUGIN",
        "NCCL_SOCKET_IFNAME",
        "NCCL_IB_HCA",
        "NCCL_IB_GID_INDEX",
        "FI_PROVIDER",
    }
)
"""Variables that decide which transport NCCL takes: one set otherwise than nccl.env says is
a finding (tuning knobs such as NCCL_NET_GDR_LEVEL are the user's to change)."""

_DOCKER_PREFIXES = ("docker", "veth", "br-", "virbr", "cni", "flannel", "cali")


def is_loopback(iface: str) -> bool:
    return iface == "lo" or iface.startswith("lo:")


def is_container_bridge(iface: str) -> bool:
    """Docker / container bridges and veth pairs: not a route between machines."""
    return iface.startswith(_DOCKER_PREFIXES)


def ifname_matches(spec: str, iface: str) -> bool:
    """Whether NCCL would take ``iface`` under ``NCCL_SOCKET_IFNAME=spec``: a comma list of
    prefixes, ``^`` excludes them, ``=`` asks for exact names (NCCL's ``matchIfList``)."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    hit = False
    for item in spec.split(","):
        name = item.strip().split(":", 1)[0]
        if not name:
            continue
        if (iface == name) if exact else iface.startswith(name):
            hit = True
            break
    return not hit if exclude else hit


# ---- per node ------------------------------------------------------------------------------


@dataclass(slots=True)
class NodeTransport:
    """What NCCL said on one node."""

    networks: list[str] = field(default_factory=list)
    ib_no_device: bool = False
    ib_devices: list[str] = field(default_factory=list)
    socket_ifaces: list[str] = field(default_factory=list)
    bootstrap_ifaces: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    plugins: list[str] = field(default_factory=list)
    plugin_failures: list[str] = field(default_factory=list)
    channels: list[str] = field(default_factory=list)
    iface_errors: list[str] = field(default_factory=list)

    def add(self, fact: NcclFact) -> bool:
        """Take ``fact`` in; True when it told something new."""
        kind, value = fact.kind, fact.value
        if kind is FactKind.IB_NO_DEVICE:
            new = not self.ib_no_device
            self.ib_no_device = True
            return new
        if kind is FactKind.ENV:
            key, _, val = value.partition("=")
            if self.env.get(key) == val or len(self.env) >= MAX_VALUES:
                return False
            self.env[key] = val
            return True
        target = {
            FactKind.NETWORK: self.networks,
            FactKind.IB_DEVICE: self.ib_devices,
            FactKind.SOCKET_IFACE: self.socket_ifaces,
            FactKind.BOOTSTRAP_IFACE: self.bootstrap_ifaces,
            FactKind.PLUGIN: self.plugins,
            FactKind.PLUGIN_FAILED: self.plugin_failures,
            FactKind.CHANNEL: self.channels,
            FactKind.IFACE_ERROR: self.iface_errors,
        }[kind]
        if value in target or len(target) >= MAX_VALUES:
            return False
        target.append(value)
        return True

    @property
    def gdrdma(self) -> bool | None:
        """True when an inter-node channel uses GPUDirect RDMA, False when inter-node channels
        were seen and none does, None when none were seen."""
        nets = [c for c in self.channels if c.startswith("NET/") and not c.startswith("NET/Socket")]
        if not nets:
            return None
        return any("GDRDMA" in c for c in nets)

    @property
    def data_ifaces(self) -> list[str]:
        """The interfaces traffic goes over: NCCL's socket transport's, else the bootstrap's."""
        return self.socket_ifaces or self.bootstrap_ifaces

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "network": self.networks[0] if len(self.networks) == 1 else list(self.networks),
            "ib_no_device": self.ib_no_device,
            "ib_devices": list(self.ib_devices),
            "socket_ifaces": list(self.socket_ifaces),
            "bootstrap_ifaces": list(self.bootstrap_ifaces),
            "gdrdma": self.gdrdma,
            "plugins": list(self.plugins),
            "env": dict(self.env),
        }
        if self.plugin_failures:
            out["plugin_failures"] = list(self.plugin_failures)
        if self.iface_errors:
            out["iface_errors"] = list(self.iface_errors)
        return out


# ---- the report --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TransportReport:
    """A judgement at one moment: every node's facts and the findings, worst first."""

    expect: TransportExpectation | None
    nodes: dict[str, dict[str, Any]]
    """Node label -> :meth:`NodeTransport.to_json`."""
    findings: tuple[Finding, ...]
    chosen: tuple[str, ...] = ()
    """The networks NCCL chose on any node, in order of first sight."""

    @property
    def ok(self) -> bool:
        """No error or warning (notes are fine)."""
        return all(f.severity is Severity.NOTE for f in self.findings)

    @property
    def seen(self) -> bool:
        """NCCL said anything about its transport."""
        return bool(self.nodes)

    def headline(self) -> str:
        """The worst finding's title with a warning sign (``⚠ plan assumes InfiniBand, NCCL
        chose Socket``), ``+N more`` for the others; "" when there is nothing to say."""
        if not self.findings:
            return ""
        top = self.findings[0]
        sign = "ⓘ" if top.severity is Severity.NOTE else "⚠"
        more = f" (+{len(self.findings) - 1} more)" if len(self.findings) > 1 else ""
        return f"{sign} {top.title}{more}"

    def lines(self) -> list[str]:
        out: list[str] = []
        for f in self.findings:
            out.extend(f.lines())
        return out

    def to_json(self) -> dict[str, Any]:
        """run.json's ``transport`` entry."""
        verdict = "unknown" if not self.nodes else ("ok" if self.ok else "mismatch")
        return {
            "verdict": verdict,
            "expected": self.expect.to_json() if self.expect is not None else None,
            "chosen": list(self.chosen),
            "nodes": self.nodes,
            "findings": [f.to_json() for f in self.findings],
        }

    def to_record(self) -> TransportRecord:
        """run.json's ``transport`` entry, typed (:meth:`to_json`'s values, field for field)."""
        return TransportRecord.model_validate(self.to_json())


class TransportCheck:
    """Gathers :class:`NcclFact` per node (:meth:`observe`) and judges them (:meth:`report`,
    cached until a new fact arrives). Not thread-safe: one owner feeds and reads it."""

    def __init__(self, expect: TransportExpectation | None = None) -> None:
        self.expect = expect
        self.nodes: dict[str, NodeTransport] = {}
        self._report: TransportReport | None = None

    def set_expectation(self, expect: TransportExpectation | None) -> None:
        self.expect = expect
        self._report = None

    def observe(self, node: str, facts: Iterable[NcclFact]) -> bool:
        """Take ``facts`` seen on ``node`` (a label: ``node 1 (gpu-b)``, a host name); True
        when anything new was learnt."""
        st = self.nodes.get(node)
        changed = False
        for fact in facts:
            if st is None:
                if len(self.nodes) >= MAX_NODES_TRACKED:
                    return changed
                st = self.nodes[node] = NodeTransport()
                changed = True
            changed = st.add(fact) or changed
        if changed:
            self._report = None
        return changed

    def report(self) -> TransportReport:
        if self._report is None:
            self._report = judge(self.nodes, self.expect)
        return self._report


# ---- judgement -----------------------------------------------------------------------------


def judge(nodes: dict[str, NodeTransport], expect: TransportExpectation | None) -> TransportReport:
    """The findings for ``nodes`` against ``expect`` (see the module docstring)."""
    # In node order, not the order the nodes were first heard from (a race between readers).
    nodes = dict(sorted(nodes.items(), key=lambda kv: _natural(kv[0])))
    chosen: list[str] = []
    for st in nodes.values():
        for net in st.networks:
            if net not in chosen:
                chosen.append(net)
    findings: list[Finding] = []
    multi = _multi_node(nodes, expect)
    gloo = expect is not None and expect.dist_backend == "gloo"
    if not gloo:
        findings += _network_findings(nodes, expect, multi)
        findings += _iface_findings(nodes, expect, multi)
        findings += _env_findings(nodes, expect)
        findings += _gdr_findings(nodes, expect, multi)
    findings.sort(key=lambda f: _SEVERITY_ORDER[f.severity])
    return TransportReport(
        expect=expect,
        nodes={label: st.to_json() for label, st in nodes.items()},
        findings=tuple(findings),
        chosen=tuple(chosen),
    )


def _natural(label: str) -> list[tuple[int, int | str]]:
    """Sort key of a node label: ``node 2`` before ``node 10``."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", label)]


def _multi_node(nodes: dict[str, NodeTransport], expect: TransportExpectation | None) -> bool:
    """Whether traffic crosses machines: the plan says so, else NCCL was heard on 2+ nodes."""
    if expect is not None and expect.multi_node is not None:
        return expect.multi_node
    return len(nodes) > 1


def _names(nodes: Iterable[str]) -> str:
    names = list(nodes)
    if len(names) > 4:
        return ", ".join(names[:3]) + f" and {len(names) - 3} more nodes"
    return ", ".join(names)


def _env_value(
    nodes: dict[str, NodeTransport], expect: TransportExpectation | None, key: str
) -> tuple[str, str] | None:
    """(value, where) of ``key`` as NCCL saw it on any node, else as nccl.env sets it."""
    for label, st in nodes.items():
        if key in st.env:
            return st.env[key], f"NCCL saw it on {label}"
    if expect is not None and key in expect.nccl_env:
        return expect.nccl_env[key], "set in the bundle's nccl.env"
    return None


def _network_findings(
    nodes: dict[str, NodeTransport], expect: TransportExpectation | None, multi: bool
) -> list[Finding]:
    out: list[Finding] = []
    by_net: dict[str, list[str]] = {}
    for label, st in nodes.items():
        for net in st.networks:
            by_net.setdefault(net, []).append(label)
    want = expect.expected_net if expect is not None else ""
    if want and multi and expect is not None:
        for net, where in by_net.items():
            if net == want:
                continue
            out.append(_mismatch(nodes, expect, net, tuple(where)))
    if len(by_net) > 1 and multi:
        parts = [f"{net} on {_names(where)}" for net, where in by_net.items()]
        out.append(
            Finding(
                FindingKind.NETWORKS_DIFFER,
                Severity.ERROR,
                "nodes chose different networks: " + "; ".join(parts),
                (
                    "the nodes are not set up alike: a driver, a device, a plugin or a "
                    "variable differs (compare each node's NET/ lines)",
                ),
                "make every node see the same fabric; ranks on different transports cannot "
                "connect, or fall back to the slowest",
                tuple(label for where in by_net.values() for label in where),
            )
        )
    return out


def _mismatch(
    nodes: dict[str, NodeTransport], expect: TransportExpectation, net: str, where: tuple[str, ...]
) -> Finding:
    tier = expect.tier
    title = f"plan assumes {expect.fabric}, NCCL chose {net}"
    if tier == NetworkTier.TCP:
        return Finding(
            FindingKind.NETWORK_MISMATCH,
            Severity.NOTE,
            title,
            (f"the nodes have a faster fabric than the plan's TCP ({net})",),
            f"re-plan with the real fabric (--network {'efa' if 'Libfabric' in net else 'ib'}) "
            "so the time and cost estimates match",
            where,
        )
    causes: list[str] = []
    if net == "Socket" and tier in (
        NetworkTier.IB,
        NetworkTier.IB_HDR,
        NetworkTier.IB_NDR,
        NetworkTier.ROCE,
    ):
        causes += _ib_causes(nodes, expect, where)
        fix = (
            "make the HCAs visible to every rank (see the cause), then check that each node "
            "prints `NET/IB : Using [0]mlx5_…` and `Using network IB`; or re-plan with "
            "--network tcp so the estimates match what you have"
        )
    elif tier == NetworkTier.EFA:
        causes += _efa_causes(nodes, expect, where)
        fix = (
            "load the aws-ofi-nccl plugin on an EFA-enabled instance (see the cause), then "
            "check that each node prints `Using network AWS Libfabric`; or re-plan with "
            "--network tcp so the estimates match what you have"
        )
    else:
        causes.append(f"NCCL found {net} before {expect.expected_net} on this machine")
        fix = f"set the fabric up so NCCL reports `Using network {expect.expected_net}`"
    net_env = _env_value(nodes, expect, "NCCL_NET")
    if net_env is not None and net_env[0] != expect.expected_net:
        causes.insert(0, f"NCCL_NET={net_env[0]} ({net_env[1]}) forces that network: unset it")
    return Finding(
        FindingKind.NETWORK_MISMATCH,
        Severity.ERROR,
        title,
        tuple(causes),
        fix,
        where,
    )


def _sky_cause(expect: TransportExpectation) -> str | None:
    if expect.backend != "skypilot":
        return None
    if expect.sky_network_tier_best is False:
        return (
            "the SkyPilot task lacks `resources.network_tier: best`, so the cluster got ordinary "
            "networking: add it to sky.yaml (dtrain-tui writes it for IB, EFA and RoCE plans)"
        )
    return (
        "SkyPilot was asked for `network_tier: best`, but this cloud or instance type offers "
        "no such fabric: pick an instance type that has it"
    )


def _ib_causes(
    nodes: dict[str, NodeTransport], expect: TransportExpectation, where: tuple[str, ...]
) -> list[str]:
    causes: list[str] = []
    disabled = _env_value(nodes, expect, "NCCL_IB_DISABLE")
    if disabled is not None and disabled[0].strip() not in ("", "0"):
        causes.append(
            f"NCCL_IB_DISABLE={disabled[0]} ({disabled[1]}) switches InfiniBand off: unset it "
            "or set it to 0"
        )
    no_dev = [label for label in where if nodes[label].ib_no_device]
    if no_dev:
        causes.append(
            f"`NET/IB : No device found` on {_names(no_dev)}: no InfiniBand device is visible "
            "to NCCL; in a container pass the devices (/dev/infiniband, the Kubernetes RDMA "
            "device plugin) and IPC_LOCK; on the host check `ibv_devinfo` and the driver "
            "(MLNX_OFED / rdma-core)"
        )
    sky = _sky_cause(expect)
    if sky is not None:
        causes.append(sky)
    if not no_dev:
        causes.append(
            "the IB verbs library (libibverbs / rdma-core) or the HCA driver is missing, or "
            "the ports are down (`ibstat`)"
        )
    if expect.tier == NetworkTier.ROCE:
        causes.append("RoCE needs a routable GID: check NCCL_IB_GID_INDEX (`show_gids`)")
    return causes


def _efa_causes(
    nodes: dict[str, NodeTransport], expect: TransportExpectation, where: tuple[str, ...]
) -> list[str]:
    causes: list[str] = []
    failed = sorted({f for label in where for f in nodes[label].plugin_failures})
    no_ofi = [label for label in where if "OFI" not in nodes[label].plugins]
    if failed or no_ofi:
        detail = f" ({failed[0]})" if failed else ""
        causes.append(
            f"the aws-ofi-nccl plugin was not loaded on {_names(no_ofi or where)}{detail}: "
            "install it and put its lib directory on LD_LIBRARY_PATH (the AWS Deep Learning "
            "AMIs and containers ship it)"
        )
    provider = _env_value(nodes, expect, "FI_PROVIDER")
    if provider is not None and provider[0] != "efa":
        causes.append(f"FI_PROVIDER={provider[0]} ({provider[1]}): set it to efa")
    sky = _sky_cause(expect)
    if sky is not None:
        causes.append(sky)
    causes.append(
        "the instance has no EFA interface: enable EFA when launching it (and a security "
        "group that lets it talk to itself); `fi_info -p efa` lists the device"
    )
    return causes


def _iface_findings(
    nodes: dict[str, NodeTransport], expect: TransportExpectation | None, multi: bool
) -> list[Finding]:
    """What is wrong with the socket interfaces NCCL picked (between nodes: which ones)."""
    ifname = _env_value(nodes, expect, "NCCL_SOCKET_IFNAME")
    out = _ifname_not_found(nodes, ifname)
    if not multi:
        return out
    return out + _loopback_iface(nodes, ifname) + _bridge_iface(nodes) + _ifaces_differ(nodes)


def _ifname_not_found(
    nodes: dict[str, NodeTransport], ifname: tuple[str, str] | None
) -> list[Finding]:
    # nccl#1837: an NCCL_SOCKET_IFNAME naming no interface is not reported as such.
    broken = [label for label, st in nodes.items() if st.iface_errors]
    if not broken:
        return []
    first = nodes[broken[0]].iface_errors[0]
    if ifname is not None:
        title = f"NCCL_SOCKET_IFNAME={ifname[0]} names no interface NCCL could use"
        cause = (
            f"NCCL_SOCKET_IFNAME={ifname[0]} ({ifname[1]}) matches no interface with an "
            f"address on {_names(broken)} (NCCL said: {first}); NCCL does not say so "
            "plainly (NVIDIA/nccl#1837)"
        )
    else:
        title = "NCCL found no socket interface to use"
        cause = f"NCCL said on {_names(broken)}: {first}"
    return [
        Finding(
            FindingKind.IFNAME_NOT_FOUND,
            Severity.ERROR,
            title,
            (cause,),
            "list the node's real interfaces (`ip -br addr`) and set NCCL_SOCKET_IFNAME "
            "(the wizard's Network step, `network.socket_ifname`) to one that exists on "
            "every node, e.g. `eth0` or a list `eth0,ens5`",
            tuple(broken),
        )
    ]


def _loopback_iface(
    nodes: dict[str, NodeTransport], ifname: tuple[str, str] | None
) -> list[Finding]:
    lo = [label for label, st in nodes.items() if any(is_loopback(i) for i in st.data_ifaces)]
    if not lo:
        return []
    why = (
        f"NCCL_SOCKET_IFNAME={ifname[0]} ({ifname[1]}) selects it"
        if ifname is not None and ifname_matches(ifname[0], "lo")
        else "no other interface with an address was found (NCCL only takes lo then)"
    )
    return [
        Finding(
            FindingKind.LOOPBACK_IFACE,
            Severity.ERROR,
            "NCCL uses the loopback interface (lo) between nodes",
            (why,),
            "set NCCL_SOCKET_IFNAME to the node's network interface (`ip -br addr`), "
            "e.g. `eth0`, or `^lo,docker` to skip loopback and docker bridges",
            tuple(lo),
        )
    ]


def _bridge_iface(nodes: dict[str, NodeTransport]) -> list[Finding]:
    dock = {
        label: [i for i in st.data_ifaces if is_container_bridge(i)] for label, st in nodes.items()
    }
    dock = {k: v for k, v in dock.items() if v}
    if not dock:
        return []
    names = sorted({i for v in dock.values() for i in v})
    return [
        Finding(
            FindingKind.DOCKER_IFACE,
            Severity.WARNING,
            f"NCCL uses a container bridge interface ({', '.join(names)})",
            (
                "docker, veth and br- interfaces only reach this machine's containers; "
                "NCCL's default skips `docker*` but not `veth*` or `br-*`",
            ),
            "set NCCL_SOCKET_IFNAME to the interface that reaches the other nodes, e.g. "
            "`eth0`, or `^lo,docker,veth,br-`",
            tuple(dock),
        )
    ]


def _ifaces_differ(nodes: dict[str, NodeTransport]) -> list[Finding]:
    used = {label: tuple(st.data_ifaces) for label, st in nodes.items() if st.data_ifaces}
    if len(set(used.values())) <= 1:
        return []
    desc = "; ".join(f"{label}: {','.join(ifs)}" for label, ifs in used.items())
    return [
        Finding(
            FindingKind.IFACES_DIFFER,
            Severity.WARNING,
            "nodes use different network interfaces",
            (
                f"{desc}: a node may be on a management or slower network, or the nodes "
                "name their NICs differently",
            ),
            "check that these interfaces are on the same network; set "
            "NCCL_SOCKET_IFNAME to a list naming each node's data interface "
            "(e.g. `eth0,ens5`)",
            tuple(used),
        )
    ]


def _env_findings(
    nodes: dict[str, NodeTransport], expect: TransportExpectation | None
) -> list[Finding]:
    if expect is None or not expect.nccl_env:
        return []
    differ: list[str] = []
    where: list[str] = []
    for label, st in nodes.items():
        for key, seen in st.env.items():
            want = expect.nccl_env.get(key)
            if key not in TRANSPORT_KEYS or want is None or want.strip() == seen.strip():
                continue
            item = f"{key}={seen} (nccl.env: {want})"
            if item not in differ:
                differ.append(item)
            if label not in where:
                where.append(label)
    if not differ:
        return []
    return [
        Finding(
            FindingKind.ENV_OVERRIDE,
            Severity.WARNING,
            "NCCL saw other settings than the bundle's nccl.env: " + ", ".join(differ[:3]),
            (
                "something on the node sets them after nccl.env: /etc/nccl.conf, ~/.nccl.conf, "
                "the container image's environment or a --remote-setup script",
            ),
            "remove the other setting, or change the plan (wizard's Network step) to match it",
            tuple(where),
        )
    ]


def _gdr_findings(
    nodes: dict[str, NodeTransport], expect: TransportExpectation | None, multi: bool
) -> list[Finding]:
    if not multi or (expect is not None and expect.tier == NetworkTier.TCP):
        return []
    without = [label for label, st in nodes.items() if st.gdrdma is False]
    if not without:
        return []
    return [
        Finding(
            FindingKind.NO_GDRDMA,
            Severity.NOTE,
            "no GPUDirect RDMA between nodes: traffic is staged through host memory",
            (
                "the nvidia-peermem module is not loaded, or GPU and NIC are too far apart in "
                "the PCIe topology for NCCL_NET_GDR_LEVEL (`nvidia-smi topo -m`)",
            ),
            "load nvidia-peermem (`modprobe nvidia-peermem`) and check that channels print "
            "`via NET/IB/…/GDRDMA`",
            tuple(without),
        )
    ]

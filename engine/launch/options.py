"""How to launch, besides the bundle: :class:`LaunchOptions`, built from a spec's
:class:`engine.plan.specs.LaunchSpec` by :meth:`LaunchOptions.from_spec` (the ``launch`` command,
after applying its flags, and the TUI's launch). Read by every backend; never holds a secret.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.plan.names import Backend
from engine.plan.specs import Host, LaunchSpec


@dataclass
class LaunchOptions:
    """How to launch, besides the bundle. Never holds a secret: key files by path."""

    hosts: list[Host] = field(default_factory=list)
    identity_file: Path | None = None
    known_hosts: Path | None = None
    accept_new_host_keys: bool = False
    remote_workdir: str = "~/dtrain-runs"
    remote_setup: str | None = None
    hang_timeout_s: float = 300.0
    start_timeout_s: float = 600.0
    """Seconds the ranks get to show a first sign of life (``--start-timeout``)."""
    nccl_debug: str | None = None
    nccl_debug_subsys: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    master_port: int | None = None
    """Rendezvous port; None: the bundle's (a free one for local runs)."""
    ssh_config: Path | None = None
    """OpenSSH client config; None: ~/.ssh/config when it exists."""
    ssh_user: str | None = None
    """SSH user for hosts without ``user@`` (the profile's ``launch.ssh_user``); None: ssh
    config's, else the local user."""
    connect_timeout_s: float = 15.0
    login_host: Host | None = None
    """Slurm: the login node to submit on over SSH (``--login-host``); None: this machine."""
    sky_cluster: str | None = None
    sky_down: bool = False
    sky_autostop_min: int | None = None
    sky_cloud: str | None = None
    allow_shrink: bool = False
    """With ``--max-restarts``: when a node's failure repeats and no spare host is left, go on
    on the other nodes, re-planned for fewer of them keeping the global batch
    (``--allow-shrink``; :mod:`engine.launch.restart`)."""

    @classmethod
    def from_spec(
        cls,
        launch: LaunchSpec,
        *,
        hosts: list[Host] | None = None,
        accept_new_host_keys: bool = False,
        master_port: int | None = None,
        ssh_config: Path | None = None,
    ) -> LaunchOptions:
        """The options ``launch`` asks for. ``hosts``: None for the spec's own. The rendezvous
        port is not the spec's (that one is written into the bundle): ``master_port`` overrides
        the bundle's only when given, as do ``accept_new_host_keys`` and ``ssh_config``, which
        no spec holds."""
        return cls(
            hosts=launch.parsed_hosts() if hosts is None else hosts,
            identity_file=launch.identity_file,
            known_hosts=launch.known_hosts,
            accept_new_host_keys=accept_new_host_keys,
            remote_workdir=launch.remote_workdir,
            remote_setup=launch.remote_setup,
            hang_timeout_s=launch.hang_timeout_s,
            start_timeout_s=launch.start_timeout_s,
            nccl_debug=launch.nccl_debug,
            nccl_debug_subsys=launch.nccl_debug_subsys,
            env=dict(launch.env),
            master_port=master_port,
            ssh_config=ssh_config,
            ssh_user=launch.ssh_user,
            sky_cluster=launch.sky_cluster,
            sky_down=launch.sky_down,
            sky_autostop_min=launch.sky_autostop_min,
            sky_cloud=launch.sky_cloud,
        )


HOSTLESS_BACKENDS = frozenset({Backend.LOCAL, Backend.SLURM})
"""Backends that take no host list: local runs on this machine, Slurm picks the nodes."""


def backend_hosts(kind: Backend | str, hosts: list[Host]) -> list[Host]:
    """The hosts the backend ``kind`` launches on: ``hosts``, or none for a backend that
    places the ranks itself (:data:`HOSTLESS_BACKENDS`; a spec's hosts are ignored there)."""
    return [] if kind in HOSTLESS_BACKENDS else hosts

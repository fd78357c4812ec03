"""Which backends take a host list: one rule (``engine.launch.options.backend_hosts``) for the
``launch`` and ``preflight`` commands and the wizard's Preflight button. Local runs on this
machine and Slurm picks its nodes, so the hosts a spec or ``--hosts`` names are dropped there;
SSH and SkyPilot keep them."""

from __future__ import annotations

import argparse

import pytest

from cli.launch_cmd import _backend_options
from engine.errors import DtrainError
from engine.launch.options import LaunchOptions, backend_hosts
from engine.plan.names import Backend
from engine.plan.specs import Host

HOSTS = [Host.parse("alice@n1"), Host.parse("n2:2222")]


@pytest.mark.parametrize(
    ("backend", "kept"),
    [(Backend.LOCAL, False), (Backend.SLURM, False), (Backend.SSH, True), (Backend.SKYPILOT, True)],
)
def test_the_hosts_each_backend_launches_on(backend: Backend, kept: bool) -> None:
    assert backend_hosts(backend.value, HOSTS) == (HOSTS if kept else [])
    options = LaunchOptions(hosts=list(HOSTS))
    _backend_options(argparse.Namespace(login_host=None), backend.value, options)
    assert options.hosts == (HOSTS if kept else [])


def test_ssh_without_hosts_is_one_line_naming_the_flag() -> None:
    with pytest.raises(DtrainError) as err:
        _backend_options(argparse.Namespace(), "ssh", LaunchOptions())
    assert err.value.field == "--hosts"

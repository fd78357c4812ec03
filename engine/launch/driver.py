"""What a launch backend's driver does: start a run's nodes, signal them, and reap them.

One driver per backend (:class:`engine.launch.local.LocalDriver`,
:class:`engine.launch.ssh.SshDriver`, :class:`engine.launch.slurm.SlurmDriver`,
:class:`engine.launch.skypilot.SkyPilotDriver`) knows only its processes. It is built on the
run's :class:`engine.launch.run_state.RunContext`, which it hands every byte stream to
(``add_stream``) and tells of a lost node or a line of its own; the supervisor
(:class:`engine.launch.supervise.Supervisor`) calls it to learn of a node's end and to stop it;
the facade (:class:`engine.launch.base.LaunchBackend`) to start it.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

from engine.launch.pump import ControlLine, Split


class DumpReach(Enum):
    """How a driver reaches the ranks for their Flight Recorder dumps
    (:mod:`engine.launch.frdump`)."""

    NONE = "none"
    """It cannot (SkyPilot): only NCCL's own dump files can tell."""
    EACH_NODE = "each node"
    """One request per node (local, SSH): ``ask_dumps(node)``."""
    ALL_NODES = "all nodes"
    """One request reaches every node (Slurm: one ``srun`` step): ``ask_dumps(None)``."""


class NodeDriver(Protocol):
    """Starts, signals and reaps the processes of one run's nodes."""

    dump_reach: DumpReach
    split: Split | None
    """The driver's own line splitting (SkyPilot's node prefixes), else torchrun's tee prefixes."""
    control: ControlLine | None
    """Consumes the driver's control lines (SSH's ready line); None: it has none."""

    def hosts(self) -> list[str]:
        """Display name of each node's host, in node-rank order."""
        ...

    def start_nodes(self) -> None:
        """Start every node (all or nothing) and hand each output stream to the run state."""
        ...

    def node_exit(self, node: int) -> tuple[bool, int | None]:
        """(finished, exit code) of the node's launch script."""
        ...

    def kill_node(self, node: int, reason: str) -> None:
        """Stop everything of the run on ``node`` (process group, then leftovers). Idempotent;
        its waits end early once the run state's ``force`` is set."""
        ...

    def kill_node_now(self, node: int) -> None:
        """SIGKILL everything of the run on ``node`` at once (``kill()``, a second Ctrl-C)."""
        ...

    def ask_dumps(self, node: int | None) -> int:
        """Send the dump request to ``node``'s ranks (None: every node at once, with
        :attr:`DumpReach.ALL_NODES`); how many were asked."""
        ...

    def teardown_after_failed_start(self) -> None:
        """Undo a half-done start (kill what was started, close connections)."""
        ...

    def close(self) -> None:
        """Release resources (connections) after the run ended."""
        ...


class RunControl(Protocol):
    """What a driver that follows its own job (Slurm) may ask of the supervisor
    (:class:`engine.launch.supervise.Supervisor`) when that job ends or cannot start."""

    def fail(self, rank: int | None, node: int | None, reason: str) -> None:
        """The run's first failure: record it and stop every other node."""
        ...

    def request_stop(self, reason: str = "stopped by the user") -> None:
        """Start stopping every node; the run ends ``stopped`` with ``reason``."""
        ...

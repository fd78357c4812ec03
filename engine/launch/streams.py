"""The bottom layer of every launch backend: the run's shared state.

:class:`StreamingRun` holds what every layer above uses (bundle, options, run directory, nodes)
and owns the run's :class:`engine.launch.pump.OutputPump`, which reads each byte stream a backend
hands over (:meth:`_add_stream`) and queues its events. :mod:`engine.launch.supervise` builds on
it; :class:`engine.launch.base.LaunchBackend` is the public template on top.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from engine.errors import DtrainError
from engine.launch.options import LaunchOptions
from engine.launch.policy import HangClock, NodeState
from engine.launch.pump import OutputPump
from engine.launch.torchrun_output import split_tee
from engine.launch.transport_watch import TransportWatch
from engine.rundir.events import Event
from engine.rundir.files import RunDir, new_run_dir
from engine.rundir.record import RunState
from engine.write.manifest import BundleManifest, read_manifest

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class LaunchError(DtrainError):
    """A launch could not start or went wrong; the message names node and host."""


class StreamingRun:
    """A run's state and the readers of its nodes' output."""

    name = "base"

    def __init__(
        self, bundle_dir: Path, run_dir: Path | None = None, options: LaunchOptions | None = None
    ) -> None:
        self.bundle_dir = Path(bundle_dir)
        self.options = options or LaunchOptions()
        self.manifest: BundleManifest = read_manifest(self.bundle_dir)
        self.run = RunDir(run_dir or new_run_dir(self.manifest.name))
        # The run id tags every process of the run (DTRAIN_RUN_ID) and is matched by the
        # cleanup on every node: no control character (a newline once split it into two
        # patterns there) may get into it from the run directory's name.
        if _CONTROL_RE.search(self.run.path.name):
            raise LaunchError(
                f"{self.run.path.name!r}: a run directory name may not hold control characters",
                field="--run-dir",
            )
        self.run_id = f"{self.run.path.name}-{int(time.time() * 1000) % 10**8}"
        self._cond = threading.Condition()
        self._nodes: list[NodeState] = []
        """The run's nodes, filled in place when it starts (the pump shares the list)."""
        self._state = RunState.STARTING
        self._final = threading.Event()
        self._finishing = False
        self._stop_requested = False
        self._stop_reason = ""
        self._stopper: threading.Thread | None = None
        self.force = threading.Event()
        """Set by ``kill()``: stopping SIGKILLs at once instead of waiting out the grace."""
        self._dir_error: OSError | None = None
        """The first error writing the run directory (a full disk); ends the run ``failed``."""
        self._failure: tuple[int | None, int | None, str] | None = None  # (rank, node, reason)
        self._hang = HangClock()
        """The ranks' silence (the hang timeout), on the launcher's own clock."""
        cls = type(self)
        self.pump = OutputPump(
            self.run,
            self._nodes,
            self.manifest.gpus_per_node,
            ended=self._final,
            hang=self._hang,
            transport=TransportWatch(self.run, self.bundle_dir, self.name),
            split=self._split if cls._split is not StreamingRun._split else None,
            control=(
                self._control_line if cls._control_line is not StreamingRun._control_line else None
            ),
            on_dir_error=self._dir_failed,
        )
        """Reads the nodes' streams into the run directory and the event queue."""

    # ------------------------------------------------------------------ hooks

    def _split(self, node: int, raw: bytes) -> tuple[int, int | None, bytes]:
        """(node, global rank or None, line without launcher prefixes) for one raw line.
        A subclass overriding this gets the per-line path (slower, for exotic prefixes)."""
        return split_tee(node, self.manifest.gpus_per_node, raw)

    def _control_line(self, node: int, stream: str, line: bytes) -> bool:
        """Hook: consume a backend control line (not logged); True when consumed. Sees the lines
        without a torchrun rank prefix (and every line when ``_split`` is overridden)."""
        return False

    def _node_lost(self, node: int, reason: str) -> None:
        """A subclass reports a node it can no longer reach."""
        st = self._nodes[node]
        if not st.lost:
            st.lost = reason

    def _add_stream(self, node: int, stream: str, read: Callable[[], bytes]) -> None:
        """Hand a node's byte stream (``read()``: bytes, b"" at EOF) to the pump."""
        self.pump.add_stream(node, stream, read)

    def _dir_failed(self, e: OSError) -> None:
        """A write to the run directory failed: remember the first error for the supervisor."""
        with self._cond:
            if self._dir_error is None:
                self._dir_error = e

    def _emit(self, ev: Event) -> None:
        self.pump.emit(ev)

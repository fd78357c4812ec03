"""One interface for every way of starting a run (local torchrun, SSH, SkyPilot).

:class:`LaunchBackend` implements :class:`engine.monitor.events.EventSource`. Its public ``start`` / ``poll`` /
``stop`` add what every backend needs around the subclass's ``_start`` / ``_kill_node`` (as
SkyPilot's own backends wrap ``_provision`` / ``_execute``): timing, turning any failure into one
:class:`LaunchError` line, the run directory, splitting lines per rank, per-rank exit codes, the
fault policy and the final state. Subclasses only start nodes and hand over their byte streams;
they know nothing of widgets.

Fault policy: the first rank that exits non-zero, a node whose connection drops, a run silent
for ``hang_timeout_s``, or a run directory that cannot be written (disk full) ends the run
``failed`` (naming rank, node and host) and every other node is stopped; ``stop()`` /
``request_stop()`` (Ctrl-C, SIGTERM, SIGHUP, or ``RUN/stop.request`` written by a monitor) end it
``stopped``, and ``kill()`` (a second Ctrl-C) cuts the grace period short; it is ``succeeded``
only when every rank exited 0. run.json names the launcher (pid and start time), so a reader can
tell a run whose launcher was killed outright from one still going.

Per-rank exit codes come from torchrun: when a node's torchrun exits 0 every local rank exited 0;
otherwise torchrun's ``ChildFailedError`` table (``rank : R (local_rank: L)`` / ``exitcode : C``,
printed on the node's stderr) gives each failed rank's code (negative for a signal), and the
``Root Cause`` entry names the rank that failed first.
"""

from __future__ import annotations

import errno
import re
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import DtrainError
from engine.monitor.events import (
    STDERR,
    STDOUT,
    Event,
    LineBatch,
    LineEvent,
    RankExit,
    RunStateChanged,
)
from engine.plan.specs import Host
from engine.rundir.files import RunDir, default_run_dir, iso
from engine.rundir.launcher import launcher_record, take_stop_request
from engine.write.manifest import BundleManifest, read_manifest

# torchrun --tee 3: "[default<local_rank>]:" before each line of a rank.
_TEE_RE = re.compile(rb"^\[default(\d+)\]:")
_TEE_STR_RE = re.compile(r"\[default(\d+)\]:")
# Where lines without a tee prefix end: before the next line that has one.
_NEXT_TAGGED_RE = re.compile(r"\n(?=\[default\d+\]:)")
_Key = tuple[int, int | None]
# Per local rank "L": (search for the end of a run of "[defaultL]:" lines, "\n[defaultL]:",
# len("[defaultL]:"), L).
_RunOf = tuple[Callable[[str, int], "re.Match[str] | None"], str, int, int]
_RUNS: dict[str, _RunOf] = {}


def _run_of(local: str) -> _RunOf:
    prefix = f"[default{local}]:"
    run = (
        re.compile(r"\n(?!" + re.escape(prefix) + ")").search,
        "\n" + prefix,
        len(prefix),
        int(local),
    )
    _RUNS[local] = run
    return run


def _shown(line: str) -> str:
    """A line as shown: bytes that are not UTF-8 (kept by ``surrogateescape``) become U+FFFD."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return line


_TABLE_RANK_RE = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_TABLE_EXIT_RE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_TABLE_HOST_RE = re.compile(r"^\s*host\s*:\s*(\S+)")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Seconds between SIGTERM and SIGKILL when stopping a node.
STOP_GRACE_S = 5.0
SUPERVISE_INTERVAL_S = 0.1
# Output queued for the consumer (bytes since its last poll) above which a stream reader pauses,
# for at most PENDING_WAIT_S per read.
MAX_PENDING_BYTES = 2 << 20
PENDING_WAIT_S = 0.25
# Seconds a node's output may stay open after its script ended (a leftover child holds it).
LINGER_S = 5.0


class LaunchError(DtrainError):
    """A launch could not start or went wrong; the message names node and host."""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "unknown exit"
    if code < 0:
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


@dataclass
class LaunchOptions:
    """How to launch, besides the bundle: built from a LaunchSpec plus command-line flags.
    Never holds a secret: key files by path."""

    hosts: list[Host] = field(default_factory=list)
    identity_file: Path | None = None
    known_hosts: Path | None = None
    accept_new_host_keys: bool = False
    remote_workdir: str = "~/dtrain-runs"
    remote_setup: str | None = None
    hang_timeout_s: float = 300.0
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
    sky_cluster: str | None = None
    sky_down: bool = False
    sky_autostop_min: int | None = None
    sky_cloud: str | None = None


@dataclass
class NodeState:
    node: int
    host: str
    exit_code: int | None = None
    finished: bool = False
    lost: str = ""
    """Why the node was lost (connection dropped), or empty."""
    open_streams: int = 0
    exited_at: float | None = None
    table_rank: int | None = None
    root_cause: bool = False
    rank_exits: dict[int, int] = field(default_factory=dict)
    root_rank: int | None = None


class LaunchBackend(ABC):
    """Abstract launch backend. Use: ``start()``, then ``poll()`` until ``done``; ``stop()``."""

    name = "base"
    max_pending_bytes = MAX_PENDING_BYTES

    def __init__(
        self, bundle_dir: Path, run_dir: Path | None = None, options: LaunchOptions | None = None
    ) -> None:
        self.bundle_dir = Path(bundle_dir)
        self.options = options or LaunchOptions()
        self.manifest: BundleManifest = read_manifest(self.bundle_dir)
        self.run = RunDir(run_dir or default_run_dir(self.manifest.name))
        # The run id tags every process of the run (DTRAIN_RUN_ID) and is matched by the
        # cleanup on every node: no control character (a newline once split it into two
        # patterns there) may get into it from the run directory's name.
        if _CONTROL_RE.search(self.run.path.name):
            raise LaunchError(
                f"{self.run.path.name!r}: a run directory name may not hold control characters",
                field="--run-dir",
            )
        self.run_id = f"{self.run.path.name}-{int(time.time() * 1000) % 10**8}"
        self._events: list[Event] = []
        self._pending_bytes = 0
        """Bytes of lines queued since the consumer's last poll."""
        self._cond = threading.Condition()
        self._nodes: list[NodeState] = []
        self._state = "starting"
        self._final = threading.Event()
        self._finishing = False
        self._stop_requested = False
        self._stop_reason = ""
        self._stopper: threading.Thread | None = None
        self.force = threading.Event()
        """Set by :meth:`kill`: stopping SIGKILLs at once instead of waiting out the grace."""
        self._dir_error: OSError | None = None
        """The first error writing the run directory (a full disk); ends the run ``failed``."""
        self._failure: tuple[int | None, int | None, str] | None = None  # (rank, node, reason)
        self._last_activity = time.monotonic()
        self._supervisor: threading.Thread | None = None
        self._threads: list[threading.Thread] = []
        self.start_time_s: float | None = None
        """Seconds ``start()`` took (connect + upload + start on every node)."""

    # ------------------------------------------------------------------ public API

    @property
    def hosts(self) -> list[str]:
        """Display name of each node's host, in node-rank order."""
        return [str(h) for h in self.options.hosts] or ["localhost"] * self.manifest.nodes

    @property
    def state(self) -> str:
        return self._state

    @property
    def stopping(self) -> str:
        """Why the run is being stopped (a user's stop), or "" while it is not."""
        return self._stop_reason

    @property
    def done(self) -> bool:
        with self._cond:
            return self._final.is_set() and not self._events

    def start(self) -> None:
        t0 = time.monotonic()
        m = self.manifest
        hosts = self.hosts
        if len(hosts) != m.nodes:
            raise LaunchError(
                f"{len(hosts)} host(s) given for a {m.nodes}-node bundle; pass one host per node",
                field="--hosts",
            )
        self.run.create(self.bundle_dir)
        self._nodes = [NodeState(node=i, host=hosts[i]) for i in range(m.nodes)]
        ranks = [
            {
                "rank": n * m.gpus_per_node + lr,
                "node_rank": n,
                "local_rank": lr,
                "host": hosts[n],
                "exit_code": None,
            }
            for n in range(m.nodes)
            for lr in range(m.gpus_per_node)
        ]
        now = time.time()
        self.run.update(
            name=m.name,
            run_id=self.run_id,
            backend=self.name,
            state="starting",
            started_at=iso(now),
            ended_at=None,
            nodes=m.nodes,
            gpus_per_node=m.gpus_per_node,
            world_size=m.world_size,
            dist_backend=m.dist_backend,
            framework=m.framework,
            hosts=hosts,
            ranks=ranks,
            failed_rank=None,
            failed_node=None,
            reason="",
            launcher=launcher_record(),
        )
        self._emit(
            RunStateChanged(
                "starting", f"starting {m.world_size} ranks on {m.nodes} node(s)", time.time()
            )
        )
        try:
            self._start()
        except BaseException as e:
            self._teardown_after_failed_start()
            if isinstance(e, KeyboardInterrupt):
                self._stop_requested = True
                self._finish("stopped", "stopped by the user while starting")
                raise
            msg = str(e) if isinstance(e, DtrainError) else f"{type(e).__name__}: {e}"
            self._finish("failed", msg)
            if isinstance(e, LaunchError):
                raise
            if isinstance(e, DtrainError):
                raise LaunchError(e.message, field=e.field) from None
            raise LaunchError(msg) from None
        self.start_time_s = time.monotonic() - t0
        self._last_activity = time.monotonic()
        self._record(state="running")
        self._state = "running"
        self._emit(RunStateChanged("running", f"started in {self.start_time_s:.2f}s", time.time()))
        self._supervisor = threading.Thread(
            target=self._supervise, name="dtrain-supervise", daemon=True
        )
        self._supervisor.start()

    def poll(self, timeout: float) -> list[Event]:
        with self._cond:
            if not self._events and not self._final.is_set():
                self._cond.wait(timeout)
            out, self._events = self._events, []
            if self._pending_bytes:
                self._pending_bytes = 0
                self._cond.notify_all()
            return out

    def stop(self) -> None:
        """Stop every node (SIGTERM to each process group, SIGKILL after a grace period) and end
        the run ``stopped`` unless it already ended; returns once it ended. Idempotent."""
        if self._final.is_set() or not self._nodes:
            return
        self.request_stop()
        self._final.wait(2 * STOP_GRACE_S + 20)

    def request_stop(self, reason: str = "stopped by the user") -> None:
        """Start stopping every node (as :meth:`stop`) on a thread of its own and return at once;
        the run ends ``stopped`` with ``reason``. Idempotent: the first reason stays."""
        with self._cond:
            if self._final.is_set() or not self._nodes or self._stopper is not None:
                return
            self._stop_requested = True
            self._stop_reason = reason
            self._stopper = threading.Thread(
                target=self._stop_all, args=(reason,), name="dtrain-stop", daemon=True
            )
        self._stopper.start()

    def kill(self, reason: str = "stopped by the user") -> None:
        """Escalate a stop: SIGKILL everything of the run now, without the grace period (a
        second Ctrl-C). Returns at once; the run still ends ``stopped`` once every node is gone,
        and is never abandoned. Idempotent."""
        self.request_stop(reason)
        self.force.set()
        for st in self._nodes:
            if not st.finished:
                threading.Thread(
                    target=self._safe_kill_now, args=(st.node,), name="dtrain-kill", daemon=True
                ).start()

    def _stop_all(self, reason: str) -> None:
        self._kill_all(reason)
        self._final.wait(STOP_GRACE_S + 10)
        if not self._final.is_set():
            self._finish("stopped", reason)

    def wait(self, timeout: float | None = None) -> str:
        """Block until the run ends; returns the final state."""
        self._final.wait(timeout)
        return self._state

    def exit_code(self) -> int:
        """0 only when every rank exited 0."""
        return 0 if self._state == "succeeded" else 1

    # ------------------------------------------------------------------ for subclasses

    @abstractmethod
    def _start(self) -> None:
        """Start every node (all or nothing); call :meth:`_add_stream` for each output stream."""

    @abstractmethod
    def _kill_node(self, node: int, reason: str) -> None:
        """Stop everything of the run on ``node`` (process group, then leftovers). Idempotent."""

    @abstractmethod
    def _node_exit(self, node: int) -> tuple[bool, int | None]:
        """(finished, exit code) of the node's launch script."""

    def _kill_node_now(self, node: int) -> None:
        """Hook for :meth:`kill`: SIGKILL everything of the run on ``node`` at once. By default a
        second :meth:`_kill_node` (a subclass's waits should end early once :attr:`force` is
        set)."""
        self._kill_node(node, "killed by the user")

    def _teardown_after_failed_start(self) -> None:
        """Undo a half-done start (kill what was started, close connections)."""
        return None

    def _control_line(self, node: int, stream: str, line: bytes) -> bool:
        """Hook: consume a backend control line (not logged); True when consumed. Sees the lines
        without a torchrun rank prefix (and every line when ``_split`` is overridden)."""
        return False

    def _close(self) -> None:
        """Release resources (connections) after the run ended."""
        return None

    def _node_lost(self, node: int, reason: str) -> None:
        """A subclass reports a node it can no longer reach."""
        st = self._nodes[node]
        if not st.lost:
            st.lost = reason

    # ------------------------------------------------------------------ stream handling

    def _add_stream(self, node: int, stream: str, read: Callable[[], bytes]) -> None:
        """Pump ``read()`` (bytes, b"" at EOF) on a thread: split lines, attribute ranks, write the
        run dir, then queue the events."""
        self._nodes[node].open_streams += 1
        t = threading.Thread(
            target=self._pump,
            args=(node, stream, read),
            name=f"dtrain-n{node}-{stream}",
            daemon=True,
        )
        self._threads.append(t)
        t.start()

    def _pump(self, node: int, stream: str, read: Callable[[], bytes]) -> None:
        tail = b""
        try:
            while True:
                try:
                    chunk = read()
                except Exception as e:  # noqa: BLE001 - a dropped connection ends this stream
                    self._node_lost(node, f"connection lost: {e}")
                    chunk = b""
                if not chunk:
                    if tail:
                        self._ingest(node, stream, tail + b"\n")
                    break
                cut = chunk.rfind(b"\n") + 1
                if not cut:
                    tail += chunk
                    continue
                whole = chunk[:cut]  # the whole chunk (no copy) when it ends with a newline
                self._ingest(node, stream, tail + whole if tail else whole)
                tail = chunk[cut:]
        finally:
            with self._cond:
                self._nodes[node].open_streams -= 1

    def _split(self, node: int, raw: bytes) -> tuple[int, int | None, bytes]:
        """(node, global rank or None, line without launcher prefixes) for one raw line.
        A subclass overriding this gets the per-line path (slower, for exotic prefixes)."""
        mt = _TEE_RE.match(raw)
        if mt:
            return node, node * self.manifest.gpus_per_node + int(mt.group(1)), raw[mt.end() :]
        return node, None, raw

    def _ingest(self, node: int, stream: str, data: bytes) -> None:
        """Handle ``data`` (whole lines, each ending in a newline) read from one stream: write
        every rank's lines to its log with one call (flushed), then emit one
        :class:`LineBatch` per (rank, stream), so no line reaches a consumer before the run
        directory has it.

        The hot path (hundreds of thousands of lines a second) works per run of consecutive
        lines of one rank, not per line: the chunk is decoded once, a run's end is found with
        one regex search (the first line without the run's prefix), its lines come out of one
        ``str.split`` on "newline + prefix", prefixes already gone, and each rank's file gets
        them back encoded, exact (invalid UTF-8 round-trips through ``surrogateescape``). Only
        lines without a rank prefix are looked at one by one."""
        ts = time.time()
        if not data.endswith(b"\n"):
            data += b"\n"
        try:
            text = data.decode("utf-8")
            dirty = False
        except UnicodeDecodeError:
            text = data.decode("utf-8", "surrogateescape")
            dirty = True
        if "\r" in text:
            text = text.replace("\r\n", "\n")  # a CR before the newline is not part of a line
        if type(self)._split is not LaunchBackend._split:
            groups = self._group_per_line(node, stream, text)
        else:
            groups = self._group_runs(node, stream, text)
        hosts = [st.host for st in self._nodes]
        events: list[Event] = []
        for (n, rank), lines in groups.items():
            if self._dir_error is None:
                lines.append("")
                data = "\n".join(lines).encode("utf-8", "surrogateescape")
                lines.pop()
                try:
                    self.run.append(n, rank, stream, data)
                except OSError as e:
                    # The supervisor ends the run; this reader goes on draining the pipe (so no
                    # rank blocks on it) and the consumer still gets the lines.
                    self._dir_failed(e)
            if dirty:
                lines = [_shown(x) for x in lines]
            events.append(LineBatch(n, rank, stream, tuple(lines), ts, hosts[n]))
        self._last_activity = time.monotonic()
        with self._cond:
            self._events.extend(events)
            self._pending_bytes += len(data)
            self._cond.notify_all()
            if self._pending_bytes > self.max_pending_bytes:
                # The consumer is behind (a busy screen): stop reading for a moment, as a
                # terminal does, instead of taking the GIL from it and piling up memory. The
                # ranks block on their pipe meanwhile; the wait is bounded, so a consumer that
                # does not poll only slows this down.
                self._cond.wait_for(
                    lambda: self._pending_bytes <= self.max_pending_bytes or self._final.is_set(),
                    PENDING_WAIT_S,
                )

    def _group_runs(self, node: int, stream: str, text: str) -> dict[_Key, list[str]]:
        """{(node, rank): [lines without prefixes, in order]} for ``text`` (whole lines) split
        by torchrun's ``[default<L>]:`` tee prefixes. ``_control_line`` sees only the lines
        without a rank prefix."""
        cls = type(self)
        ctrl = self._control_line if cls._control_line is not LaunchBackend._control_line else None
        base = node * self.manifest.gpus_per_node
        groups: dict[_Key, list[str]] = {}
        tee, next_tagged, runs = _TEE_STR_RE.match, _NEXT_TAGGED_RE.search, _RUNS
        pos, end_all = 0, len(text)
        while pos < end_all:
            m = tee(text, pos)
            if m is None:  # lines with no rank prefix, up to the next line that has one
                nm = next_tagged(text, pos)
                end = nm.end() if nm is not None else end_all
                self._untagged(node, stream, text[pos:end], ctrl, groups)
                pos = end
                continue
            g = m.group(1)
            run = runs.get(g)
            if run is None:
                run = _run_of(g)
            run_end, sep, plen, local = run
            em = run_end(text, pos)
            end = em.end() if em is not None else end_all
            # Every line up to ``end`` starts with this run's prefix: split on "\n" + prefix.
            lines = text[pos + plen : end - 1].split(sep)
            key = (node, base + local)
            lst = groups.get(key)
            if lst is None:
                groups[key] = lines
            else:
                lst += lines
            pos = end
        return groups

    def _untagged(
        self,
        node: int,
        stream: str,
        run: str,
        ctrl: Callable[[int, str, bytes], bool] | None,
        groups: dict[_Key, list[str]],
    ) -> None:
        """Lines of ``node`` no rank prefix names (launcher chatter, torchrun's failure table)."""
        lines = run.split("\n")
        if lines[-1] == "":
            lines.pop()
        kept = groups.setdefault((node, None), [])
        for line in lines:
            raw = line.encode("utf-8", "surrogateescape")
            if ctrl is not None and ctrl(node, stream, raw):
                continue
            self._scan_table(node, raw)
            kept.append(line)
        if not kept:
            del groups[(node, None)]

    def _group_per_line(self, node: int, stream: str, text: str) -> dict[_Key, list[str]]:
        """Like :meth:`_group_runs`, line by line through the subclass's ``_split``."""
        cls = type(self)
        ctrl = self._control_line if cls._control_line is not LaunchBackend._control_line else None
        groups: dict[_Key, list[str]] = {}
        lines = text.split("\n")
        lines.pop()  # text ends with a newline
        for line in lines:
            raw = line.encode("utf-8", "surrogateescape")
            if ctrl is not None and ctrl(node, stream, raw):
                continue
            n, rank, body = self._split(node, raw)
            if rank is None:
                self._scan_table(n, body)
            lst = groups.get((n, rank))
            if lst is None:
                groups[(n, rank)] = lst = []
            lst.append(body.decode("utf-8", "surrogateescape"))
        return groups

    def _scan_table(self, node: int, body: bytes) -> None:
        """Follow torchrun's ChildFailedError table in a node's unattributed lines."""
        if (
            b"rank" not in body
            and b"exitcode" not in body
            and b"Root Cause" not in body
            and b"Failures:" not in body
        ):
            return
        st = self._nodes[node]
        text = body.decode("utf-8", "replace")
        if "Root Cause" in text:
            st.root_cause = True
            return
        if text.startswith("Failures:"):
            st.root_cause = False
            return
        mr = _TABLE_RANK_RE.match(text)
        if mr:
            st.table_rank = int(mr.group(1))
            if st.root_cause:
                st.root_rank = st.table_rank
            return
        me = _TABLE_EXIT_RE.match(text)
        if me and st.table_rank is not None:
            st.rank_exits[st.table_rank] = int(me.group(1))
            st.table_rank = None

    def _emit(self, ev: Event) -> None:
        self._emit_many([ev])

    def _emit_many(self, evs: list[Event]) -> None:
        if not evs:
            return
        with self._cond:
            self._events.extend(evs)
            self._cond.notify_all()

    # ------------------------------------------------------------------ supervision

    def _supervise(self) -> None:
        try:
            while not self._final.is_set():
                if (
                    not self._stop_requested
                    and self._failure is None
                    and take_stop_request(self.run.path)
                ):
                    self.request_stop("stopped from the monitor")
                if self._dir_error is not None and self._failure is None:
                    self._fail(None, None, _dir_error_text(self._dir_error))
                self._check_nodes()
                self._final.wait(SUPERVISE_INTERVAL_S)
        except Exception as e:  # noqa: BLE001 - never leave a run without a final state
            self._fail(None, None, f"internal error while supervising: {type(e).__name__}: {e}")
            self._finish("failed", str(e))

    def _dir_failed(self, e: OSError) -> None:
        """A write to the run directory failed: remember the first error for the supervisor."""
        with self._cond:
            if self._dir_error is None:
                self._dir_error = e

    def _record(self, **fields: Any) -> None:
        """Update run.json from the supervisor's side: a full disk ends the run, never a
        thread."""
        try:
            self.run.update(**fields)
        except OSError as e:
            self._dir_failed(e)

    def _check_nodes(self) -> None:
        m = self.manifest
        all_done = True
        # Nodes whose torchrun printed a failure table first: they name the rank that failed.
        for st in sorted(self._nodes, key=lambda n: (not n.rank_exits, n.node)):
            if st.finished:
                continue
            finished, code = self._node_exit(st.node)
            with self._cond:
                streams_open = st.open_streams
            if st.lost and not finished:
                self._fail(None, st.node, f"node {st.node} ({st.host}): {st.lost}")
                finished, code = True, None
            if finished and streams_open > 0 and not st.lost:
                # The script ended but something it left behind still holds its output open:
                # give the pipes a moment to drain, then clean up what was left.
                if st.exited_at is None:
                    st.exited_at = time.monotonic()
                if time.monotonic() - st.exited_at > LINGER_S:
                    self._safe_kill(st.node, "the node script ended; stopping what it left behind")
                    streams_open = 0
            if not finished or (streams_open > 0 and not st.lost):
                all_done = False
                continue
            st.finished, st.exit_code = True, code
            self._node_finished(st)
        if not all_done and self._failure is None and not self._stop_requested:
            silent = time.monotonic() - self._last_activity
            if silent > self.options.hang_timeout_s:
                self._fail(
                    None,
                    None,
                    f"hang: no output from any rank for {silent:.0f}s "
                    f"(--hang-timeout {self.options.hang_timeout_s:g})",
                )
        if all_done:
            if self._stop_requested and self._failure is None:
                self._finish("stopped", self._stop_reason or "stopped by the user")
            elif self._failure is not None:
                self._finish("failed", self._failure[2])
            else:
                bad = [r for r in self.run.info.get("ranks", []) if r["exit_code"] != 0]
                if bad:
                    r = bad[0]
                    self._failure = (
                        r["rank"],
                        r["node_rank"],
                        f"rank {r['rank']} exited with {describe_exit(r['exit_code'])}",
                    )
                    self._record(failed_rank=r["rank"], failed_node=r["node_rank"])
                    self._finish("failed", self._failure[2])
                else:
                    self._finish("succeeded", f"all {m.world_size} ranks exited 0")

    def _node_finished(self, st: NodeState) -> None:
        m = self.manifest
        base = st.node * m.gpus_per_node
        killed_by_us = self._stop_requested or (
            self._failure is not None and self._failure[1] != st.node
        )
        for lr in range(m.gpus_per_node):
            rank = base + lr
            reason = ""
            if st.exit_code == 0:
                code: int | None = 0
            elif rank in st.rank_exits:
                code = st.rank_exits[rank]
            elif st.lost:
                code, reason = None, st.lost
            else:
                code = None
                reason = (
                    "stopped" if killed_by_us else f"node exited with {describe_exit(st.exit_code)}"
                )
            try:
                self.run.set_rank_exit(rank, code, reason)
            except OSError as e:
                self._dir_failed(e)
            self._emit(RankExit(st.node, rank, code, time.time(), st.host, reason))
        if st.exit_code != 0 and not killed_by_us and self._failure is None:
            root = st.root_rank
            if root is None:
                nonzero = [r for r, c in sorted(st.rank_exits.items()) if c != 0]
                root = nonzero[0] if nonzero else None
            if root is not None:
                code = st.rank_exits.get(root)
                self._fail(
                    root,
                    st.node,
                    f"rank {root} on node {st.node} ({st.host}) exited with {describe_exit(code)}",
                )
            else:
                self._fail(
                    None,
                    st.node,
                    f"node {st.node} ({st.host}) launch script exited with {describe_exit(st.exit_code)}",
                )

    def _fail(self, rank: int | None, node: int | None, reason: str) -> None:
        if self._failure is not None or self._final.is_set():
            return
        self._failure = (rank, node, reason)
        self._record(failed_rank=rank, failed_node=node, reason=reason)
        self._emit(
            LineEvent(
                node if node is not None else 0,
                None,
                STDERR,
                f"[dtrain-tui] {reason}; stopping the other ranks",
                time.time(),
            )
        )
        self._kill_all(reason)

    def _kill_all(self, reason: str) -> None:
        threads = [
            threading.Thread(target=self._safe_kill, args=(st.node, reason), daemon=True)
            for st in self._nodes
            if not st.finished
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(STOP_GRACE_S + 10)

    def _safe_kill_now(self, node: int) -> None:
        try:
            self._kill_node_now(node)
        except Exception as e:  # noqa: BLE001 - report, keep killing the others
            self._emit(
                LineEvent(
                    node, None, STDERR, f"[dtrain-tui] could not kill node {node}: {e}", time.time()
                )
            )

    def _safe_kill(self, node: int, reason: str) -> None:
        try:
            self._kill_node(node, reason)
        except Exception as e:  # noqa: BLE001 - report, keep stopping the others
            self._emit(
                LineEvent(
                    node, None, STDERR, f"[dtrain-tui] could not stop node {node}: {e}", time.time()
                )
            )

    def _finish(self, state: str, message: str) -> None:
        with self._cond:
            if self._final.is_set() or self._finishing:
                return
            self._finishing = True
            self._state = state
        for t in self._threads:
            t.join(2.0)
        fr = self._failure
        fields: dict[str, Any] = {"state": state, "ended_at": iso(time.time()), "reason": message}
        if fr is not None:
            fields.update(failed_rank=fr[0], failed_node=fr[1])
        self._record(**fields)
        self.run.close()
        try:
            self._close()
        finally:
            failed = (fr[0],) if fr is not None and fr[0] is not None else ()
            self._emit(RunStateChanged(state, message, time.time(), failed))
            self._final.set()
            with self._cond:
                self._cond.notify_all()

    # ------------------------------------------------------------------ helpers

    def node_env(self) -> dict[str, str]:
        """Environment every node's script gets (besides the bundle's nccl.env)."""
        env = dict(self.options.env)
        env["DTRAIN_RUN_ID"] = self.run_id
        env["PYTHONUNBUFFERED"] = "1"
        if self.options.nccl_debug:
            env["NCCL_DEBUG"] = self.options.nccl_debug
        if self.options.nccl_debug_subsys:
            env["NCCL_DEBUG_SUBSYS"] = self.options.nccl_debug_subsys
        if self.options.master_port:
            env["MASTER_PORT"] = str(self.options.master_port)
        return env


def _dir_error_text(e: OSError) -> str:
    """``run directory full (No space left on device: /path)``: the run's final reason."""
    what = e.strerror or str(e)
    where = f": {e.filename}" if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"run directory full ({what}{where})"
    return f"cannot write the run directory ({what}{where})"


STREAMS = (STDOUT, STDERR)

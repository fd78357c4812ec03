"""SSH backend (paramiko): every node over its own connection, all in parallel.

Start is all or nothing: connect to every node (:mod:`engine.launch.ssh_connect`: ssh config,
host keys checked against known_hosts), and start one wrapper per node, which
receives the bundle (one tar) on its stdin, unpacks it, runs ``--remote-setup`` and reports ready;
only when every node is ready does any node get "go" and start its script. A node that cannot be
reached, fails auth or whose setup fails is reported by name and nothing is started; the wrappers
that were ready remove what they unpacked.

Per node that is one TCP connection (key exchange, one public-key auth) and one exec channel: no
SFTP session, no second channel, no further round trips. ssh config and known_hosts are read
once per start and a key file is parsed once for all nodes; the bundle is tarred once.

On each node the script runs inside a wrapper (:mod:`engine.launch.ssh_remote`) that cleans up
when the connection drops; ``stop`` does the same over a fresh channel.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from engine.launch import reaper
from engine.launch.base import LaunchBackend
from engine.launch.driver import DumpReach
from engine.launch.options import LaunchOptions
from engine.launch.policy import STOP_GRACE_S
from engine.launch.pump import ControlLine, Split
from engine.launch.run_state import LaunchError, RunContext
from engine.launch.ssh_connect import HostKeyError, SshConnector, Target
from engine.launch.ssh_remote import (
    EARLY_EXIT,
    READY_RE,
    ckpt_dir_of,
    kill_now_command,
    node_wrapper,
    reach_commands,
    remote_dir_expr,
    stop_command,
)
from engine.plan.specs import Host
from engine.rundir.events import STDERR, STDOUT
from engine.write.manifest import BundleManifest
from engine.write.slurm import NODE_REAPER


class SshDriver:
    """Starts each node's script over SSH, stops it over a fresh channel."""

    dump_reach: DumpReach = DumpReach.EACH_NODE
    split: Split | None = None

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.control: ControlLine | None = self._control_line
        self.connector = SshConnector(ctx.options)
        """Every connection of the run (jump hosts too): closed at the end."""
        self.channels: list[Any] = []
        """Each node's exec channel (its wrapper's stdin, stdout and stderr)."""
        self._pgids: dict[int, int] = {}
        self._pgid_seen = threading.Condition()
        self._tar_lock = threading.Lock()
        self.killed: set[int] = set()  # the nodes whose stop was sent
        self.clients: list[Any] = []  # each node's connection
        self._went: set[int] = set()
        self._tar: bytes | None = None
        self._aborted = False
        self._targets: list[Target] = []

    # ------------------------------------------------------------------ start

    def hosts(self) -> list[str]:
        return self.ctx.given_hosts()

    def start_nodes(self) -> None:
        cfg = self.connector.ssh_config()
        targets = [self.connector.target(i, h, cfg) for i, h in enumerate(self.ctx.options.hosts)]
        self._targets = targets
        n = len(targets)
        self.clients = [None] * n
        self.channels = [None] * n
        # Once for every node, before any connection: the tar, known_hosts, the key file.
        self._bundle_tar()
        self.connector.prepare(targets)

        # Every node at once: connect, start the wrapper (one exec channel), which receives the
        # bundle on stdin, unpacks it, runs --remote-setup, reports ready and then waits for
        # "go". Only when every node is ready does any node get "go": a node that can't be
        # reached, fails auth or whose setup fails is named and nothing runs anywhere.
        def prepare(t: Target) -> None:
            self.clients[t.node] = self.connector.connect(t, cfg)
            self._launch_node(t)
            self._wait_ready(t)

        errors: list[str] = []
        keys: list[tuple[str, str, str, str]] = []
        with ThreadPoolExecutor(max_workers=min(32, n)) as pool:
            futs = [pool.submit(prepare, t) for t in targets]
            for t, f in zip(targets, futs, strict=True):
                try:
                    f.result()
                except Exception as e:  # noqa: BLE001 - every node's failure is reported
                    if isinstance(e, HostKeyError):
                        keys.extend(e.keys)
                    errors.append(e.message if isinstance(e, LaunchError) else f"{t.label}: {e}")
        self.connector.clients.extend(c for c in self.clients if c is not None)
        for note in self.connector.notes:
            self.ctx.run.append(0, None, STDERR, f"[dtrain-tui] {note}\n".encode())
        if errors:
            self._abort_prepared()
            msg = "; ".join(errors) + " — nothing was started"
            if keys:
                raise HostKeyError(msg, field="ssh", keys=keys)
            raise LaunchError(msg, field="ssh")
        try:
            where = ckpt_dir_of(self.ctx.run.bundle, self.ctx.node_env())
            check_ckpt_shared(self.clients, targets, where, self.ctx.run_id)
        except LaunchError:
            self._abort_prepared()
            raise
        for t in targets:  # every node is ready: go (milliseconds apart)
            chan = self.channels[t.node]
            assert chan is not None
            try:
                chan.sendall(b"go\n")
                self._went.add(t.node)
            except Exception as e:  # noqa: BLE001
                raise LaunchError(
                    f"{t.label}: connection lost while starting: {e}", field="ssh"
                ) from None

    def _wait_ready(self, t: Target) -> None:
        chan = self.channels[t.node]
        # Unpacking and --remote-setup (a venv, a pip install) are start-up: --start-timeout.
        limit = max(self.ctx.options.connect_timeout_s, self.ctx.options.start_timeout_s)
        deadline = time.monotonic() + limit
        with self._pgid_seen:
            while t.node not in self._pgids:
                if chan is None or chan.exit_status_ready() or chan.closed:
                    code = (
                        chan.recv_exit_status()
                        if chan is not None and chan.exit_status_ready()
                        else None
                    )
                    why = EARLY_EXIT.get(code or 0, f"exited with status {code}")
                    raise LaunchError(
                        f"{t.label}: {why} before starting (see its log in the run directory)",
                        field="ssh",
                    )
                if time.monotonic() > deadline:
                    raise LaunchError(
                        f"{t.label}: not ready after {limit:.0f}s (--remote-setup still "
                        "running? --start-timeout gives it longer)",
                        field="ssh",
                    )
                self._pgid_seen.wait(0.05)

    def _abort_prepared(self) -> None:
        """After a failed start: close every wrapper's stdin before "go" (it then removes what
        it unpacked and exits without running anything) and wait until they did. A wrapper still
        busy (a slow --remote-setup) has its directory removed over a fresh channel instead."""
        if self._aborted:
            return
        self._aborted = True
        waiting: list[int] = []
        for node, chan in enumerate(self.channels):
            if chan is not None and node not in self._went:
                with contextlib.suppress(Exception):
                    chan.shutdown_write()
                waiting.append(node)
        deadline = time.monotonic() + 3.0
        for node in waiting:
            # paramiko sets status_event on the exit status and on the channel closing.
            self.channels[node].status_event.wait(max(0.0, deadline - time.monotonic()))
        for node in waiting:
            chan, client = self.channels[node], self.clients[node]
            if chan.exit_status_ready() or chan.closed or client is None:
                continue
            with contextlib.suppress(Exception):
                _run_quiet(
                    client,
                    f"dir={self._remote_dir_expr(node)}; "
                    'rm -rf -- "$dir"; rmdir -- "${dir%/*}" 2>/dev/null; true',
                )

    def _remote_dir_expr(self, node: int) -> str:
        return remote_dir_expr(self.ctx.options.remote_workdir, self.ctx.run_id, node)

    def _bundle_tar(self) -> bytes:
        """The run's bundle as one tar (:func:`bundle_tar`), built once for all nodes."""
        with self._tar_lock:
            if self._tar is None:
                self._tar = bundle_tar(self.ctx.run.bundle)
            return self._tar

    def master_addr(self) -> str | None:
        """MASTER_ADDR handed to every node, or None to keep the bundle's
        (:func:`master_addr_for`, node 0 as this launcher reaches it once connected)."""
        node0 = self._targets[0].hostname if self._targets else None
        return master_addr_for(self.ctx.manifest, self.ctx.options, node0)

    def remote_command(self, node: int) -> str:
        """The exact command sent to ``node`` (also written to RUN/commands/node<i>.txt). Its
        stdin first carries the bundle tar (exactly its size, read by ``head -c``), then "go"."""
        env = self.ctx.node_env()
        addr = self.master_addr()
        if addr is not None:
            env["MASTER_ADDR"] = addr
        return node_wrapper(
            env,
            node,
            script=self.ctx.manifest.node_scripts[node],
            setup=self.ctx.options.remote_setup,
            dir_expr=self._remote_dir_expr(node),
            tar_size=len(self._bundle_tar()),
        )

    def _launch_node(self, t: Target) -> None:
        """Start the node's wrapper on one exec channel and send it the bundle on stdin."""
        tar = self._bundle_tar()
        cmd = self.remote_command(t.node)
        self.ctx.run.write_command(t.node, cmd)
        client = self.clients[t.node]
        transport = client.get_transport()
        try:
            chan = transport.open_session()
            chan.exec_command(cmd)
        except Exception as e:  # noqa: BLE001
            raise LaunchError(
                f"{t.label}: cannot start the node script: {e}", field="ssh"
            ) from None
        self.channels[t.node] = chan
        self.ctx.add_stream(t.node, STDOUT, lambda: chan.recv(65536))
        self.ctx.add_stream(t.node, STDERR, lambda: chan.recv_stderr(65536))
        try:
            chan.sendall(tar)
        except Exception as e:  # noqa: BLE001
            if not (chan.closed or chan.exit_status_ready()):
                raise LaunchError(
                    f"{t.label}: sending the bundle failed: {e}", field="ssh"
                ) from None
            # The wrapper exited before reading it all: _wait_ready reports why.

    def _control_line(self, node: int, stream: str, line: bytes) -> bool:
        if stream == STDOUT and node not in self._pgids:
            m = READY_RE.match(line)
            if m:
                with self._pgid_seen:
                    self._pgids[node] = int(m.group(1))
                    self._pgid_seen.notify_all()
                return True
        return False

    # ------------------------------------------------------------------ running

    def node_exit(self, node: int) -> tuple[bool, int | None]:
        chan = self.channels[node]
        if chan is None:
            return True, None
        transport = chan.get_transport()
        if chan.exit_status_ready():
            status = int(chan.recv_exit_status())
            if status != -1:
                return True, status
            # -1: the channel closed without an exit status (paramiko's convention).
            self.ctx.node_lost(node, "connection lost (no exit status received)")
            return False, None
        if transport is None or not transport.is_active():
            self.ctx.node_lost(node, "connection lost")
        elif chan.closed:
            self.ctx.node_lost(node, "channel closed without an exit status")
        return False, None

    def kill_node(self, node: int, reason: str) -> None:
        if node in self.killed:
            return
        self.killed.add(node)
        client = self.clients[node] if node < len(self.clients) else None
        chan = self.channels[node] if node < len(self.channels) else None
        pgid = self._pgids.get(node)
        if client is None:
            return
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            return  # the node's own watcher cleans up when its connection drops
        with contextlib.suppress(Exception):
            kc = transport.open_session()
            kc.exec_command(stop_command(self.ctx.run_id, node, pgid))
            kc.status_event.wait(STOP_GRACE_S + 10)  # set by paramiko when the exit status came
            kc.close()
        if chan is not None:
            chan.status_event.wait(5)

    def ask_dumps(self, node: int | None) -> int:
        """The dump request to the node's ranks over a fresh channel: each prints its Flight
        Recorder dump (:mod:`engine.launch.frdump`); how many were asked."""
        if node is None:
            return sum(self.ask_dumps(n) for n in range(len(self.clients)))
        from engine.launch.frdump import remote_dump_command

        client = self.clients[node] if node < len(self.clients) else None
        transport = client.get_transport() if client is not None else None
        if transport is None or not transport.is_active():
            return 0
        chan = transport.open_session()
        try:
            chan.exec_command(remote_dump_command(self.ctx.run_id, node))
            chan.status_event.wait(10)  # set by paramiko when the exit status came
            out = chan.recv(64) if chan.recv_ready() else b""
        finally:
            chan.close()
        return int(out.strip() or 0)

    def kill_node_now(self, node: int) -> None:
        """SIGKILL, at once, everything of the run on ``node`` (``kill()``, a second Ctrl-C):
        the group and every process tagged with the run id, over a fresh channel. Unlike
        :meth:`kill_node` it runs even while a stop is under way; that stop's grace loop on
        the node then finds nothing left and ends."""
        client = self.clients[node] if node < len(self.clients) else None
        transport = client.get_transport() if client is not None else None
        if transport is None or not transport.is_active():
            return  # the node's own watcher cleans up when its connection drops
        with contextlib.suppress(Exception):
            _run_quiet(client, kill_now_command(self.ctx.run_id, node, self._pgids.get(node)))

    def teardown_after_failed_start(self) -> None:
        for i in sorted(self._went):  # only nodes told "go" run anything
            self.kill_node(i, "start failed")
        self._abort_prepared()
        self.close()

    def close(self) -> None:
        self.connector.close()


class SshBackend(LaunchBackend):
    """Run each node's script over SSH."""

    name = "ssh"

    def __init__(
        self, bundle_dir: Path, run_dir: Path | None = None, options: LaunchOptions | None = None
    ) -> None:
        ctx = RunContext(bundle_dir, run_dir, options, backend=self.name)
        self.driver: SshDriver = SshDriver(ctx)
        super().__init__(ctx, self.driver)

    def master_addr(self) -> str | None:
        """MASTER_ADDR handed to every node (:meth:`SshDriver.master_addr`)."""
        return self.driver.master_addr()

    def remote_command(self, node: int) -> str:
        """The exact command sent to ``node`` (:meth:`SshDriver.remote_command`)."""
        return self.driver.remote_command(node)


def check_ckpt_shared(
    clients: list[Any], targets: list[Target], where: str | None, run_id: str
) -> None:
    """With several nodes that checkpoint to ``where`` (:func:`ckpt_dir_of`; None: no
    checkpoints): node 0 writes a file in the directory and every other node must read it
    back, or nothing starts (each node would save its shards to its own disk and no restart
    could resume). LaunchError names the node."""
    if where is None or len(targets) < 2:
        return
    fix = (
        "put it on storage every node mounts (--env DTRAIN_CKPT_DIR=/shared/path, or write "
        "the bundle with --ckpt-dir /shared/path; --ckpt-every 0 for no checkpoints) — "
        "nothing was started"
    )
    if not (where.startswith("/") or where == "~" or where.startswith("~/")):
        raise LaunchError(
            f"checkpoint directory {where!r} is relative: each node would resolve it in its "
            f"own copy of the bundle and no restart could resume; {fix}",
            field="DTRAIN_CKPT_DIR",
        )
    write, check, clean = reach_commands(where, run_id, secrets.token_hex(8))
    first = targets[0]
    if _run_quiet(clients[first.node], write) != 0:
        raise LaunchError(
            f"{first.label}: cannot write in the checkpoint directory {where!r}; {fix}",
            field="DTRAIN_CKPT_DIR",
        )
    try:
        with ThreadPoolExecutor(max_workers=min(32, len(targets) - 1)) as pool:
            seen = list(pool.map(lambda t: _run_quiet(clients[t.node], check), targets[1:]))
    finally:
        with contextlib.suppress(Exception):
            _run_quiet(clients[first.node], clean)
    blind = [t.label for t, code in zip(targets[1:], seen, strict=True) if code != 0]
    if blind:
        raise LaunchError(
            f"{', '.join(blind)} cannot see the checkpoint directory {where!r} that "
            f"{first.label} writes to: the nodes do not share it, so no restart could "
            f"resume; {fix}",
            field="DTRAIN_CKPT_DIR",
        )


def master_addr_for(
    manifest: BundleManifest, options: LaunchOptions, node0: str | None = None
) -> str | None:
    """MASTER_ADDR handed to every node, or None to keep the bundle's. The bundle's address
    stays when it was written for these hosts (or set by the user, e.g. an InfiniBand address);
    a bundle written without hosts has none (its scripts refuse to start without MASTER_ADDR),
    and one written for other hosts names the wrong machine: then it is node 0's address as
    this launcher reaches it (``node0``, after ~/.ssh/config; else as the options name it).
    ``MASTER_ADDR`` in the run's environment always wins."""
    if manifest.nodes < 2 or "MASTER_ADDR" in options.env or not options.hosts:
        return None
    written = manifest.hosts
    if written:
        try:
            first = Host.parse(written[0])
        except ValueError:
            first = None
        if first is None or first == options.hosts[0]:
            return None
        if manifest.master_addr != first.host:
            return None  # chosen by the user, not derived from the hosts
    return node0 if node0 is not None else options.hosts[0].host


def bundle_tar(bundle: Path) -> bytes:
    """``bundle`` (but its logs) as one uncompressed tar, modes kept, with the node reaper
    (:data:`engine.write.slurm.NODE_REAPER`) beside it: each node's script runs under it."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(bundle.iterdir()):
            if path.name not in ("logs", NODE_REAPER):
                tar.add(path, arcname=path.name, filter=_owned_by_extractor)
        tar.add(reaper.__file__, arcname=NODE_REAPER, filter=_owned_by_extractor)
    return buf.getvalue()


def _owned_by_extractor(info: Any) -> Any:
    """No local owner in the tar: unpacked (even as root) the files belong to the remote user."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _run_quiet(client: Any, cmd: str, timeout: float = 10.0) -> int:
    """Run ``cmd`` on a connected client; its exit status (-1 on timeout)."""
    chan = client.get_transport().open_session()
    chan.exec_command(cmd)
    chan.status_event.wait(timeout)  # set by paramiko when the exit status came
    status = int(chan.recv_exit_status()) if chan.exit_status_ready() else -1
    chan.close()
    return status

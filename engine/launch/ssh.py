"""SSH backend (paramiko): every node over its own connection, all in parallel.

Start is all or nothing: connect to every node (``~/.ssh/config`` through paramiko's own
``SSHConfig``: alias, user, port, identity file, ProxyJump; key file by path or the agent), check
each host key against known_hosts (an unknown key is refused, with its SHA256 fingerprint, unless
the user accepts new keys; a changed key is always refused), and start one wrapper per node, which
receives the bundle (one tar) on its stdin, unpacks it, runs ``--remote-setup`` and reports ready;
only when every node is ready does any node get "go" and start its script. A node that cannot be
reached, fails auth or whose setup fails is reported by name and nothing is started; the wrappers
that were ready remove what they unpacked.

Per node that is one TCP connection (key exchange, one public-key auth) and one exec channel: no
SFTP session, no second channel, no further round trips. ssh config and known_hosts are read
once per start and a key file is parsed once for all nodes; the bundle is tarred once.

On each node the script runs under ``setsid`` (its own session and process group) inside a small
bash wrapper that prints the group id first (``@@dtrain-ready N``, consumed here, never logged)
and watches the SSH channel's stdin: when the connection drops, stdin reaches EOF and the wrapper
kills the group and every process tagged with the run's ``DTRAIN_RUN_ID``. ``stop`` does the same
over a fresh channel. Nothing typed by the user reaches a remote shell unquoted, except
``--remote-setup``, which is a shell command by design.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, cast

from engine.launch.base import STOP_GRACE_S, LaunchBackend, LaunchError
from engine.monitor.events import STDERR, STDOUT
from engine.plan.specs import Host

_READY_RE = re.compile(rb"^@@dtrain-ready (\d+)$")
# What a wrapper's early exit status means (see remote_command).
_EARLY_EXIT = {
    96: "--remote-setup failed",
    97: "cannot enter the remote work directory",
    98: "cannot receive or unpack the bundle (are head and tar installed?)",
    99: "start cancelled",
}

# Client-side preference among the ciphers paramiko offers: AES-GCM first (one AEAD pass per
# packet instead of AES-CTR plus a separate HMAC); the rest of paramiko's order follows unchanged.
_PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")

# Kill, on one node, every process whose environment carries DTRAIN_RUN_ID=$RID and
# DTRAIN_NODE=$NODE (torchrun starts its ranks in sessions of their own, so a process-group kill
# alone can miss them; the node number keeps two nodes of a run on one machine apart). Each
# NUL-separated entry is compared with the whole string "DTRAIN_RUN_ID=$RID" by bash itself
# (a quoted right-hand side of == is literal): no pattern language, so no character of a run id
# (a newline, a dot, a star) can make it match another process. Its status is 0 when it found
# one (``dtrain_sweep 0``: is anything of the run left?).
_SWEEP_FN = (
    "dtrain_sweep() { local e p v r n found=1; for e in /proc/[0-9]*/environ; do p=${e#/proc/}; "
    "p=${p%/environ}; r=; n=; while IFS= read -r -d '' v; do "
    '[[ "$v" == "DTRAIN_RUN_ID=$RID" ]] && r=1; [[ "$v" == "DTRAIN_NODE=$NODE" ]] && n=1; '
    'done 2>/dev/null < "$e"; '
    'if [ -n "$r" ] && [ -n "$n" ]; then kill -"$1" "$p" 2>/dev/null && found=0; fi; '
    "done; return $found; }"
)
# Shell: wait up to STOP_GRACE_S for the run's processes to end after SIGTERM (``$1``: the
# process group, or empty), then SIGKILL what is left.
_GRACE_FN = (
    f"dtrain_grace() {{ local i; for i in $(seq {int(STOP_GRACE_S * 5)}); do "
    '{ [ -n "$1" ] && kill -0 -- "-$1" 2>/dev/null; } || dtrain_sweep 0 || break; sleep 0.2; '
    'done; dtrain_sweep KILL; [ -n "$1" ] && kill -KILL -- "-$1" 2>/dev/null; true; }'
)


class HostKeyError(LaunchError):
    """A host key is unknown (without consent) or changed. ``keys`` lists, for a UI asking the
    user, ``(node label, "unknown" | "changed", key type, SHA256 fingerprint)`` per host."""

    def __init__(
        self, message: str, *, field: str = "", keys: list[tuple[str, str, str, str]] | None = None
    ) -> None:
        super().__init__(message, field=field)
        self.keys = list(keys or [])


def fingerprint(key: Any) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint of a paramiko key."""
    import base64
    import hashlib

    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


@dataclass
class Target:
    """Where one node really is, after ~/.ssh/config."""

    node: int
    label: str
    hostname: str
    port: int
    user: str | None
    identity: list[str]
    proxy_jump: str | None


class _HostKeyPolicy:
    """paramiko MissingHostKeyPolicy: refuse unknown keys unless accepted; record accepted ones."""

    def __init__(self, backend: SshBackend, label: str) -> None:
        self.backend = backend
        self.label = label

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        fp = fingerprint(key)
        opts = self.backend.options
        if not opts.accept_new_host_keys:
            raise HostKeyError(
                f"{self.label}: unknown host key {key.get_name()} {fp} for {hostname}; check it, "
                "then pass --accept-new-host-keys (or add it to --known-hosts)",
                field="host key",
                keys=[(self.label, "unknown", key.get_name(), fp)],
            )
        if self.backend._record_host_key(hostname, key, self.label):
            self.backend._notes.append(f"{self.label}: accepted new host key {key.get_name()} {fp}")


class SshBackend(LaunchBackend):
    """Run each node's script over SSH."""

    name = "ssh"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clients: list[Any] = []
        self._chans: list[Any] = []
        self._pgids: dict[int, int] = {}
        self._pgid_seen = threading.Condition()
        self._kh_lock = threading.Lock()
        self._notes: list[str] = []
        self._killed: set[int] = set()
        self._node_clients: list[Any] = []
        self._keys: dict[str, Any] = {}
        self._went: set[int] = set()
        self._tar: bytes | None = None
        self._host_keys: Any = None  # known_hosts, parsed once per start
        self._aborted = False
        self._targets: list[Target] = []

    # ------------------------------------------------------------------ host resolution

    def _known_hosts_path(self) -> Path:
        return Path(self.options.known_hosts or Path.home() / ".ssh" / "known_hosts").expanduser()

    def _ssh_config(self) -> Any:
        import paramiko

        path = self.options.ssh_config or Path.home() / ".ssh" / "config"
        path = Path(path).expanduser()
        if path.is_file():
            try:
                return paramiko.SSHConfig.from_path(str(path))
            except Exception as e:  # noqa: BLE001
                raise LaunchError(f"{path}: cannot parse: {e}", field="--ssh-config") from None
        return paramiko.SSHConfig()

    def _target(self, node: int, host: Host, cfg: Any, *, jump: bool = False) -> Target:
        """Where ``host`` really is. The user: ``user@`` in the host, else (for a node, not a
        jump host, as ``ssh -l`` does) the profile's ``launch.ssh_user``, else ssh config's."""
        c = cfg.lookup(host.host)
        ident: list[str] = []
        if self.options.identity_file:
            ident = [str(Path(self.options.identity_file).expanduser())]
        elif c.get("identityfile"):
            ident = [os.path.expanduser(p) for p in c["identityfile"]]
        return Target(
            node=node,
            label=f"node {node} ({host})",
            hostname=str(c.get("hostname", host.host)).strip("[]"),  # [::1] -> ::1
            port=int(host.port or c.get("port", 22)),
            user=host.user or (None if jump else self.options.ssh_user) or c.get("user"),
            identity=ident,
            proxy_jump=c.get("proxyjump"),
        )

    def _load_known_hosts(self) -> Any:
        """known_hosts as paramiko ``HostKeys``, read once for all nodes (empty when missing)."""
        import paramiko

        kh = self._known_hosts_path()
        keys = paramiko.HostKeys()
        if kh.is_file():
            try:
                keys.load(str(kh))
            except Exception as e:  # noqa: BLE001
                raise LaunchError(
                    f"{kh}: cannot read known hosts: {e}", field="--known-hosts"
                ) from None
        return keys

    def _record_host_key(self, hostname: str, key: Any, label: str) -> bool:
        """Append an accepted key to the known_hosts file (never other key material), once per
        start; later connections (another node through the same jump host) then check it as a
        known key. False when another connection of this start already accepted this very key;
        a different key for the same host (two connections racing, one of them intercepted) is
        refused as changed."""
        path = self._known_hosts_path()
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with self._kh_lock:
            if self._host_keys is None:
                self._host_keys = self._load_known_hosts()
            known = self._host_keys.lookup(hostname)
            if known:
                if key in known.values():
                    return False
                first = next(iter(known.values()))
                raise HostKeyError(
                    f"{label}: host key CHANGED for {hostname} while starting: got "
                    f"{key.get_name()} {fingerprint(key)}, another connection accepted "
                    f"{fingerprint(first)}; refusing",
                    field="host key",
                    keys=[(label, "changed", key.get_name(), fingerprint(key))],
                )
            self._host_keys.add(hostname, key.get_name(), key)
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.write(line)
            return True

    def _jump_chain(self, t: Target, cfg: Any, depth: int) -> Any:
        """Connect through ``ProxyJump a[,b...]`` hop by hop; a channel to ``t`` at the end."""
        if depth >= 4:
            raise LaunchError(
                f"{t.label}: ProxyJump nests too deep (a loop in ssh config?)", field="ssh"
            )
        assert t.proxy_jump is not None
        try:
            hops = [Host.parse(h) for h in t.proxy_jump.split(",") if h.strip()]
        except ValueError as e:
            raise LaunchError(f"{t.label}: ProxyJump: {e}", field="ssh") from None
        sock = None
        for k, hop in enumerate(hops):
            ht = self._target(t.node, hop, cfg, jump=True)
            ht.label = f"{t.label} via jump host {hop}"
            if k > 0:
                ht.proxy_jump = None  # the chain is spelled out: no hop's own ProxyJump
            client = self._connect(ht, cfg, depth + 1, sock=sock)
            self._clients.append(client)
            if k + 1 < len(hops):
                nxt = self._target(t.node, hops[k + 1], cfg, jump=True)
                dest = (nxt.hostname, nxt.port)
            else:
                dest = (t.hostname, t.port)
            try:
                sock = client.get_transport().open_channel("direct-tcpip", dest, ("127.0.0.1", 0))
            except Exception as e:  # noqa: BLE001
                raise LaunchError(
                    f"{ht.label}: cannot forward to {dest[0]}:{dest[1]}: {e}", field="ssh"
                ) from None
        return sock

    def _load_key(self, path: str) -> Any:
        """The private key at ``path``, parsed once for all nodes (None: let paramiko try the
        file itself, e.g. a key needing a passphrase the agent holds). Kept in memory only."""
        import paramiko

        with self._kh_lock:
            if path not in self._keys:
                try:
                    self._keys[path] = paramiko.PKey.from_path(path)
                except Exception:  # noqa: BLE001 - paramiko reports the real problem on connect
                    self._keys[path] = None
            return self._keys[path]

    def _connect(self, t: Target, cfg: Any, depth: int = 0, sock: Any = None) -> Any:
        import paramiko

        if sock is None and t.proxy_jump and t.proxy_jump.lower() != "none":
            sock = self._jump_chain(t, cfg, depth)
        client = paramiko.SSHClient()
        kh = self._known_hosts_path()
        # Only this host's known keys (from the known_hosts read once for every node), under
        # the name paramiko checks: "[host]:port", or "host" for port 22.
        name = known_hosts_name(t.hostname, t.port)
        with self._kh_lock:
            if self._host_keys is None:
                self._host_keys = self._load_known_hosts()
            known = self._host_keys.lookup(name)
            for ktype, key in (known or {}).items():
                client.get_host_keys().add(name, ktype, key)
        # Duck-typed policy (paramiko is imported only inside functions, so no subclass here).
        client.set_missing_host_key_policy(cast(Any, _HostKeyPolicy(self, t.label)))
        to = self.options.connect_timeout_s
        if sock is None:
            try:
                sock = socket.create_connection((t.hostname, t.port), timeout=to)
            except OSError as e:
                raise LaunchError(
                    f"{t.label}: cannot connect to {t.hostname}:{t.port}: {e.strerror or e}",
                    field="ssh",
                ) from None
            # SSH start-up is many small request/response messages: without TCP_NODELAY each
            # one waits out Nagle plus the peer's delayed ACK (~40 ms a round trip).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pkey = self._load_key(t.identity[0]) if len(t.identity) == 1 else None
        try:
            client.connect(
                t.hostname,
                port=t.port,
                username=t.user,
                pkey=pkey,
                key_filename=None if pkey is not None else cast(Any, t.identity or None),
                allow_agent=True,
                look_for_keys=not t.identity,
                timeout=to,
                banner_timeout=to,
                auth_timeout=to,
                sock=sock,
                transport_factory=_transport,
            )
        except HostKeyError:
            client.close()
            raise
        except paramiko.BadHostKeyException as e:
            client.close()
            raise HostKeyError(
                f"{t.label}: host key CHANGED for {t.hostname}: got {e.key.get_name()} "
                f"{fingerprint(e.key)}, known_hosts has {fingerprint(e.expected_key)}; refusing "
                f"(if the host was really reinstalled, remove its line from {kh})",
                field="host key",
                keys=[(t.label, "changed", e.key.get_name(), fingerprint(e.key))],
            ) from None
        except paramiko.AuthenticationException as e:
            client.close()
            how = (
                f"key file {', '.join(t.identity)}"
                if t.identity
                else "the SSH agent and default keys"
            )
            raise LaunchError(
                f"{t.label}: authentication failed as {t.user or 'the current user'} with {how} ({e}); "
                "pass the right --identity KEYFILE or load the key into ssh-agent",
                field="ssh",
            ) from None
        except (OSError, paramiko.SSHException) as e:
            tr = client.get_transport()
            banner = bool(getattr(tr, "remote_version", "")) if tr is not None else False
            client.close()
            if not banner:
                # paramiko then says "No existing session" or "Error reading SSH protocol
                # banner", which points nowhere: say what was seen.
                raise LaunchError(
                    f"{t.label}: {t.hostname}:{t.port} accepted the connection but sent no SSH "
                    f"banner within {to:g}s ({e}); is sshd listening on that port?",
                    field="ssh",
                ) from None
            raise LaunchError(
                f"{t.label}: cannot connect to {t.hostname}:{t.port}: {e}", field="ssh"
            ) from None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(5)
        return client

    # ------------------------------------------------------------------ start

    def _start(self) -> None:
        cfg = self._ssh_config()
        targets = [self._target(i, h, cfg) for i, h in enumerate(self.options.hosts)]
        self._targets = targets
        n = len(targets)
        self._node_clients = [None] * n
        self._chans = [None] * n
        # Once for every node, before any connection: the tar, known_hosts, the key file.
        self._bundle_tar()
        with self._kh_lock:
            self._host_keys = self._load_known_hosts()
        for t in targets:
            if len(t.identity) == 1:
                self._load_key(t.identity[0])

        # Every node at once: connect, start the wrapper (one exec channel), which receives the
        # bundle on stdin, unpacks it, runs --remote-setup, reports ready and then waits for
        # "go". Only when every node is ready does any node get "go": a node that can't be
        # reached, fails auth or whose setup fails is named and nothing runs anywhere.
        def prepare(t: Target) -> None:
            self._node_clients[t.node] = self._connect(t, cfg)
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
        self._clients.extend(c for c in self._node_clients if c is not None)
        for note in self._notes:
            self.run.append(0, None, STDERR, f"[dtrain-tui] {note}\n".encode())
        if errors:
            self._abort_prepared()
            msg = "; ".join(errors) + " — nothing was started"
            if keys:
                raise HostKeyError(msg, field="ssh", keys=keys)
            raise LaunchError(msg, field="ssh")
        for t in targets:  # every node is ready: go (milliseconds apart)
            chan = self._chans[t.node]
            assert chan is not None
            try:
                chan.sendall(b"go\n")
                self._went.add(t.node)
            except Exception as e:  # noqa: BLE001
                raise LaunchError(
                    f"{t.label}: connection lost while starting: {e}", field="ssh"
                ) from None

    def _wait_ready(self, t: Target) -> None:
        chan = self._chans[t.node]
        limit = max(self.options.connect_timeout_s, self.options.hang_timeout_s)
        deadline = time.monotonic() + limit
        with self._pgid_seen:
            while t.node not in self._pgids:
                if chan is None or chan.exit_status_ready() or chan.closed:
                    code = (
                        chan.recv_exit_status()
                        if chan is not None and chan.exit_status_ready()
                        else None
                    )
                    why = _EARLY_EXIT.get(code or 0, f"exited with status {code}")
                    raise LaunchError(
                        f"{t.label}: {why} before starting (see its log in the run directory)",
                        field="ssh",
                    )
                if time.monotonic() > deadline:
                    raise LaunchError(
                        f"{t.label}: not ready after {limit:.0f}s (--remote-setup still running?)",
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
        for node, chan in enumerate(self._chans):
            if chan is not None and node not in self._went:
                with contextlib.suppress(Exception):
                    chan.shutdown_write()
                waiting.append(node)
        deadline = time.monotonic() + 3.0
        for node in waiting:
            # paramiko sets status_event on the exit status and on the channel closing.
            self._chans[node].status_event.wait(max(0.0, deadline - time.monotonic()))
        for node in waiting:
            chan, client = self._chans[node], self._node_clients[node]
            if chan.exit_status_ready() or chan.closed or client is None:
                continue
            with contextlib.suppress(Exception):
                _run_quiet(
                    client,
                    f"dir={self._remote_dir_expr(node)}; "
                    'rm -rf -- "$dir"; rmdir -- "${dir%/*}" 2>/dev/null; true',
                )

    def _remote_dir_expr(self, node: int) -> str:
        """Shell expression of the node's fresh directory under --remote-workdir (one per node:
        on a shared filesystem, an NFS home, nodes must not race). ``~`` is the remote $HOME; a
        relative path is under the login directory. Always absolute, always quoted."""
        wd = self.options.remote_workdir
        rel = str(PurePosixPath(self.run_id) / f"node{node}")
        if wd == "~" or wd.startswith("~/"):
            rest = wd[2:].strip("/")
            return '"$HOME"/' + shlex.quote(str(PurePosixPath(rest) / rel) if rest else rel)
        if not wd.startswith("/"):
            return '"$PWD"/' + shlex.quote(str(PurePosixPath(wd) / rel))
        return shlex.quote(str(PurePosixPath(wd) / rel))

    def _bundle_tar(self) -> bytes:
        """The run's bundle as one uncompressed tar (modes kept), built once for all nodes."""
        import io
        import tarfile

        with self._kh_lock:
            if self._tar is None:
                buf = io.BytesIO()
                with tarfile.open(fileobj=buf, mode="w") as tar:
                    for path in sorted(self.run.bundle.iterdir()):
                        if path.name != "logs":
                            tar.add(path, arcname=path.name, filter=_owned_by_extractor)
                self._tar = buf.getvalue()
            return self._tar

    def master_addr(self) -> str | None:
        """MASTER_ADDR handed to every node, or None to keep the bundle's. The bundle's address
        stays when it was written for these hosts (or set by the user, e.g. an InfiniBand
        address); a bundle written without hosts has none (its scripts refuse to start without
        MASTER_ADDR), and one written for other hosts names the wrong machine: then it is node
        0's address as this launcher reaches it (after ~/.ssh/config). ``MASTER_ADDR`` in the
        run's environment always wins."""
        if self.manifest.nodes < 2 or "MASTER_ADDR" in self.options.env or not self.options.hosts:
            return None
        node0 = self._targets[0].hostname if self._targets else self.options.hosts[0].host
        written = self.manifest.hosts
        if written:
            try:
                first = Host.parse(written[0])
            except ValueError:
                first = None
            if first is None or first == self.options.hosts[0]:
                return None
            if self.manifest.master_addr != first.host:
                return None  # chosen by the user, not derived from the hosts
        return node0

    def remote_command(self, node: int) -> str:
        """The exact command sent to ``node`` (also written to RUN/commands/node<i>.txt). Its
        stdin first carries the bundle tar (exactly its size, read by ``head -c``), then "go"."""
        env = self.node_env()
        addr = self.master_addr()
        if addr is not None:
            env["MASTER_ADDR"] = addr
        rid = env.pop("DTRAIN_RUN_ID")
        exports = " ".join(f"export {k}={shlex.quote(v)};" for k, v in sorted(env.items()))
        script = self.manifest.node_scripts[node]
        setup = self.options.remote_setup
        inner = "\n".join(
            [
                f"RID={shlex.quote(rid)}",
                f"NODE={node}",
                _SWEEP_FN,
                _GRACE_FN,
                f"dir={self._remote_dir_expr(node)}",
                # Undo this node's part of a start that did not happen.
                'dtrain_clean() { cd / && rm -rf -- "$dir"; rmdir -- "${dir%/*}" 2>/dev/null; }',
                'mkdir -p -- "$dir" || exit 97',
                # The bundle, straight from the channel (no SFTP session, no file to unpack).
                f'head -c {len(self._bundle_tar())} | tar -xf - -C "$dir" '
                "|| { dtrain_clean; exit 98; }",
                # --remote-setup is a shell command by design (e.g. activating an environment).
                "{",
                setup or ":",
                "} || { dtrain_clean; exit 96; }",
                exports or ":",
                'cd -- "$dir" || { dtrain_clean; exit 97; }',
                # Ready (and our process group id); then nothing runs until dtrain-tui says go.
                'echo "@@dtrain-ready $$"',
                'IFS= read -r go && [ "$go" = go ] || { dtrain_clean; exit 99; }',
                "exec 3<&0",
                f'DTRAIN_RUN_ID="$RID" DTRAIN_NODE=$NODE bash ./{shlex.quote(script)} </dev/null &',
                "child=$!",
                # The connection's stdin reaching EOF means the connection is gone (the launcher
                # exited or was killed, even with SIGKILL): clean up. The watcher is in the group
                # it signals: it ignores SIGTERM from then on, or that first kill would end it
                # before the sweep and the SIGKILL that follow (ranks that trap SIGTERM, or
                # left the group, would outlive the launcher). Until then SIGTERM ends it.
                "{ while read -r _; do :; done; trap '' TERM; kill -TERM -- -$$ 2>/dev/null; "
                # (Its own group would look alive to dtrain_grace: the group gets SIGKILL last.)
                "dtrain_sweep TERM; dtrain_grace ''; kill -KILL -- -$$ 2>/dev/null; "
                # Not the channel's stdout/stderr: they are gone with the connection, and a
                # write there (any error message) would end the watcher with SIGPIPE.
                "} <&3 >/dev/null 2>&1 &",
                "watcher=$!",
                "exec 3<&-",
                "wait $child; rc=$?",
                "kill $watcher 2>/dev/null",
                "exit $rc",
            ]
        )
        return f"exec setsid -w bash -c {shlex.quote(inner)}"

    def _launch_node(self, t: Target) -> None:
        """Start the node's wrapper on one exec channel and send it the bundle on stdin."""
        tar = self._bundle_tar()
        cmd = self.remote_command(t.node)
        self.run.write_command(t.node, cmd)
        client = self._node_clients[t.node]
        transport = client.get_transport()
        try:
            chan = transport.open_session()
            chan.exec_command(cmd)
        except Exception as e:  # noqa: BLE001
            raise LaunchError(
                f"{t.label}: cannot start the node script: {e}", field="ssh"
            ) from None
        self._chans[t.node] = chan
        self._add_stream(t.node, STDOUT, lambda: chan.recv(65536))
        self._add_stream(t.node, STDERR, lambda: chan.recv_stderr(65536))
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
            m = _READY_RE.match(line)
            if m:
                with self._pgid_seen:
                    self._pgids[node] = int(m.group(1))
                    self._pgid_seen.notify_all()
                return True
        return False

    # ------------------------------------------------------------------ running

    def _node_exit(self, node: int) -> tuple[bool, int | None]:
        chan = self._chans[node]
        if chan is None:
            return True, None
        transport = chan.get_transport()
        if chan.exit_status_ready():
            status = int(chan.recv_exit_status())
            if status != -1:
                return True, status
            # -1: the channel closed without an exit status (paramiko's convention).
            self._node_lost(node, "connection lost (no exit status received)")
            return False, None
        if transport is None or not transport.is_active():
            self._node_lost(node, "connection lost")
        elif chan.closed:
            self._node_lost(node, "channel closed without an exit status")
        return False, None

    def _kill_node(self, node: int, reason: str) -> None:
        if node in self._killed:
            return
        self._killed.add(node)
        client = (
            self._node_clients[node] if node < len(getattr(self, "_node_clients", [])) else None
        )
        chan = self._chans[node] if node < len(self._chans) else None
        pgid = self._pgids.get(node)
        if client is None:
            return
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            return  # the node's own watcher cleans up when its connection drops
        group = f"kill -TERM -- -{pgid} 2>/dev/null; " if pgid else ""
        cmd = (
            f"RID={shlex.quote(self.run_id)}; NODE={node}; {_SWEEP_FN}; {_GRACE_FN}; "
            f"{group}dtrain_sweep TERM; dtrain_grace {pgid or shlex.quote('')}"
        )
        with contextlib.suppress(Exception):
            kc = transport.open_session()
            kc.exec_command(cmd)
            kc.status_event.wait(STOP_GRACE_S + 10)  # set by paramiko when the exit status came
            kc.close()
        if chan is not None:
            chan.status_event.wait(5)

    def _kill_node_now(self, node: int) -> None:
        """SIGKILL, at once, everything of the run on ``node`` (:meth:`kill`, a second Ctrl-C):
        the group and every process tagged with the run id, over a fresh channel. Unlike
        :meth:`_kill_node` it runs even while a stop is under way; that stop's grace loop on
        the node then finds nothing left and ends."""
        client = self._node_clients[node] if node < len(self._node_clients) else None
        transport = client.get_transport() if client is not None else None
        if transport is None or not transport.is_active():
            return  # the node's own watcher cleans up when its connection drops
        pgid = self._pgids.get(node)
        group = f"kill -KILL -- -{pgid} 2>/dev/null; " if pgid else ""
        cmd = (
            f"RID={shlex.quote(self.run_id)}; NODE={node}; {_SWEEP_FN}; {group}"
            "dtrain_sweep KILL; true"
        )
        with contextlib.suppress(Exception):
            _run_quiet(client, cmd)

    def _teardown_after_failed_start(self) -> None:
        for i in sorted(self._went):  # only nodes told "go" run anything
            self._kill_node(i, "start failed")
        self._abort_prepared()
        self._close()

    def _close(self) -> None:
        for c in self._clients:
            with contextlib.suppress(Exception):
                c.close()


def _owned_by_extractor(info: Any) -> Any:
    """No local owner in the tar: unpacked (even as root) the files belong to the remote user."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _transport(sock: Any, **kwargs: Any) -> Any:
    """paramiko Transport preferring AES-GCM (see _PREFERRED_CIPHERS); same algorithms offered."""
    import paramiko

    t = paramiko.Transport(sock, **kwargs)
    opts = t.get_security_options()
    offered = list(opts.ciphers)
    first = [c for c in _PREFERRED_CIPHERS if c in offered]
    opts.ciphers = tuple(first + [c for c in offered if c not in first])
    return t


def _run_quiet(client: Any, cmd: str, timeout: float = 10.0) -> int:
    """Run ``cmd`` on a connected client; its exit status (-1 on timeout)."""
    chan = client.get_transport().open_session()
    chan.exec_command(cmd)
    chan.status_event.wait(timeout)  # set by paramiko when the exit status came
    status = int(chan.recv_exit_status()) if chan.exit_status_ready() else -1
    chan.close()
    return status

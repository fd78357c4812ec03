"""SSH connections for the SSH backend (paramiko): where each node really is, host keys, and
one connected client per node.

Called by :class:`engine.launch.ssh.SshBackend` once per start. ``~/.ssh/config`` is read through
paramiko's own ``SSHConfig`` (alias, user, port, identity file, ProxyJump); a key file is by path
or the agent's. Every host key is checked against known_hosts, read once per start: an unknown
key is refused, with its SHA256 fingerprint, unless the user accepts new keys (then it is
appended to known_hosts, never other key material); a changed key is always refused. Failures are
one :class:`LaunchError` line naming the node. paramiko is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from engine.launch.errors import LaunchError
from engine.launch.options import LaunchOptions
from engine.plan.specs import Host

# Client-side preference among the ciphers paramiko offers: AES-GCM first (one AEAD pass per
# packet instead of AES-CTR plus a separate HMAC); the rest of paramiko's order follows unchanged.
_PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


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


KEY_FILE_LIMIT = 1 << 20
"""A private key file is a few KiB; past this it is not one (``/dev/zero`` grew without end)."""


def check_key_file(path: str) -> None:
    """A key file that is there must be a regular file of at most :data:`KEY_FILE_LIMIT`
    bytes: paramiko would read a FIFO or a device forever. A missing one is left to paramiko,
    which names it on connect."""
    from engine.errors import DtrainError
    from engine.fsio import read_regular_bytes

    try:
        read_regular_bytes(path, KEY_FILE_LIMIT, label=path, follow=True)
    except FileNotFoundError:
        return
    except DtrainError as e:
        raise LaunchError(f"key file {e}", field="--identity") from None


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

    def __init__(self, connector: SshConnector, label: str) -> None:
        self.connector = connector
        self.label = label

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        fp = fingerprint(key)
        if not self.connector.options.accept_new_host_keys:
            raise HostKeyError(
                f"{self.label}: unknown host key {key.get_name()} {fp} for {hostname}; check it, "
                "then pass --accept-new-host-keys (or add it to --known-hosts)",
                field="host key",
                keys=[(self.label, "unknown", key.get_name(), fp)],
            )
        if self.connector.record_host_key(hostname, key, self.label):
            self.connector.notes.append(
                f"{self.label}: accepted new host key {key.get_name()} {fp}"
            )


class SshConnector:
    """The connections of one start: ssh config, known_hosts and key files read once for every
    node, connections made in parallel (thread-safe)."""

    def __init__(self, options: LaunchOptions) -> None:
        self.options = options
        self.clients: list[Any] = []
        """Every client opened through a jump host's chain (closed by :meth:`close`)."""
        self.notes: list[str] = []
        """What the user should know (a host key accepted), for the run's log."""
        self._lock = threading.Lock()
        self._keys: dict[str, Any] = {}
        self._host_keys: Any = None  # known_hosts, parsed once per start

    def prepare(self, targets: list[Target]) -> None:
        """Read known_hosts and every node's key file once, before any connection."""
        with self._lock:
            self._host_keys = self._load_known_hosts()
        for t in targets:
            for path in t.identity:
                check_key_file(path)
            if len(t.identity) == 1:
                self.load_key(t.identity[0])

    def close(self) -> None:
        for c in self.clients:
            with contextlib.suppress(Exception):
                c.close()

    def _known_hosts_path(self) -> Path:
        return Path(self.options.known_hosts or Path.home() / ".ssh" / "known_hosts").expanduser()

    def ssh_config(self) -> Any:
        import paramiko

        path = self.options.ssh_config or Path.home() / ".ssh" / "config"
        path = Path(path).expanduser()
        if path.is_file():
            try:
                return paramiko.SSHConfig.from_path(str(path))
            except Exception as e:  # noqa: BLE001
                raise LaunchError(f"{path}: cannot parse: {e}", field="--ssh-config") from None
        return paramiko.SSHConfig()

    def target(self, node: int, host: Host, cfg: Any, *, jump: bool = False) -> Target:
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

    def record_host_key(self, hostname: str, key: Any, label: str) -> bool:
        """Append an accepted key to the known_hosts file (never other key material), once per
        start; later connections (another node through the same jump host) then check it as a
        known key. False when another connection of this start already accepted this very key;
        a different key for the same host (two connections racing, one of them intercepted) is
        refused as changed."""
        path = self._known_hosts_path()
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with self._lock:
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
            ht = self.target(t.node, hop, cfg, jump=True)
            ht.label = f"{t.label} via jump host {hop}"
            if k > 0:
                ht.proxy_jump = None  # the chain is spelled out: no hop's own ProxyJump
            client = self.connect(ht, cfg, depth + 1, sock=sock)
            self.clients.append(client)
            if k + 1 < len(hops):
                nxt = self.target(t.node, hops[k + 1], cfg, jump=True)
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

    def load_key(self, path: str) -> Any:
        """The private key at ``path``, parsed once for all nodes (None: let paramiko try the
        file itself, e.g. a key needing a passphrase the agent holds). Kept in memory only."""
        import paramiko

        with self._lock:
            if path not in self._keys:
                try:
                    self._keys[path] = paramiko.PKey.from_path(path)
                except Exception:  # noqa: BLE001 - paramiko reports the real problem on connect
                    self._keys[path] = None
            return self._keys[path]

    def connect(self, t: Target, cfg: Any, depth: int = 0, sock: Any = None) -> Any:
        import paramiko

        if sock is None and t.proxy_jump and t.proxy_jump.lower() != "none":
            sock = self._jump_chain(t, cfg, depth)
        client = paramiko.SSHClient()
        kh = self._known_hosts_path()
        # Only this host's known keys (from the known_hosts read once for every node), under
        # the name paramiko checks: "[host]:port", or "host" for port 22.
        name = known_hosts_name(t.hostname, t.port)
        with self._lock:
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
        pkey = self.load_key(t.identity[0]) if len(t.identity) == 1 else None
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
        except (OSError, paramiko.SSHException) as e:
            raise _connect_error(t, client, e, kh, to) from None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(5)
        return client


def _connect_error(t: Target, client: Any, e: Exception, kh: Path, to: float) -> LaunchError:
    """One line for a failed ``client.connect`` (the client is closed): a changed host key,
    failed authentication, or no SSH server where one was expected."""
    import paramiko

    tr = client.get_transport()
    banner = bool(getattr(tr, "remote_version", "")) if tr is not None else False
    client.close()
    if isinstance(e, paramiko.BadHostKeyException):
        return HostKeyError(
            f"{t.label}: host key CHANGED for {t.hostname}: got {e.key.get_name()} "
            f"{fingerprint(e.key)}, known_hosts has {fingerprint(e.expected_key)}; refusing "
            f"(if the host was really reinstalled, remove its line from {kh})",
            field="host key",
            keys=[(t.label, "changed", e.key.get_name(), fingerprint(e.key))],
        )
    if isinstance(e, paramiko.AuthenticationException):
        how = (
            f"key file {', '.join(t.identity)}" if t.identity else "the SSH agent and default keys"
        )
        return LaunchError(
            f"{t.label}: authentication failed as {t.user or 'the current user'} with {how} ({e}); "
            "pass the right --identity KEYFILE or load the key into ssh-agent",
            field="ssh",
        )
    if not banner:
        # paramiko then says "No existing session" or "Error reading SSH protocol banner",
        # which points nowhere: say what was seen.
        return LaunchError(
            f"{t.label}: {t.hostname}:{t.port} accepted the connection but sent no SSH "
            f"banner within {to:g}s ({e}); is sshd listening on that port?",
            field="ssh",
        )
    return LaunchError(f"{t.label}: cannot connect to {t.hostname}:{t.port}: {e}", field="ssh")


def _transport(sock: Any, **kwargs: Any) -> Any:
    """paramiko Transport preferring AES-GCM (see _PREFERRED_CIPHERS); same algorithms offered."""
    import paramiko

    t = paramiko.Transport(sock, **kwargs)
    opts = t.get_security_options()
    offered = list(opts.ciphers)
    first = [c for c in _PREFERRED_CIPHERS if c in offered]
    opts.ciphers = tuple(first + [c for c in offered if c not in first])
    return t

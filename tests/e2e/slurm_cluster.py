"""A real two-node Slurm on this host for the Slurm backend's tests (and by hand:
``python -m tests.e2e.slurm_cluster`` starts one and prints its ``SLURM_CONF``).

:class:`SlurmCluster` writes a ``slurm.conf`` in a temporary directory, starts a munged of its own
(its socket in that directory, ``AuthInfo=socket=``), ``slurmctld`` and two ``slurmd -N n1`` / ``-N n2`` on 127.0.0.1, each on a port
of its own (Debian's Slurm is built with ``MULTIPLE_SLURMD``), and waits with a deadline until
``sinfo`` shows both nodes idle. :meth:`SlurmCluster.stop` cancels every job and stops every
daemon it started: nothing is left running. No cgroups and no accounting (``proctrack/linuxproc``,
``task/none``): jobs are read with ``squeue`` / ``scontrol``. ``make system-deps`` installs the
packages; :func:`slurm_missing` says why the tests must be skipped when they are absent.

Partitions: ``debug`` (default, both nodes, no time limit) and ``short`` (MaxTime 1 minute), on
which a job asking for more time pends forever with reason ``PartitionTimeLimit``.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "scontrol", "sinfo")
START_TIMEOUT_S = 60.0
START_ATTEMPTS = 3
"""A port found free can be taken before the daemon binds it (another checkout's cluster, any
outgoing connection): the daemons are started again on new ports, at most this many times."""
PORT_TAKEN = "Address already in use"


def _exe(name: str) -> str | None:
    for d in ("/usr/sbin", "/usr/bin", "/sbin"):
        if os.access(f"{d}/{name}", os.X_OK):
            return f"{d}/{name}"
    return shutil.which(name)


def slurm_missing() -> str | None:
    """Why a local Slurm cannot be started here, or None when it can."""
    missing = [d for d in DAEMONS if _exe(d) is None]
    if missing:
        return (
            f"Slurm is not installed ({', '.join(missing)} missing); "
            "run `make system-deps` as root (apt-get install slurmctld slurmd slurm-client munge)"
        )
    if os.geteuid() != 0:
        return "a local Slurm needs root (slurmd runs jobs as their user); run the tests as root"
    return None


def _ephemeral_low() -> int:
    """The first port the kernel hands out to outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_ports(n: int) -> list[int]:
    """``n`` ports free now, drawn at random below the ephemeral range, so that no outgoing
    connection is given one before the daemons bind it."""
    rng = random.SystemRandom()
    high = max(_ephemeral_low(), 12000)
    ports: list[int] = []
    while len(ports) < n:
        port = rng.randrange(10000, high)
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        ports.append(port)
    return ports


class SlurmCluster:
    """slurmctld + slurmd n1, n2 on 127.0.0.1, configured in ``workdir``."""

    def __init__(self, workdir: Path, cpus: int = 2) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf = self.dir / "slurm.conf"
        self.cpus = cpus
        self.host = socket.gethostname().split(".")[0]
        self._procs: list[subprocess.Popen[bytes]] = []
        self._munged: subprocess.Popen[bytes] | None = None
        self._munge_dir = Path(tempfile.mkdtemp(prefix="dtrain-munge-"))
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # ------------------------------------------------------------------ config

    def _write_conf(self) -> None:
        ctld, n1, n2 = _free_ports(3)
        d = self.dir
        (d / "state").mkdir(exist_ok=True)
        (d / "spool").mkdir(exist_ok=True)
        nodes = "".join(
            f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={p} "
            f"CPUs={self.cpus} RealMemory=8000\n"
            for n, p in (("n1", n1), ("n2", n2))
        )
        self.conf.write_text(
            f"ClusterName=dtraintest\nSlurmctldHost={self.host}\nSlurmctldPort={ctld}\n"
            "SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nCredType=cred/munge\n"
            # cred_expire: also how long a requeued job waits before it may start again (Slurm's
            # default 120 s; 5 is the least it takes). Step credentials live that long too:
            # 10 s is ample for a step launch on one host.
            f"AuthInfo=socket={self.munge_socket},cred_expire=10\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\nMpiDefault=none\n"
            "ReturnToService=2\nSchedulerType=sched/backfill\n"
            # A job that becomes eligible by the clock (a requeued job's begin time) starts at
            # the next scheduling pass, not on an event: every 2 s here, not Slurm's 30/60 s.
            "SchedulerParameters=bf_interval=1,sched_interval=2\n"
            # CPUs above the machine's own (2 here) without the node being drained as INVAL.
            "SlurmdParameters=config_overrides\n"
            # Short waits: a test cancels and requeues within seconds, not Slurm's minutes.
            "KillWait=5\nMinJobAge=600\nInactiveLimit=0\nSlurmctldTimeout=30\nSlurmdTimeout=60\n"
            f"StateSaveLocation={d / 'state'}\nSlurmdSpoolDir={d / 'spool'}/%n\n"
            f"SlurmctldPidFile={d / 'slurmctld.pid'}\nSlurmdPidFile={d / 'slurmd-%n.pid'}\n"
            f"SlurmctldLogFile={d / 'slurmctld.log'}\nSlurmdLogFile={d / 'slurmd-%n.log'}\n"
            + nodes
            + "PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=YES\n"
            "PartitionName=short Nodes=n[1-2] Default=NO MaxTime=1 State=UP OverSubscribe=YES\n"
        )

    # ------------------------------------------------------------------ lifecycle

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster."""
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, check=check, timeout=30
        )

    @property
    def munge_socket(self) -> Path:
        """This cluster's own munged: two clusters on one machine (two checkouts running their
        tests at once) never share, or stop, each other's. In a directory of its own under /tmp:
        the munge user must reach it (pytest's directories are root's, 0700), and a socket's
        path must stay short."""
        return self._munge_dir / "munge.sock"

    def _munge_ok(self) -> bool:
        sock = f"--socket={self.munge_socket}"
        try:
            cred = subprocess.run(["munge", "-n", sock], capture_output=True, timeout=5, check=True)
            subprocess.run(
                ["unmunge", sock], input=cred.stdout, capture_output=True, timeout=5, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return False
        return True

    def _start_munge(self) -> None:
        d = self._munge_dir
        shutil.chown(d, "munge", "munge")
        # -F: foreground, as the munge user, so this fixture owns the process and reaps it.
        # --force: the socket's directory sits under /tmp, which munged would call insecure.
        self._munged = subprocess.Popen(
            [
                _exe("munged") or "munged",
                "-F",
                "--force",
                f"--socket={self.munge_socket}",
                f"--pid-file={d / 'munged.pid'}",
                f"--seed-file={d / 'munged.seed'}",
                f"--log-file={d / 'munged.log'}",
            ],
            user="munge",
            group="munge",
            extra_groups=[],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._until(self._munge_ok, "munged did not answer")

    def _until(self, ok: object, what: str, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok():  # type: ignore[operator]
                return
            time.sleep(0.1)  # polling a daemon's state
        raise RuntimeError(f"{what} within {timeout:.0f}s; see {self.dir}/*.log")

    def _daemon(self, *argv: str) -> None:
        log = open(self.dir / f"{argv[0].rsplit('/', 1)[-1]}-{len(self._procs)}.out", "ab")  # noqa: SIM115
        self._procs.append(
            subprocess.Popen(
                list(argv), env=self.env, stdout=log, stderr=log, start_new_session=True
            )
        )

    def _both_idle(self) -> bool:
        r = self.run("sinfo", "-h", "-N", "-p", "debug", "-o", "%N %t", check=False)
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return states.get("n1") == "idle" and states.get("n2") == "idle"

    def _port_taken(self) -> bool:
        """Whether a daemon could not bind its port."""
        return any(PORT_TAKEN in f.read_text(errors="replace") for f in self.dir.glob("*.log"))

    def _settle(self) -> bool:
        """Wait, with a deadline, until both nodes are idle (True) or a daemon could not bind
        its port (False)."""
        idle: list[bool] = []

        def settled() -> bool:
            if self._both_idle():
                idle.append(True)
                return True
            return self._port_taken()

        self._until(settled, "sinfo did not show n1 and n2 idle")
        return bool(idle)

    def start(self) -> SlurmCluster:
        try:
            self._start_munge()
            for _ in range(START_ATTEMPTS):
                self._write_conf()
                self._daemon(_exe("slurmctld") or "slurmctld", "-D", "-i", "-f", str(self.conf))
                for n in ("n1", "n2"):
                    self._daemon(_exe("slurmd") or "slurmd", "-D", "-N", n, "-f", str(self.conf))
                if self._settle():
                    return self
                self._stop_daemons()
                for log in self.dir.glob("*.log"):
                    log.rename(log.with_suffix(".log.port-taken"))
            raise RuntimeError(f"a port was taken {START_ATTEMPTS} times; see {self.dir}")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Cancel every job, stop every daemon started here; waits until they are gone."""
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            self.run("scancel", "--full", "-u", "root", check=False)
        self._stop_daemons()
        if self._munged is not None:
            self._munged.terminate()
            try:
                self._munged.wait(10)
            except subprocess.TimeoutExpired:
                self._munged.kill()
                self._munged.wait(5)
            self._munged = None
        shutil.rmtree(self._munge_dir, ignore_errors=True)

    def _stop_daemons(self) -> None:
        """Stop slurmctld and the slurmds; waits until they are gone."""
        for p in reversed(self._procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self._procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        self._procs.clear()

    def pids(self) -> list[int]:
        """Pids of the daemons this cluster started that are still alive."""
        return [p.pid for p in self._procs if p.poll() is None]


_shared: SlurmCluster | None = None
_users = 0


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """One cluster for the whole session, whichever test modules import this fixture (each
    import is a fixture of its own to pytest: a count keeps one cluster and stops it after the
    last). ``SLURM_CONF`` points at it meanwhile, so the code under test finds it."""
    global _shared, _users
    why = slurm_missing()
    if why:
        pytest.skip(why)
    if _shared is None:
        _shared = SlurmCluster(tmp_path_factory.mktemp("slurm"), cpus=4).start()
    _users += 1
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(_shared.conf)
    try:
        yield _shared
    finally:
        _users -= 1
        if _users == 0:
            _shared.stop()
            _shared = None
            if saved is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = saved


if __name__ == "__main__":
    why = slurm_missing()
    if why:
        raise SystemExit(why)
    c = SlurmCluster(Path(tempfile.mkdtemp(prefix="slurm-")))
    c.start()
    print(f"export SLURM_CONF={c.conf}  # Ctrl-C stops the cluster", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the stop short
        c.stop()

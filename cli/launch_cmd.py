"""``dtrain-tui launch``: start a bundle (or a spec/profile, written into the run directory
first) on a backend, headless, printing every line prefixed by its rank (``[rank 3] ...``) or
node (``[node 1] ...`` for launcher chatter). Exit code 0 only when every rank exited 0;
Ctrl-C, SIGTERM or SIGHUP (a closed terminal) stop every rank on every node (SIGTERM, then SIGKILL
after 5 s) and exit 128 + the signal (130 for Ctrl-C); a second one kills every rank at once."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.help_text import plain
from cli.spec_options import add_spec_options, spec_from_args
from engine.errors import DtrainError

if TYPE_CHECKING:
    from engine.launch.options import LaunchOptions
    from engine.plan.specs import LaunchSpec, Spec


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "launch",
        help="start a bundle locally, over SSH, with SkyPilot or Slurm and stream every rank",
        description=plain(__doc__),
    )
    add_launch_arguments(p)
    p.set_defaults(func=run)


def add_launch_arguments(p: argparse.ArgumentParser) -> None:
    """BUNDLE_DIR, --run-dir, the SSH, Slurm and SkyPilot options, -q and the spec and launch
    options: what ``launch`` takes, and ``preflight`` with it (the same world)."""
    p.add_argument("bundle", nargs="?", type=Path, metavar="BUNDLE_DIR", help="a written bundle")
    p.add_argument(
        "--run-dir",
        type=Path,
        metavar="DIR",
        help="run directory (default: a new one under the user data dir)",
    )
    p.add_argument(
        "--accept-new-host-keys",
        action="store_true",
        help="trust (and record in --known-hosts) SSH host keys seen for the first time",
    )
    p.add_argument(
        "--ssh-config",
        type=Path,
        metavar="FILE",
        help="OpenSSH client config (default ~/.ssh/config)",
    )
    p.add_argument(
        "--login-host",
        metavar="[USER@]HOST[:PORT]",
        help="Slurm: submit on this login node over SSH (default: sbatch on this machine)",
    )
    p.add_argument(
        "--sky-down", action="store_true", help="SkyPilot: tear the cluster down when the run ends"
    )
    p.add_argument(
        "--sky-autostop", type=int, metavar="MIN", help="SkyPilot: autostop after MIN idle minutes"
    )
    p.add_argument("--quiet", "-q", action="store_true", help="print only the final state")
    p.add_argument(
        "--spare-hosts",
        metavar="H1,H2",
        help="SSH, with --max-restarts: hosts that replace a node whose failure repeats",
    )
    p.add_argument(
        "--allow-shrink",
        action="store_true",
        help="with --max-restarts: when a node's failure repeats and no spare is left, go on "
        "on the other nodes, re-planned keeping the global batch (DDP, FSDP)",
    )
    add_spec_options(p, launch=True)


def _options(args: argparse.Namespace, manifest_hosts: list[str], spec_launch: Any) -> Any:
    """The spec's launch section (or the defaults, for a written bundle) with the launch
    options given on the command line applied; hosts from --hosts, else the spec, else the
    bundle."""
    from engine.launch.options import LaunchOptions
    from engine.plan.specs import Host, LaunchSpec

    given: dict[str, Any] = {
        k.removeprefix("launch__"): v
        for k, v in vars(args).items()
        if k.startswith("launch__") and v is not None
    }
    raw_hosts = given.pop("hosts", None)
    if isinstance(raw_hosts, str):
        raw_hosts = [h for h in raw_hosts.split(",") if h.strip()]
    hosts_text = (
        raw_hosts
        if raw_hosts is not None
        else (list(spec_launch.hosts) if spec_launch else manifest_hosts)
    )
    try:
        hosts = [Host.parse(h) for h in hosts_text]
    except ValueError as e:
        raise DtrainError(str(e), field="--hosts") from None
    for key in ("identity_file", "known_hosts"):  # an empty --identity "" means none
        if key in given:
            given[key] = given[key] or None
    # Each given value was checked on its own (check_launch_args): checked again together.
    launch = LaunchSpec.model_validate(
        {**(spec_launch.model_dump() if spec_launch else {}), **given}
    )
    if launch.identity_file:  # before the run directory: a FIFO or a device is one line
        from engine.launch.ssh_connect import check_key_file

        check_key_file(str(Path(launch.identity_file).expanduser()))
    sky: dict[str, Any] = {}  # not spec options: passed on as given
    if args.sky_down:
        sky["sky_down"] = True
    if args.sky_autostop is not None:
        sky["sky_autostop_min"] = args.sky_autostop
    return LaunchOptions.from_spec(
        launch.model_copy(update=sky),
        hosts=hosts,
        accept_new_host_keys=bool(args.accept_new_host_keys),
        master_port=given.get("master_port"),
        ssh_config=args.ssh_config,
    )


def _spec_given(args: argparse.Namespace) -> bool:
    if args.spec or args.profile:
        return True
    return any(
        v is not None for k, v in vars(args).items() if "__" in k and not k.startswith("launch__")
    )


class _Interrupted(KeyboardInterrupt):
    """A stop signal that came while the launch was still being set up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _StopSignals:
    """SIGINT, SIGTERM and SIGHUP while a launch runs. Installed before anything slow, so no
    signal ever ends the launcher with a traceback or leaves its ranks behind. While the run is
    being set up and started a signal interrupts that (the backend undoes a half-done start);
    once it runs, the handler only records the signal and the main loop stops the run: the first
    signal asks for a stop, any later one kills every rank at once.

    SIGINT is taken even when inherited as ignored (``cmd &`` in a script): an explicit SIGINT to
    the launcher is a stop. An ignored SIGHUP (``nohup``) stays ignored."""

    def __init__(self) -> None:
        self.got: list[int] = []
        self.live = False
        """Set once the run is going: record signals instead of interrupting."""
        self._saved: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                continue
            try:
                self._saved[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (run from a test's thread): no handling
                return

    def restore(self) -> None:
        for sig, old in self._saved.items():
            signal.signal(sig, old)
        self._saved.clear()

    def _handle(self, signum: int, frame: object) -> None:
        self.got.append(signum)
        if not self.live:
            raise _Interrupted(signum)

    def exit_code(self) -> int:
        return 128 + self.got[0]


def _say(text: str) -> None:
    """A line on stderr; a terminal that is gone (SIGHUP) must not stop the stopping."""
    with contextlib.suppress(OSError, ValueError):
        print(text, file=sys.stderr, flush=True)


def with_script_from_cwd(spec: Spec, cwd: Path) -> Spec:
    """``--script fail.py`` names a file in the user's working directory, not in the bundle the
    run starts from (torchrun runs there): a relative script that exists under ``cwd`` becomes
    its absolute path. One that does not is left as given (it may exist only on the nodes)."""
    script = spec.launch.script
    if not script or Path(script).is_absolute() or script.startswith("-"):
        return spec
    found = cwd / script
    if not found.is_file():
        return spec
    launch = spec.launch.model_copy(update={"script": str(found.resolve())})
    return spec.model_copy(update={"launch": launch})


def run(args: argparse.Namespace) -> int:
    stop = _StopSignals()
    stop.install()
    try:
        return _run(args, stop)
    except _Interrupted as e:
        _say(f"dtrain-tui: interrupted ({signal.Signals(e.signum).name}) before the run started")
        return 128 + e.signum
    except BaseException as e:
        # An interrupt a library turned into an error of its own (pydantic's Rust core panics
        # with a BaseException when interrupted while loading).
        if stop.got and not stop.live and not isinstance(e, SystemExit):
            _say(f"dtrain-tui: interrupted ({signal.Signals(stop.got[0]).name})")
            return stop.exit_code()
        raise
    finally:
        stop.restore()


def _run(args: argparse.Namespace, stop: _StopSignals) -> int:
    from cli.spec_options import check_launch_args
    from engine.launch import make_backend

    if getattr(args, "launch__hosts", None) == "slurm":
        from engine.launch.slurm_cli import allocation_hosts

        # Inside an allocation (salloc, a batch script): its nodes, in Slurm's order.
        args.launch__hosts = ",".join(allocation_hosts())
    check_launch_args(args)  # --hang-timeout, --hosts, --run-dir…, also for a written bundle
    bundle_dir, run_dir, spec_launch = _bundle(args)
    from engine.write.manifest import read_manifest

    manifest = read_manifest(bundle_dir)
    kind = getattr(args, "launch__backend", None) or (
        spec_launch.backend.value if spec_launch else manifest.backend
    )
    options = _options(args, manifest.hosts, spec_launch)
    extra = _backend_options(args, str(kind), options)
    restarts = getattr(args, "launch__max_restarts", None)
    if restarts is None:
        restarts = spec_launch.max_restarts if spec_launch else 0
    options.allow_shrink = bool(getattr(args, "allow_shrink", False))
    if options.allow_shrink and not (restarts and str(kind) in ("local", "ssh")):
        raise DtrainError(
            "--allow-shrink needs --max-restarts N and --backend local or ssh",
            field="--allow-shrink",
        )
    backend: Any
    if restarts and str(kind) in ("local", "ssh"):
        backend = _restarting(args, str(kind), bundle_dir, run_dir, options, int(restarts))
    else:
        backend = make_backend(str(kind), bundle_dir, run_dir, options, **extra)
    _say(f"dtrain-tui: run directory {backend.run.path}")
    try:
        backend.start()
    except _Interrupted as e:
        stop.live = True
        if backend.state.final:  # start() undid itself
            _say(f"dtrain-tui: run stopped while starting ({signal.Signals(e.signum).name})")
            return 128 + e.signum
        # It came just after the start: the run is going, and stops in _drive once watched.
        backend.supervise()
    stop.live = True
    return _drive(backend, stop, quiet=bool(args.quiet))


def _restarting(
    args: argparse.Namespace,
    kind: str,
    bundle_dir: Path,
    run_dir: Path | None,
    options: LaunchOptions,
    restarts: int,
) -> Any:
    """The run under the restart policy (``--max-restarts N``, local and SSH): each attempt a
    new backend on the same bundle, resuming from the newest complete checkpoint."""
    from engine.launch.restart import RestartingRun, RestartPolicy
    from engine.plan.specs import Host
    from engine.write.manifest import read_manifest

    raw = getattr(args, "spare_hosts", None) or ""
    if raw and kind != "ssh":
        raise DtrainError(
            f"--spare-hosts is for --backend ssh, not {kind}; drop it", field="--spare-hosts"
        )
    try:
        spares = tuple(Host.parse(h) for h in raw.split(",") if h.strip())
    except ValueError as e:
        raise DtrainError(f"--spare-hosts: {e}", field="--spare-hosts") from None
    return RestartingRun.for_bundle(
        kind,
        bundle_dir,
        run_dir,
        options,
        RestartPolicy(max_restarts=restarts, spare_hosts=spares),
        name=read_manifest(bundle_dir).name,
    )


_WRITTEN_INTO_BUNDLE = {
    "launch__script": "--script",
    "launch__script_args": "--script-arg",
    "launch__hf_integration": "--hf-integration",
    "launch__master_addr": "--master-addr",
}
"""Launch options a written bundle already holds in its files: given with a BUNDLE_DIR, they
would be ignored, so they are refused."""


def _refuse_written_options(args: argparse.Namespace) -> None:
    for dest, flag in _WRITTEN_INTO_BUNDLE.items():
        if getattr(args, dest, None) not in (None, False, []):
            raise DtrainError(
                f"written into the bundle's files, so a written BUNDLE_DIR would ignore it: "
                f"pass it to `dtrain-tui write … {flag} … --out DIR` and launch DIR, or launch "
                f"from --profile/--spec with {flag}",
                field=flag,
            )


def _bundle(args: argparse.Namespace) -> tuple[Path, Path | None, LaunchSpec | None]:
    """(bundle directory, run directory or None for the default, the spec's launch section):
    the BUNDLE_DIR given, or a bundle planned from --spec/--profile/model options and written
    inside the run directory."""
    run_dir: Path | None = args.run_dir
    if args.bundle is not None:
        if _spec_given(args):
            raise DtrainError(
                "pass either BUNDLE_DIR or --spec/--profile/model options, not both "
                "(a bundle already holds its plan)",
                field="launch",
            )
        _refuse_written_options(args)
        if run_dir is not None:  # refused before a backend is made or anything copied
            from engine.rundir.files import check_outside_bundle

            check_outside_bundle(run_dir, args.bundle)
        return Path(args.bundle), run_dir, None
    if not _spec_given(args):
        raise DtrainError(
            "nothing to launch; pass a BUNDLE_DIR (dtrain-tui write --out DIR) or --profile NAME or --spec FILE",
            field="launch",
        )
    spec = with_script_from_cwd(spec_from_args(args), Path.cwd())
    if args.profile:
        from profiles.store import ProfileStore

        # "Rerun last week's job": the profile list sorts and shows by last use.
        ProfileStore(getattr(args, "config_dir", None)).mark_used(args.profile)
    from engine.plan.planner import plan as make_plan
    from engine.rundir.files import new_run_dir
    from engine.write import write_bundle
    from engine.write.checks import check_spec_batch
    from engine.write.naming import run_name

    p = make_plan(spec)
    check_spec_batch(p)  # the bundle must train the global batch asked for
    run_dir = run_dir or new_run_dir(run_name(p))
    # The bundle is written inside the run directory, then started from there.
    bundle_dir = Path(run_dir) / "bundle"
    write_bundle(p, bundle_dir)
    return bundle_dir, run_dir, spec.launch


def _backend_options(args: argparse.Namespace, kind: str, options: LaunchOptions) -> dict[str, Any]:
    """Check and adjust ``options`` for the backend ``kind``; the backend's own extra
    arguments (Slurm: the sbatch options given on the command line)."""
    from engine.launch.options import backend_hosts

    options.hosts = backend_hosts(kind, options.hosts)  # local and Slurm place the ranks
    if kind == "ssh" and not options.hosts:
        raise DtrainError("pass one host per node (--backend ssh needs them)", field="--hosts")
    login = getattr(args, "login_host", None)
    if login and kind != "slurm":
        raise DtrainError(
            f"--login-host is for --backend slurm, not {kind}; drop it or pass --backend slurm",
            field="--login-host",
        )
    if kind != "slurm":
        return {}
    from engine.plan.specs import Host, LaunchSpec
    from engine.write.slurm import sbatch_options

    try:
        options.login_host = Host.parse(login) if login else None
    except ValueError as e:
        raise DtrainError(f"--login-host: {e}", field="--login-host") from None
    given = {
        k.removeprefix("launch__"): v
        for k, v in vars(args).items()
        if k.startswith("launch__slurm_") and v is not None
    }
    # Given on the command line: they win over the bundle's #SBATCH lines.
    return {"sbatch_args": sbatch_options(LaunchSpec.model_validate(given))}


# Signal names as the user knows them.
_HOW: dict[int, str] = {
    signal.SIGINT: "Ctrl-C",
    signal.SIGTERM: "SIGTERM",
    signal.SIGHUP: "SIGHUP",
}
KILL_WAIT_S = 30.0
"""After the run's every process was SIGKILLed, how long to wait for it to end before leaving
(the reaper sweeps once more when this process exits)."""


def _drive(backend: Any, stop: _StopSignals, *, quiet: bool) -> int:
    """Print the run until it ends; stop it on the first signal, kill it on the next."""
    import time

    out: Any = None if quiet else sys.stdout
    asked = killed = 0
    killed_at = 0.0
    said_remote_stop = False
    while not backend.done:
        got = len(stop.got)
        if got > asked:
            # A signal after a stop asked through the run directory is the second request.
            if not asked and not said_remote_stop:
                how = _HOW.get(stop.got[0], str(stop.got[0]))
                _say(f"dtrain-tui: stopping every rank ({how})")
                backend.request_stop(f"stopped by the user ({how})")
            elif not killed:
                _say("dtrain-tui: killing every rank now (SIGKILL)")
                backend.kill()
                killed, killed_at = 1, time.monotonic()
            asked = got
        elif not asked and not said_remote_stop and backend.stopping:
            said_remote_stop = True  # a stop asked for through the run directory: say it once
            _say("dtrain-tui: stopping every rank (stop requested from the monitor)")
        if killed and time.monotonic() - killed_at > KILL_WAIT_S:
            _say("dtrain-tui: the run did not end after SIGKILL; leaving it to the reaper")
            break
        events = backend.poll(0.1)
        if out is not None and events:
            try:
                _print_events(events, out)
            except OSError:  # stdout closed (a pipe reader gone, a terminal hung up)
                out = None
    msg = backend.run.record.reason
    if backend.state == "failed":
        from engine.monitor.root_error import failure_line

        # The exit code alone says little: the blamed rank's own last error line with it.
        cause = failure_line(backend.run.path)
        msg = f"{msg}; {cause}" if cause and cause not in msg else msg
    _say(f"dtrain-tui: run {backend.state}: {msg} ({backend.run.path})")
    return stop.exit_code() if stop.got else int(backend.exit_code())


def _print_events(events: list[Any], out: Any) -> None:
    from engine.monitor.state import exit_text
    from engine.monitor.telemetry import shown_lines
    from engine.monitor.textsafe import safe_text
    from engine.rundir.events import LineBatch, LineEvent, RankExit

    lines: list[str] = []
    for ev in events:
        if isinstance(ev, LineBatch):
            tag = f"[rank {ev.rank}] " if ev.rank is not None else f"[node {ev.node}] "
            lines.extend(f"{tag}{x}\n" for x in shown_lines(ev.lines))  # telemetry: on disk
        elif isinstance(ev, LineEvent):
            tag = f"[rank {ev.rank}]" if ev.rank is not None else f"[node {ev.node}]"
            lines.extend(f"{tag} {x}\n" for x in shown_lines((ev.line,)))
        elif isinstance(ev, RankExit) and ev.exit_code not in (0,):
            # Worded as ``monitor --follow`` words it: "stopped", "failed SIGKILL (…)".
            if ev.exit_code is None and ev.reason == "stopped":
                lines.append(f"[rank {ev.rank}] stopped\n")
            else:
                why = f" ({ev.reason})" if ev.reason else ""
                lines.append(f"[rank {ev.rank}] failed {exit_text(ev.exit_code)}{why}\n")
    if lines:
        try:
            out.write(safe_text("".join(lines)))  # no escape sequence reaches the terminal
            out.flush()
        except BrokenPipeError:
            raise

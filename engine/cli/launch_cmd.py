"""``dtrain-tui launch``: start a bundle (or a spec/profile, written into the run directory
first) on a backend, headless, printing every line prefixed by its rank (``[rank 3] ...``) or
node (``[node 1] ...`` for launcher chatter). Exit code 0 only when every rank exited 0;
Ctrl-C stops every rank on every node and exits 130."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from engine.cli.spec_options import add_spec_options, spec_from_args
from engine.errors import DtrainError


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "launch",
        help="start a bundle locally, over SSH or with SkyPilot and stream every rank",
        description=__doc__,
    )
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
        "--sky-down", action="store_true", help="SkyPilot: tear the cluster down when the run ends"
    )
    p.add_argument(
        "--sky-autostop", type=int, metavar="MIN", help="SkyPilot: autostop after MIN idle minutes"
    )
    p.add_argument("--quiet", "-q", action="store_true", help="print only the final state")
    add_spec_options(p, launch=True)
    p.set_defaults(func=run)


def _options(args: argparse.Namespace, manifest_hosts: list[str], spec_launch: Any) -> Any:
    from engine.launch.base import LaunchOptions
    from engine.specs import Host

    def given(name: str, default: Any) -> Any:
        v = getattr(args, f"launch__{name}", None)
        return default if v is None else v

    raw_hosts = given("hosts", None)
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
    sl = spec_launch
    return LaunchOptions(
        hosts=hosts,
        identity_file=Path(i)
        if (i := given("identity_file", sl.identity_file if sl else None))
        else None,
        known_hosts=Path(k)
        if (k := given("known_hosts", sl.known_hosts if sl else None))
        else None,
        accept_new_host_keys=bool(args.accept_new_host_keys),
        remote_workdir=str(given("remote_workdir", sl.remote_workdir if sl else "~/dtrain-runs")),
        remote_setup=given("remote_setup", sl.remote_setup if sl else None),
        hang_timeout_s=float(given("hang_timeout_s", sl.hang_timeout_s if sl else 300.0)),
        nccl_debug=_nccl_level(given("nccl_debug", sl.nccl_debug if sl else None)),
        nccl_debug_subsys=given("nccl_debug_subsys", sl.nccl_debug_subsys if sl else None),
        env=dict(sl.env) if sl else {},
        master_port=getattr(args, "launch__master_port", None),
        ssh_config=args.ssh_config,
        sky_cluster=given("sky_cluster", sl.sky_cluster if sl else None),
        sky_cloud=given("sky_cloud", sl.sky_cloud if sl else None),
        sky_down=bool(args.sky_down or (sl.sky_down if sl else False)),
        sky_autostop_min=args.sky_autostop
        if args.sky_autostop is not None
        else (sl.sky_autostop_min if sl else None),
    )


def _nccl_level(v: str | None) -> str | None:
    if v is None:
        return None
    levels = {"VERSION", "WARN", "INFO", "TRACE", "ABORT"}
    if v.upper() not in levels:
        raise DtrainError(
            f"{v!r} is not an NCCL_DEBUG level; use one of {sorted(levels)}", field="--nccl-debug"
        )
    return v.upper()


def _spec_given(args: argparse.Namespace) -> bool:
    if args.spec or args.profile:
        return True
    return any(
        v is not None for k, v in vars(args).items() if "__" in k and not k.startswith("launch__")
    )


def run(args: argparse.Namespace) -> int:
    from engine.bundle import read_manifest
    from engine.launch import make_backend
    from engine.launch.rundir import default_run_dir

    spec_launch = None
    run_dir: Path | None = args.run_dir
    if args.bundle is not None:
        if _spec_given(args):
            raise DtrainError(
                "pass either BUNDLE_DIR or --spec/--profile/model options, not both "
                "(a bundle already holds its plan)",
                field="launch",
            )
        bundle_dir = args.bundle
        manifest = read_manifest(bundle_dir)
    else:
        if not _spec_given(args):
            raise DtrainError(
                "nothing to launch; pass a BUNDLE_DIR (dtrain-tui write --out DIR) or --profile NAME or --spec FILE",
                field="launch",
            )
        spec = spec_from_args(args)
        spec_launch = spec.launch
        if args.profile:
            from profiles.store import ProfileStore

            # "Rerun last week's job": the profile list sorts and shows by last use.
            ProfileStore(getattr(args, "config_dir", None)).mark_used(args.profile)
        from engine.planner import plan as make_plan
        from engine.writers import write_bundle

        p = make_plan(spec)
        from engine.writers.common import run_name

        run_dir = run_dir or default_run_dir(run_name(p))
        # The bundle is written inside the run directory, then started from there.
        bundle_dir = Path(run_dir) / "bundle"
        write_bundle(p, bundle_dir)
        manifest = read_manifest(bundle_dir)
    kind = getattr(args, "launch__backend", None) or (
        spec_launch.backend.value if spec_launch else manifest.backend
    )
    options = _options(args, manifest.hosts, spec_launch)
    if kind == "local":
        options.hosts = []
    backend = make_backend(str(kind), bundle_dir, run_dir, options)
    out = sys.stdout
    print(f"dtrain-tui: run directory {backend.run.path}", file=sys.stderr, flush=True)
    try:
        backend.start()
        while not backend.done:
            events = backend.poll(0.25)
            if args.quiet:
                continue
            _print_events(events, out)
    except KeyboardInterrupt:
        print("dtrain-tui: stopping every rank (Ctrl-C)", file=sys.stderr, flush=True)
        backend.stop()
        while not backend.done:
            _print_events(backend.poll(0.25), out)
        print(f"dtrain-tui: run {backend.state}: {backend.run.path}", file=sys.stderr)
        return 130
    info = backend.run.info
    msg = info.get("reason") or ""
    print(f"dtrain-tui: run {backend.state}: {msg} ({backend.run.path})", file=sys.stderr)
    return backend.exit_code()


def _print_events(events: list[Any], out: Any) -> None:
    from engine.events import LineBatch, LineEvent, RankExit

    lines: list[str] = []
    for ev in events:
        if isinstance(ev, LineBatch):
            tag = f"[rank {ev.rank}] " if ev.rank is not None else f"[node {ev.node}] "
            lines.extend(f"{tag}{x}\n" for x in ev.lines)
        elif isinstance(ev, LineEvent):
            tag = f"[rank {ev.rank}]" if ev.rank is not None else f"[node {ev.node}]"
            lines.append(f"{tag} {ev.line}\n")
        elif isinstance(ev, RankExit) and ev.exit_code not in (0,):
            lines.append(f"[rank {ev.rank}] exited: {ev.exit_code} {ev.reason}\n")
    if lines:
        try:
            out.write("".join(lines))
            out.flush()
        except BrokenPipeError:
            raise

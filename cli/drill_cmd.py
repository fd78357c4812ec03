"""``dtrain-tui drill``: a fault drill before the real run. Runs the job once uninterrupted as the
reference, then again SIGKILLing a random rank at a random step ``--kills`` times (``--seed``),
restarted each time by the launcher's restart policy. ``--kill node`` takes a whole node down
instead (its launch script, torchrun and every rank on it, as a lost machine would go), ``--kill
mixed`` rank and node kills by turns. Checks that every restart resumed from the newest complete
checkpoint, redid no more than one checkpoint interval, and trained the reference's losses.
Prints the time to detect, to restart and to be back at the lost step. Exit code 0 only if every
recovery held; on a script that never resumes it fails and says why. Runs locally (a bundle, or
one planned from --spec/--profile/model options; a multi-node bundle runs its node scripts on
this machine)."""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

from cli.help_text import plain
from cli.spec_options import add_spec_options
from engine.errors import DtrainError

KILL_MODES = ("rank", "node", "mixed")
"""engine.launch.drill.KillMode's values, spelled out: importing the drill here would load the
whole launcher into every command's start (a test checks they agree)."""


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "drill",
        help="fault drill: kill random ranks or nodes at random steps, check every restart "
        "resumed right",
        description=plain(__doc__),
    )
    p.add_argument("bundle", nargs="?", type=Path, metavar="BUNDLE_DIR", help="a written bundle")
    p.add_argument("--kills", type=int, default=1, metavar="K", help="how many kills (default 1)")
    p.add_argument(
        "--kill",
        choices=KILL_MODES,
        default=KILL_MODES[0],
        help="what a kill takes down: one rank's process (default), a whole node's part of the "
        "run, or the two by turns (mixed)",
    )
    p.add_argument(
        "--seed", type=int, help="seed for which rank or node and which step (default: random)"
    )
    p.add_argument(
        "--every",
        type=int,
        metavar="N",
        help="checkpoint every N steps (default: the plan's, else a few per run)",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        metavar="DIR",
        help="where the drill's runs go (default: a new one under the user data dir)",
    )
    add_spec_options(p, launch=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cli.launch_cmd import _bundle
    from engine.launch.drill import run_drill
    from engine.launch.options import LaunchOptions
    from engine.rundir.files import new_run_dir
    from engine.write.manifest import read_manifest

    if args.kills < 1 or args.kills > 20:
        raise DtrainError(f"--kills {args.kills}: pass 1 to 20", field="--kills")
    if args.every is not None and args.every < 1:
        raise DtrainError(f"--every {args.every}: pass 1 or more", field="--every")
    if args.run_dir is None:
        args.run_dir = new_run_dir("drill")
    bundle_dir, _, spec_launch = _bundle(args)
    manifest = read_manifest(bundle_dir)
    # The drill runs on this machine: the spec's hang timeout and environment, no hosts.
    options = LaunchOptions.from_spec(spec_launch, hosts=[]) if spec_launch else LaunchOptions()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 16)

    def say(text: str) -> None:
        print(text, flush=True)

    where = "" if manifest.nodes == 1 else f" on {manifest.nodes} nodes"
    say(
        f"drill: {manifest.name}, {manifest.world_size} rank(s){where}, seed {seed}, "
        f"in {args.run_dir}"
    )
    report = run_drill(
        bundle_dir,
        Path(args.run_dir),
        kills=args.kills,
        seed=seed,
        every=args.every,
        kill=args.kill,
        options=options,
        say=say,
    )
    for line in report.lines():
        print(line, file=sys.stdout if report.ok else sys.stderr, flush=True)
    return 0 if report.ok else 1

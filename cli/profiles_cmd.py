"""``dtrain-tui profiles list|show|save|delete|rename|export|import|path``: manage saved set-ups
from the shell. Built on :class:`profiles.store.ProfileStore` (the wizard's profile screen uses
the same store), so a profile saved in one place is the same file everywhere.

Errors (a broken file, an unknown name, a secret) print as one line and exit 2; ``list`` still
shows every other profile when one file is broken, marking the broken one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from profiles.store import ProfileEntry, ProfileStore


def _store(args: argparse.Namespace) -> ProfileStore:
    from profiles.store import ProfileStore

    return ProfileStore(getattr(args, "config_dir", None))


def _when(entry_time: Any) -> str:
    if entry_time is None:
        return "never"
    text: str = entry_time.astimezone().strftime("%Y-%m-%d %H:%M")
    return text


def _entry_json(e: ProfileEntry) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": e.name,
        "source": e.source,
        "path": str(e.path),
        "ok": e.ok,
        "shadows_builtin": e.shadows_builtin,
    }
    if e.profile is not None:
        out.update(
            description=e.description,
            model=e.profile.model_summary(),
            cluster=e.profile.cluster_summary(),
            last_used=e.last_used.isoformat() if e.last_used else None,
            needs_migration=e.needs_migration,
        )
    else:
        out["error"] = e.error
    return out


def _cmd_list(args: argparse.Namespace) -> int:
    store = _store(args)
    entries = store.list()
    if args.json:
        print(json.dumps([_entry_json(e) for e in entries], indent=2))
        return 0
    rows = [("NAME", "SOURCE", "MODEL", "CLUSTER", "LAST USED")]
    broken: list[ProfileEntry] = []
    for e in entries:
        source = "built-in" if e.source == "builtin" else "user"
        if e.shadows_builtin:
            source += "*"
        if e.profile is None:
            broken.append(e)
            rows.append((e.name, source, "BROKEN (see below)", "", ""))
            continue
        rows.append(
            (
                e.name,
                source,
                e.profile.model_summary(),
                e.profile.cluster_summary(),
                _when(e.last_used),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    print(f"\nprofiles dir: {store.profiles_dir}")
    if any(e.shadows_builtin for e in entries):
        print("user*: your profile of the same name replaces the built-in")
    for e in broken:
        print(f"broken: {e.error}", file=sys.stderr)
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    store = _store(args)
    prof = store.load(args.name)
    path = store.path_of(args.name)
    if args.json:
        print(prof.model_dump_json(indent=2, exclude_none=True))
        return 0
    source = "user profile" if store.is_user(args.name) else "built-in preset"
    print(f"# {args.name} ({source}): {path}")
    if prof.profile.description:
        print(f"# {prof.profile.description}")
    print(f"# model: {prof.model_summary()}   cluster: {prof.cluster_summary()}")
    print(f"# last used: {_when(prof.profile.last_used)}")
    print()
    sys.stdout.write(store.text(args.name))
    return 0


def _cmd_save(args: argparse.Namespace) -> int:
    from cli.spec_options import spec_from_args
    from profiles.schema import Profile

    store = _store(args)
    spec = spec_from_args(args)
    prof = Profile.from_spec(args.name, spec, description=args.description or "")
    path = store.save(prof, overwrite=args.force)
    print(f"saved profile {args.name!r} to {path}")
    return 0


def _cmd_delete(args: argparse.Namespace) -> int:
    path = _store(args).delete(args.name)
    print(f"deleted profile {args.name!r} ({path})")
    return 0


def _cmd_rename(args: argparse.Namespace) -> int:
    path = _store(args).rename(args.old, args.new, overwrite=args.force)
    print(f"renamed profile {args.old!r} to {args.new!r} ({path})")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    store = _store(args)
    if args.output is None or str(args.output) == "-":
        sys.stdout.write(store.export(args.name))
        return 0
    store.export(args.name, args.output, overwrite=args.force)
    print(f"exported profile {args.name!r} to {args.output}")
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    name, path = _store(args).import_file(args.file, name=args.name, overwrite=args.force)
    print(f"imported profile {name!r} to {path}")
    return 0


def _cmd_path(args: argparse.Namespace) -> int:
    print(_store(args).profiles_dir)
    return 0


def _config_dir(p: argparse.ArgumentParser) -> None:
    from cli.spec_options import add_config_dir_option

    add_config_dir_option(
        p, "config dir holding profiles/ (default: $DTRAIN_CONFIG_DIR or the platform's)"
    )


def register(subparsers: Any) -> None:
    """Add ``profiles`` and its subcommands."""
    p = subparsers.add_parser(
        "profiles",
        help="list, show, save, delete, rename, export and import saved profiles",
        description="Manage profiles: named set-ups (model, cluster, training, launch) stored "
        "as TOML under <config dir>/profiles/, plus the built-in presets.",
    )
    _config_dir(p)
    sub = p.add_subparsers(dest="profiles_command", metavar="ACTION", required=True)

    q = sub.add_parser("list", help="every profile with its model, cluster and last use")
    _config_dir(q)
    q.add_argument("--json", action="store_true", help="machine-readable list")
    q.set_defaults(func=_cmd_list)

    q = sub.add_parser("show", help="check a profile and print its file")
    _config_dir(q)
    q.add_argument("name")
    q.add_argument("--json", action="store_true", help="the validated profile as JSON")
    q.set_defaults(func=_cmd_show)

    from cli.spec_options import add_spec_options

    q = sub.add_parser(
        "save",
        help="save a set-up given as spec options (or --profile/--spec plus overrides)",
        description="Save a profile from the same options `plan` and `launch` take, e.g. "
        "`dtrain-tui profiles save my-70b --profile 4-node-h100-ib --hosts a,b,c,d`.",
    )
    q.add_argument("name")
    q.add_argument("--description", metavar="TEXT", help="one line shown in the list")
    q.add_argument("--force", action="store_true", help="overwrite an existing profile")
    add_spec_options(q, launch=True)
    q.set_defaults(func=_cmd_save)

    q = sub.add_parser("delete", help="delete one of your profiles")
    _config_dir(q)
    q.add_argument("name")
    q.set_defaults(func=_cmd_delete)

    q = sub.add_parser("rename", help="rename one of your profiles (comments kept)")
    _config_dir(q)
    q.add_argument("old")
    q.add_argument("new")
    q.add_argument("--force", action="store_true", help="replace an existing profile NEW")
    q.set_defaults(func=_cmd_rename)

    q = sub.add_parser("export", help="print a profile's file, or write it with -o FILE")
    _config_dir(q)
    q.add_argument("name")
    q.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here (0600)")
    q.add_argument("--force", action="store_true", help="replace FILE if it exists")
    q.set_defaults(func=_cmd_export)

    q = sub.add_parser("import", help="check a profile file and add it to your profiles")
    _config_dir(q)
    q.add_argument("file", type=Path)
    q.add_argument("--name", metavar="NAME", help="store it under this name")
    q.add_argument("--force", action="store_true", help="replace an existing profile")
    q.set_defaults(func=_cmd_import)

    q = sub.add_parser("path", help="print the directory your profiles live in")
    _config_dir(q)
    q.set_defaults(func=_cmd_path)

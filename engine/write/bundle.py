"""Assemble a run bundle from a plan (:func:`render_bundle`, pure) and write it to a directory
(:func:`write_bundle`): whole or not at all. Every new file is written into a stage directory on
the same file system first; only then is the bundle changed, by renames alone, so a full disk or
any other failure leaves the previous bundle byte for byte as it was, and no stage behind.

Rewriting a bundle never destroys a person's work. A file on disk is *ours* when its sha256 is
the one ``bundle.json`` recorded when dtrain-tui wrote it; ours may be replaced. Any other
existing file with a name the bundle needs (edited by hand, or never written by dtrain-tui) is a
conflict: without ``force`` nothing is written and the error lists the conflicts; with
``force`` each is first renamed to ``NAME.bak-<UTC time>`` and the report says so. A file we
wrote before that the new plan no longer needs is removed when unedited, kept when edited.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import hashlib
import json
import os
import secrets
import shutil
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from engine.errors import DtrainError, one_line
from engine.fsio import JSON_LIMIT, atomic_write_text, read_regular_text, unused_path
from engine.plan.names import Framework
from engine.plan.result import Plan
from engine.write.checks import check_batch_product, check_world
from engine.write.ds_config import Scheduler, ds_config
from engine.write.fsdp import FSDP_VERSION, accelerate_config, fsdp_settings
from engine.write.hostfile import hostfile
from engine.write.launch_scripts import (
    AGENT_SCRIPT,
    PREFLIGHT_SCRIPT,
    node_script_name,
    node_scripts,
)
from engine.write.manifest import MANIFEST, BundleManifest, plain_name
from engine.write.megatron import PRETRAIN_GPT, megatron_args, pretrain_gpt_script
from engine.write.naming import natural_key, run_name
from engine.write.nccl_env import nccl_env
from engine.write.nodes import hosts, master_addr
from engine.write.plan_json import check_ckpt_dir, plan_json
from engine.write.readme import bundle_readme
from engine.write.script import script_args, script_path, uses_example_trainer
from engine.write.sky import sky_yaml
from engine.write.slurm import SBATCH_NAME, slurm_sbatch

EXEC_MODE = 0o755
FILE_MODE = 0o644
PRIVATE_MODE = 0o600
"""Owner-only: for the files that carry the spec's launch.env values (a token, often) when it
has any: plan.json, nccl.env and sky.yaml."""


@dataclass(frozen=True)
class BundleFile:
    """One file of a bundle: its text and permission bits."""

    text: str
    mode: int = FILE_MODE

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class WriteOptions:
    """Choices that are not part of the spec (``write`` command options)."""

    scheduler: Scheduler = Scheduler.NONE
    warmup_steps: int | None = None
    fsdp_version: int = FSDP_VERSION
    """FSDP API named in fsdp.json and accelerate_config.yaml (2: fully_shard, 1: the wrapper)."""


@dataclass
class WriteReport:
    """What :func:`write_bundle` did, file by file."""

    out_dir: Path
    written: list[str] = field(default_factory=list)
    """Files created or replaced."""
    unchanged: list[str] = field(default_factory=list)
    """Files already on disk with exactly the new content."""
    backed_up: dict[str, str] = field(default_factory=dict)
    """File -> backup name, for changed or foreign files replaced under ``force``."""
    removed: list[str] = field(default_factory=list)
    """Files from the previous bundle that this plan no longer needs (unedited)."""
    kept: list[str] = field(default_factory=list)
    """Files from the previous bundle this plan no longer needs, kept because they were edited."""

    def lines(self) -> list[str]:
        """Human-readable summary, one line per file."""
        out = [f"wrote {name}" for name in self.written]
        out += [f"unchanged {name}" for name in self.unchanged]
        out += [f"backed up your {name} as {bak}" for name, bak in self.backed_up.items()]
        out += [f"removed stale {name}" for name in self.removed]
        out += [f"kept {name} (edited; no longer used by this plan)" for name in self.kept]
        return out


def example_trainer_text() -> str:
    """The shipped example trainer, ``engine/trainer/train.py``."""
    try:
        return resources.files("engine").joinpath("trainer/train.py").read_text(encoding="utf-8")
    except (FileNotFoundError, OSError):
        raise DtrainError(
            "the example trainer engine/trainer/train.py is not installed; "
            "reinstall dtrain-tui or pass --script YOUR_SCRIPT",
            field="launch.script",
        ) from None


def preflight_text() -> str:
    """The shipped rank-side preflight, ``engine/trainer/preflight.py`` (in every bundle)."""
    try:
        return (
            resources.files("engine").joinpath("trainer/preflight.py").read_text(encoding="utf-8")
        )
    except (FileNotFoundError, OSError):
        raise DtrainError(
            "the preflight engine/trainer/preflight.py is not installed; reinstall dtrain-tui",
            field="bundle",
        ) from None


def agent_text() -> str:
    """The shipped rank agent, ``engine/trainer/agent.py`` (in every bundle as
    ``dtrain_agent.py``: every rank starts through it)."""
    try:
        return resources.files("engine").joinpath("trainer/agent.py").read_text(encoding="utf-8")
    except (FileNotFoundError, OSError):
        raise DtrainError(
            "the rank agent engine/trainer/agent.py is not installed; reinstall dtrain-tui",
            field="bundle",
        ) from None


def _check(plan: Plan) -> None:
    check_world(plan)
    check_ckpt_dir(plan)
    check_batch_product(plan.recommended)
    hosts(plan)
    script_path(plan)
    script_args(plan)


def render_bundle(plan: Plan, options: WriteOptions | None = None) -> dict[str, BundleFile]:
    """Every file of the bundle except ``bundle.json``, by name. Pure; raises DtrainError."""
    opts = options or WriteOptions()
    _check(plan)
    env_mode = PRIVATE_MODE if plan.spec.launch.env else FILE_MODE
    files: dict[str, BundleFile] = {"plan.json": BundleFile(plan_json(plan), env_mode)}
    for name, text in node_scripts(plan).items():
        files[name] = BundleFile(text, EXEC_MODE)
    files["nccl.env"] = BundleFile(nccl_env(plan), env_mode)
    files["hostfile"] = BundleFile(hostfile(plan))
    files["sky.yaml"] = BundleFile(sky_yaml(plan), env_mode)
    files[SBATCH_NAME] = BundleFile(slurm_sbatch(plan))
    fw = plan.recommended.framework
    if fw == Framework.DEEPSPEED:
        files["ds_config.json"] = BundleFile(
            ds_config(plan, scheduler=opts.scheduler, warmup_steps=opts.warmup_steps)
        )
    elif opts.scheduler != Scheduler.NONE:
        raise DtrainError(
            f"--scheduler is written into ds_config.json; this plan uses {fw.value}, not DeepSpeed",
            field="--scheduler",
        )
    if fw == Framework.FSDP:
        files["fsdp.json"] = BundleFile(fsdp_settings(plan, version=opts.fsdp_version))
        files["accelerate_config.yaml"] = BundleFile(
            accelerate_config(plan, version=opts.fsdp_version)
        )
    if fw == Framework.MEGATRON:
        files["megatron_args.txt"] = BundleFile(megatron_args(plan))
        files[PRETRAIN_GPT] = BundleFile(pretrain_gpt_script(plan), EXEC_MODE)
    if uses_example_trainer(plan):
        files["train.py"] = BundleFile(example_trainer_text())
    # Every bundle, whatever its training script: `dtrain-tui preflight` runs it in this world.
    files[PREFLIGHT_SCRIPT] = BundleFile(preflight_text())
    # Every bundle: every rank, whatever its script, starts through the rank agent.
    files[AGENT_SCRIPT] = BundleFile(agent_text())
    files["README.md"] = BundleFile(bundle_readme(plan, [*files, MANIFEST]))
    return {name: files[name] for name in sorted(files, key=natural_key)}


def manifest_for(plan: Plan, files: dict[str, BundleFile]) -> BundleManifest:
    """The ``bundle.json`` manifest recording ``files``' hashes."""
    launch = plan.spec.launch
    return BundleManifest(
        name=run_name(plan),
        framework=plan.recommended.framework,
        launcher="torchrun",
        dist_backend=plan.gpu.dist_backend,
        nodes=plan.nodes,
        gpus_per_node=plan.gpus_per_node,
        hosts=list(launch.hosts),
        master_addr=master_addr(plan) or "",
        master_port=launch.master_port,
        node_scripts=[node_script_name(i) for i in range(plan.nodes)],
        script=script_path(plan),
        script_args=script_args(plan),
        files={name: f.sha256 for name, f in files.items()},
        sky_yaml="sky.yaml",
        backend=launch.backend,
    )


def manifest_text(manifest: BundleManifest) -> str:
    return json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n"


def _sha_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_NAMED_FILES = frozenset({"files", "node_scripts", "sky_yaml"})
"""Manifest fields that name files in the bundle directory."""


def _previous(out: Path) -> tuple[dict[str, str], bool]:
    """Hashes recorded by the previous bundle.json, and whether bundle.json is ours.

    A manifest naming a file outside the bundle directory (``../x``, ``/x``, ``a/b``) is
    refused outright: its names are what a rewrite replaces and deletes."""
    path = out / MANIFEST
    if not path.exists():
        return {}, True
    try:
        data = json.loads(read_regular_text(path, JSON_LIMIT, label=str(path)))
        return dict(BundleManifest.model_validate(data).files), True
    except ValidationError as e:
        if any(err.get("loc", ("",))[0] in _NAMED_FILES for err in e.errors()):
            raise DtrainError(
                f"{path}: {one_line(e)}; nothing was written (fix or remove {MANIFEST})",
                field="--out",
            ) from None
        return {}, False
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, DtrainError):
        return {}, False  # not one dtrain-tui wrote (a DtrainError: not a regular file)


def write_bundle(
    plan: Plan,
    out_dir: Path,
    *,
    force: bool = False,
    options: WriteOptions | None = None,
) -> WriteReport:
    """Write the bundle for ``plan`` into ``out_dir`` (created if missing).

    Raises DtrainError, before writing anything, when a needed file exists and is not ours
    (edited since dtrain-tui wrote it, or never written by it) unless ``force``: then each such
    file is kept as ``NAME.bak-<UTC time>`` first. A failure on the disk (no space left) is a
    one-line DtrainError, and the previous bundle is left as it was."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DtrainError(f"{out} exists and is not a directory; pass a directory", field="--out")
    if out.is_symlink() and not out.exists():
        raise DtrainError(
            f"{out} is a symlink to {out.readlink()}, which does not exist; pass a directory, "
            "or create the target first",
            field="--out",
        )
    files = render_bundle(plan, options)
    manifest_file = BundleFile(manifest_text(manifest_for(plan, files)))
    recorded, manifest_ours = _previous(out) if out.is_dir() else ({}, True)
    report = WriteReport(out_dir=out)

    todo, conflicts = _sort_out(out, files, recorded, report)
    if not manifest_ours:
        conflicts.append((MANIFEST, "not a dtrain-tui manifest"))
    if conflicts and not force:
        listed = ", ".join(f"{n} ({why})" for n, why in conflicts)
        raise DtrainError(
            f"{out}: refusing to replace {listed}; nothing was written. Pass --force to keep "
            "each as NAME.bak-<time> and write the new files, or choose another --out",
            field="--out",
        )

    # Everything is written into a stage first; only renames touch the bundle after that, so a
    # full disk (or any failure) leaves the previous bundle as it was.
    backups = [name for name, _why in conflicts]
    todo += [name for name in backups if name in files]
    new = {name: files[name] for name in sorted(todo, key=natural_key)}
    mpath = out / MANIFEST
    if mpath.is_file() and not mpath.is_symlink() and _sha_file(mpath) == manifest_file.sha256:
        report.unchanged.append(MANIFEST)
    else:
        # The manifest last: were the renames cut short (SIGKILL), the old one, whose hashes
        # still protect the user's files, would stay.
        new[MANIFEST] = manifest_file
    stale, report.kept = _stale(out, files, recorded)
    had_bundle = mpath.exists()
    made = _missing_parents(out)
    stage: _Stage | None = None
    try:
        stage = _Stage(out)
        stage.write(new)
        stage.swap(backups, stale, list(new), report)
    except BaseException as e:
        if stage is not None:
            stage.undo()
        for d in made:
            with contextlib.suppress(OSError):
                d.rmdir()
        if isinstance(e, OSError) and stage is not None:
            raise _write_failed(out, e, had_bundle) from None
        raise  # no stage could be made (a parent is a file, no permission): said by the caller
    stage.finish()
    report.written = list(new)
    report.removed = stale
    report.unchanged.sort()
    return report


def _sort_out(
    out: Path, files: dict[str, BundleFile], recorded: dict[str, str], report: WriteReport
) -> tuple[list[str], list[tuple[str, str]]]:
    """Each bundle file against what is on disk: to write (absent, or ours and outdated),
    unchanged (recorded in ``report``, its mode fixed), or a conflict with the reason."""
    conflicts: list[tuple[str, str]] = []
    todo: list[str] = []
    for name, f in files.items():
        path = out / name
        if not path.exists() and not path.is_symlink():
            todo.append(name)
            continue
        if path.is_symlink() or not path.is_file():
            conflicts.append((name, "not a regular file"))
            continue
        current = _sha_file(path)
        if current == f.sha256:
            report.unchanged.append(name)
            if (path.stat().st_mode & 0o777) != f.mode:
                os.chmod(path, f.mode)
        elif recorded.get(name) == current:
            todo.append(name)
        elif name in recorded:
            conflicts.append((name, "edited since dtrain-tui wrote it"))
        else:
            conflicts.append((name, "not written by dtrain-tui"))
    return todo, conflicts


def _stale(
    out: Path, files: dict[str, BundleFile], recorded: dict[str, str]
) -> tuple[list[str], list[str]]:
    """Files the previous bundle had that this plan does not produce: (to remove, as they are
    unedited; to keep, as they were edited)."""
    remove: list[str] = []
    kept: list[str] = []
    for name, old_hash in sorted(recorded.items()):
        plain_name(name)  # checked when read; never delete outside ``out``
        path = out / name
        if name in files or name == MANIFEST or path.is_symlink() or not path.is_file():
            continue
        (remove if _sha_file(path) == old_hash else kept).append(name)
    return remove, kept


def _missing_parents(out: Path) -> list[Path]:
    """The directories above ``out`` that do not exist yet, deepest first: made for the write,
    removed again when it fails."""
    missing: list[Path] = []
    parent = out.absolute().parent
    while not parent.exists() and not parent.is_symlink() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    return missing


def _write_failed(out: Path, e: OSError, had_bundle: bool) -> DtrainError:
    """One line for a write that failed on the disk, and what became of the bundle."""
    after = "the previous bundle is unchanged" if had_bundle else "nothing was written"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return DtrainError(
            f"no space left on device writing {out}; {after} (free some space, or pass "
            "another --out)",
            field="--out",
        )
    where = e.filename or out
    return DtrainError(
        f"cannot write {where}: {e.strerror or e}; {after} (pass a writable directory)",
        field="--out",
    )


_STAGE_PREFIX = ".dtrain-stage-"


class _Stage:
    """A bundle written whole or not at all. :meth:`write` puts every new file into a stage
    directory on the bundle's file system (inside ``out`` when it exists; else beside it, to
    become ``out`` by one rename). :meth:`swap` then only renames: each replaced, backed-up or
    stale file aside into the stage, each new file in, the manifest last; :meth:`undo` renames
    every one back, so a failure at any point leaves the previous bundle as it was, and
    :meth:`finish` removes the stage with the replaced files in it."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.fresh = not out.is_dir()
        where = out.parent if self.fresh else out
        if self.fresh and where.exists() and not where.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(where))
        if self.fresh:
            where.mkdir(parents=True, exist_ok=True)
        prefix = f".{out.name}{_STAGE_PREFIX}" if self.fresh else _STAGE_PREFIX
        self.dir = _new_dir(where, prefix)
        self.new = self.dir if self.fresh else self.dir / "new"
        self.old = self.dir / "old"
        self._moved: list[tuple[Path, Path]] = []
        """Renames done by :meth:`swap`, in order: what :meth:`undo` reverses."""

    def write(self, files: dict[str, BundleFile]) -> None:
        if not self.fresh:
            self.new.mkdir()
            self.old.mkdir()
        for name, f in files.items():
            atomic_write_text(self.new / name, f.text, mode=f.mode)

    def swap(
        self, backups: list[str], stale: list[str], names: list[str], report: WriteReport
    ) -> None:
        if self.fresh:
            self._move(self.dir, self.out)
            return
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        for name in backups:
            path = self.out / name
            bak = unused_path(path, f".bak-{stamp}")
            self._move(path, bak)
            report.backed_up[name] = bak.name
        for name in stale:
            self._move(self.out / name, self.old / name)
        for name in names:
            path = self.out / name
            if path.exists() or path.is_symlink():
                self._move(path, self.old / name)
            self._move(self.new / name, path)
        with contextlib.suppress(OSError):  # the renames on disk before the stage goes
            fd = os.open(self.out, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _move(self, src: Path, dst: Path) -> None:
        os.rename(src, dst)
        self._moved.append((src, dst))

    def undo(self) -> None:
        """Every rename back, newest first; then the stage goes, unless a file could not be put
        back (it stays in the stage, not lost)."""
        stuck = False
        for src, dst in reversed(self._moved):
            try:
                os.rename(dst, src)
            except OSError:
                stuck = True
        self._moved.clear()
        if not stuck:
            shutil.rmtree(self.dir, ignore_errors=True)

    def finish(self) -> None:
        if not self.fresh:
            shutil.rmtree(self.dir, ignore_errors=True)


def _new_dir(where: Path, prefix: str) -> Path:
    """A new directory ``where/<prefix><random>``, made with the usual permissions (mkdtemp's
    are 0700, and a fresh stage becomes the bundle directory)."""
    for _ in range(100):
        path = where / f"{prefix}{secrets.token_hex(4)}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, "no unused stage directory name", str(where))


@dataclass
class WritePreview:
    """What :func:`write_bundle` would do in ``out_dir``, file by file, without touching it:
    what a person confirms before anything is replaced or removed."""

    out_dir: Path
    new: list[str] = field(default_factory=list)
    """Files not on disk yet: created."""
    changed: list[str] = field(default_factory=list)
    """Files dtrain-tui wrote, unedited, whose content changes: replaced."""
    unchanged: list[str] = field(default_factory=list)
    """Files already on disk with exactly the new content."""
    conflicts: dict[str, str] = field(default_factory=dict)
    """File -> why it is in the way (edited, not ours, not a regular file): the write refuses,
    and under ``force`` renames each to ``NAME.bak-<UTC time>`` first."""
    removed: list[str] = field(default_factory=list)
    """Files of the previous bundle this plan no longer needs (unedited): deleted."""
    kept: list[str] = field(default_factory=list)
    """Files of the previous bundle this plan no longer needs, edited: left in place."""

    @property
    def touches_existing(self) -> bool:
        """The write would replace, back up or delete something already on disk."""
        return bool(self.changed or self.conflicts or self.removed)

    def lines(self) -> list[str]:
        """What the write would do to files already there, one line per kind (empty: it only
        creates files or finds them unchanged)."""
        out: list[str] = []
        if self.removed:
            out.append(f"remove {', '.join(self.removed)} (no longer used by this plan; unedited)")
        if self.conflicts:
            out.append(
                "back up "
                + ", ".join(f"{n} ({why})" for n, why in self.conflicts.items())
                + " as NAME.bak-<time>, then write the new "
                + ("files" if len(self.conflicts) > 1 else "file")
            )
        if self.changed:
            out.append(f"replace {', '.join(self.changed)} (changed by this plan)")
        if self.kept:
            out.append(f"keep {', '.join(self.kept)} (edited; no longer used by this plan)")
        return out


def preview_write(files: dict[str, str], out_dir: Path) -> WritePreview:
    """What writing a bundle of ``files`` (name -> text, as :func:`render_bundle` gives, without
    ``bundle.json``) into ``out_dir`` would create, replace, back up and remove. Reads the
    directory, writes nothing; raises DtrainError where :func:`write_bundle` would refuse the
    directory itself (a file, a manifest naming paths outside it)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DtrainError(f"{out} exists and is not a directory; pass a directory", field="--out")
    prev = WritePreview(out_dir=out)
    if not out.is_dir():
        prev.new = sorted(files, key=natural_key)
        return prev
    recorded, manifest_ours = _previous(out)
    for name in sorted(files, key=natural_key):
        path = out / name
        if not path.exists() and not path.is_symlink():
            prev.new.append(name)
            continue
        if path.is_symlink() or not path.is_file():
            prev.conflicts[name] = "not a regular file"
            continue
        current = _sha_file(path)
        if current == hashlib.sha256(files[name].encode("utf-8")).hexdigest():
            prev.unchanged.append(name)
        elif recorded.get(name) == current:
            prev.changed.append(name)
        elif name in recorded:
            prev.conflicts[name] = "edited since dtrain-tui wrote it"
        else:
            prev.conflicts[name] = "not written by dtrain-tui"
    if not manifest_ours:
        prev.conflicts[MANIFEST] = "not a dtrain-tui manifest"
    for name, old_hash in sorted(recorded.items()):
        path = out / name
        if name in files or name == MANIFEST or path.is_symlink() or not path.is_file():
            continue
        (prev.removed if _sha_file(path) == old_hash else prev.kept).append(name)
    return prev

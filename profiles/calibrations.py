"""Saved calibrations: ``<config dir>/calibrations/NAME.json``, one
:class:`~engine.plan.calibration.Calibration` each.

Written by ``dtrain-tui calibrate`` and the monitor's "calibrate from this run"; read by
``plan/write/launch --calibration NAME`` (:mod:`cli.spec_options`) and by a profile naming one
(``[profile] calibration = "NAME"``). Promises, as the profile store's: the config dir is the
argument, else ``$DTRAIN_CONFIG_DIR``, else the platform's; writes are atomic (temp file and
rename), files 0600 in a 0700 directory; an existing calibration is never replaced unless asked
(``overwrite=True``); a broken file is one :class:`ProfileError` line naming it.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

from pydantic import ValidationError

from engine.errors import DtrainError, validation_messages
from engine.fsio import JSON_LIMIT, atomic_write_text, read_regular_text, sweep_stale_temps
from engine.plan.calibration import Calibration
from profiles.schema import NAME_RE, ProfileError
from profiles.store import ProfileStore, _ensure_private_dir, default_config_dir
from profiles.tomldoc import FILE_MODE, fs_errors

SUFFIX = ".json"


def safe_name(text: str) -> str:
    """A calibration name made of ``text`` (a run directory's name): the characters a profile
    name allows, at most 64."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")[:64].rstrip("-._")
    return name or "run"


class CalibrationStore:
    """The user's saved calibrations."""

    def __init__(self, config_dir: Path | None = None) -> None:
        self.config_dir = Path(config_dir).expanduser() if config_dir else default_config_dir()

    @property
    def directory(self) -> Path:
        return self.config_dir / "calibrations"

    def path(self, name: str) -> Path:
        check_name(name)
        return self.directory / f"{name}{SUFFIX}"

    def names(self) -> list[str]:
        if not self.directory.is_dir():
            return []
        return sorted(
            p.stem
            for p in self.directory.glob(f"*{SUFFIX}")
            if not p.name.startswith(".") and _valid(p.stem)
        )

    def exists(self, name: str) -> bool:
        return self.path(name).is_file()

    def load(self, name: str) -> Calibration:
        """The calibration saved as ``name``; a missing or broken file is one line."""
        path = self.path(name)
        try:
            text = read_regular_text(path, JSON_LIMIT, label=str(path), follow=True)
        except DtrainError as e:
            raise ProfileError(e.message, field="--calibration") from None
        except FileNotFoundError:
            close = difflib.get_close_matches(name, self.names(), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ProfileError(
                f"no calibration named {name!r}; {hint}`dtrain-tui calibrate RUN_DIR --name "
                f"{name}` makes one (saved in {self.directory})",
                field="--calibration",
            ) from None
        except (OSError, UnicodeDecodeError) as e:
            raise ProfileError(f"cannot read {path}: {e}", field="--calibration") from None
        return load_file(path, text)

    def check_free(self, name: str) -> None:
        """Refuse (one line) when a calibration ``name`` exists."""
        path = self.path(name)
        if path.exists():
            raise ProfileError(
                f"a calibration named {name!r} exists ({path}); pass another --name, or "
                "--force to replace it",
                field="--name",
            )

    def save(self, cal: Calibration, *, overwrite: bool = False) -> Path:
        """Write ``cal`` as ``<dir>/<cal.name>.json``; an existing one is refused unless
        ``overwrite``."""
        path = self.path(cal.name)
        if not overwrite:
            self.check_free(cal.name)
        with fs_errors(path):
            _ensure_private_dir(self.directory)
            sweep_stale_temps(self.directory)
            atomic_write_text(path, cal.model_dump_json(indent=2) + "\n", mode=FILE_MODE)
        return path

    def attach(self, profile: str, name: str) -> Path:
        """Make the user's profile ``profile`` use calibration ``name`` (its ``[profile]
        calibration`` key; comments in the file are kept). Returns the profile's path."""
        self.path(name)
        store = ProfileStore(self.config_dir)
        prof = store.load(profile)
        meta = prof.profile.model_copy(update={"calibration": name})
        return store.save(prof.model_copy(update={"profile": meta}), name=profile)


def load_file(path: Path, text: str | None = None) -> Calibration:
    """A calibration from a JSON file (what ``--calibration FILE.json`` reads)."""
    try:
        if text is None:
            text = read_regular_text(path, JSON_LIMIT, label=str(path), follow=True)
        return Calibration.model_validate(json.loads(text))
    except DtrainError as e:
        raise ProfileError(e.message, field="--calibration") from None
    except FileNotFoundError:
        raise ProfileError(f"{path} not found", field="--calibration") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        if isinstance(e, ValidationError):
            why = "; ".join(validation_messages(e))
        else:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ProfileError(
            f"{path} is not a calibration: {why}; make it again with `dtrain-tui calibrate`",
            field="--calibration",
        ) from None


def resolve(ref: str, config_dir: Path | None = None) -> Calibration:
    """``--calibration`` given ``ref``: a path to a ``.json`` file, else a saved name."""
    if ref.endswith(SUFFIX) or "/" in ref:
        return load_file(Path(ref).expanduser())
    return CalibrationStore(config_dir).load(ref)


def check_name(name: str) -> str:
    """``name`` if it can name a calibration file, else one :class:`ProfileError` line."""
    if not isinstance(name, str) or not NAME_RE.match(name) or name.endswith(SUFFIX):
        raise ProfileError(
            f"{name!r} is not a calibration name; use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
            field="--name",
        )
    return name


def _valid(stem: str) -> bool:
    return NAME_RE.match(stem) is not None

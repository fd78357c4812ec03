"""``dtrain-tui``: the console entry point. With no subcommand it opens the wizard (Textual is
imported only then); the headless subcommands (plan, write, launch, monitor, model, gpus,
profiles) import only what they use, so ``plan --json`` starts fast and never loads torch.

Each subcommand lives in its own module exposing ``register(subparsers)``; errors a person can act
on (:class:`engine.errors.DtrainError`, pydantic validation) print as one line and exit 2.
Ctrl-C anywhere, even while the first modules load, exits 130 without a traceback: this module
imports only the standard library at the top (pydantic comes with engine.errors, inside main).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

# Subcommand modules, each with register(subparsers), in the order `--help` lists them.
_COMMANDS = (
    "cli.model_cmd",
    "cli.plan_cmd",
    "cli.write_cmd",
    "cli.launch_cmd",
    "cli.monitor_cmd",
    "cli.drill_cmd",
    "cli.preflight_cmd",
    "cli.calibrate_cmd",
    "cli.profiles_cmd",
)


# The module that registers each subcommand: `dtrain-tui plan` imports plan_cmd alone, and the
# bare `dtrain-tui` (the wizard) none of them; `--help` and unknown words still see all.
_MODULE_OF = {
    "model": "cli.model_cmd",
    "gpus": "cli.model_cmd",
    "plan": "cli.plan_cmd",
    "write": "cli.write_cmd",
    "launch": "cli.launch_cmd",
    "monitor": "cli.monitor_cmd",
    "drill": "cli.drill_cmd",
    "preflight": "cli.preflight_cmd",
    "calibrate": "cli.calibrate_cmd",
    "profiles": "cli.profiles_cmd",
}
_NONE = ""


def _commands_needed(words: list[str]) -> str | None:
    """The one module to import for ``words``, ``_NONE`` for none, None for all."""
    if any(w in ("-h", "--help") for w in words):
        return None
    for i, w in enumerate(words):
        if w.startswith("-"):
            continue
        if i > 0 and words[i - 1] in ("--profile", "--config-dir"):
            continue
        return _MODULE_OF.get(w)
    return _NONE


class _Parser(argparse.ArgumentParser):
    """An argument error is one line naming the option, plus where to look; not the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dtrain-tui",
        description="Plan, configure, launch and watch distributed training.",
    )
    parser.add_argument("--profile", metavar="NAME", help="open the wizard filled from a profile")
    parser.add_argument("--config-dir", type=Path, metavar="DIR", help="profiles directory root")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for modname in _COMMANDS:
        if only is not None and modname != only:
            continue
        importlib.import_module(modname).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # While the modules load, Ctrl-C is only recorded: raised inside an extension module's
    # initialisation (pydantic-core's Rust init importing datetime) it makes Rust print a panic
    # and a traceback before Python could catch anything. Loading takes a fraction of a second;
    # a Ctrl-C that came meanwhile ends the command right after it, exit 130. Then Ctrl-C is
    # KeyboardInterrupt again, but remembered: a library that turns it into an error of its own
    # still ends as an interrupt.
    interrupted: list[int] = []

    def on_sigint(signum: int, frame: object) -> None:
        interrupted.append(signum)
        if not loading:
            raise KeyboardInterrupt

    loading = True
    saved = None
    with contextlib.suppress(ValueError):  # ValueError: not the main thread
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            saved = signal.signal(signal.SIGINT, on_sigint)
    try:
        words = list(sys.argv[1:] if argv is None else argv)
        import pydantic_core  # noqa: F401 - the extension module, loaded while Ctrl-C waits

        parser = build_parser(_commands_needed(words))
        loading = False
        if interrupted:
            return _interrupted()
        return _main(parser, words, interrupted)
    except KeyboardInterrupt:
        return _interrupted()
    except BaseException as e:
        # A Ctrl-C that a library (pydantic's Rust core: a PanicException, a BaseException)
        # turned into an error of its own.
        if interrupted and not isinstance(e, SystemExit):
            return _interrupted()
        raise
    finally:
        if saved is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGINT, saved)


def _interrupted() -> int:
    with contextlib.suppress(OSError, ValueError):
        print("dtrain-tui: interrupted", file=sys.stderr)
    return 130


def _main(parser: argparse.ArgumentParser, words: list[str], interrupted: list[int]) -> int:
    from engine.errors import DtrainError, one_line

    args = parser.parse_args(words)
    try:
        if args.command is None:
            from tui.app import run_app

            return int(run_app(profile=args.profile, config_dir=args.config_dir))
        code: int = args.func(args)
        return code
    except DtrainError as e:
        print(f"dtrain-tui: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except Exception as e:  # noqa: BLE001
        if interrupted:  # a Ctrl-C some library turned into an error of its own
            return _interrupted()
        from pydantic import ValidationError

        if isinstance(e, ValidationError):
            print(f"dtrain-tui: error: {one_line(e)}", file=sys.stderr)
            return 2
        if isinstance(e, OSError | RecursionError | UnicodeDecodeError):
            # A last net: each command names its own field for these; never a traceback.
            print(f"dtrain-tui: error: {_system_error_line(e)}", file=sys.stderr)
            return 2
        raise


def _system_error_line(e: BaseException) -> str:
    """One line for a file-system, encoding or nesting error no command caught itself."""
    if isinstance(e, RecursionError):
        text = "the input nests too deeply to read"
    elif isinstance(e, UnicodeDecodeError):
        text = f"a file is not UTF-8 text (byte {e.start}); save it as UTF-8"
    elif isinstance(e, OSError) and e.filename:
        text = f"{e.filename}: {e.strerror or e}"
    else:
        text = str(e) or type(e).__name__
    return " ".join(text.split())

"""``dtrain-tui preflight``: being built."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("preflight", help="(being built)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    print("dtrain-tui: preflight is being built")
    return 2

"""Time the profile secret scanner (:func:`profiles.secrets.find_secret`) over long fields: runs
of letters (what made the old patterns quadratic) and a few token-dense shapes, in the
description (prose rules) and in ``launch.remote_setup`` (prose plus the shell rules), and the
guard's refusal of an oversized field (:func:`profiles.schema.check_secrets`).

One line per case: ``secret_scan shape=<shape> field=<field> kb=<size> seconds=<best of 3>``;
last line: ``secret_scan_max_s=<slowest case>`` (target: under 0.5 s for 1 MB on a loaded
machine; the scanner before this one took 20 s at 128 KB and over 120 s at 1 MB).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from profiles.schema import ProfileError, check_secrets  # noqa: E402
from profiles.secrets import find_secret  # noqa: E402

SIZES_KB = (128, 256, 1024)
SHAPES: dict[str, Callable[[int], str]] = {
    "letters": lambda n: "a" * n,
    "words": lambda n: ("abc " * (n // 4 + 1))[:n],
    "assignments": lambda n: ("a=" * (n // 2 + 1))[:n],
    "url-ish": lambda n: ("a://" * (n // 4 + 1))[:n],
}
FIELDS: dict[str, Callable[[str], dict[str, object]]] = {
    "description": lambda text: {"profile": {"description": text}},
    "remote_setup": lambda text: {"launch": {"remote_setup": text}},
}


def _best(fn: Callable[[], object], runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _refuse(data: dict[str, object]) -> None:
    try:
        check_secrets(data, where="bench")
    except ProfileError:
        return
    raise AssertionError("an oversized field was accepted")


def main() -> None:
    worst = 0.0
    for shape, make in SHAPES.items():
        for kb in SIZES_KB:
            text = make(kb * 1024)
            for field, wrap in FIELDS.items():
                data = wrap(text)
                s = _best(lambda data=data: find_secret(data))
                worst = max(worst, s)
                print(
                    f"secret_scan shape={shape} field={field} kb={kb} seconds={s:.4f}", flush=True
                )
    data = FIELDS["remote_setup"]("a" * (1024 * 1024))
    s = _best(lambda: _refuse(data))
    print(f"secret_scan check_secrets_refuses_1mb_s={s:.4f}")
    print(f"secret_scan_max_s={worst:.4f}")


if __name__ == "__main__":
    main()

"""False hangs after a stopped launcher: 10 real local launches (2 CPU ranks over gloo, torchrun),
each launcher SIGSTOPped after its ranks' first line until every process of the run ended and
longer than ``--hang-timeout`` (4 s), then SIGCONT (as Ctrl-Z then ``fg``, or a paused VM). Each
run should end ``succeeded``; one that ends ``failed: hang`` is a false hang.
Last line: ``N false hangs in 10``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.test_launcher_stopped import stopped_launcher_trial  # noqa: E402

TRIALS = 10


def main() -> int:
    false_hangs = 0
    with tempfile.TemporaryDirectory(prefix="dtrain-stopped-") as tmp:
        for i in range(TRIALS):
            got = stopped_launcher_trial(Path(tmp) / f"t{i}")
            print(f"trial {i + 1}: {got}", flush=True)
            false_hangs += "hang" in got
    print(f"{false_hangs} false hangs in {TRIALS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Suite-wide fixtures.

Signal dispositions: a test runner started from a script in the background (``cmd &``) inherits
SIGINT as ignored, and one under ``nohup`` SIGHUP; every process a test starts would inherit that
too, so a test that sends a launcher Ctrl-C or SIGHUP would test a launcher that was told to
ignore it (and correctly does). The suite runs as if from a terminal: an ignored SIGINT, SIGHUP or
SIGTERM is put back to its default for the session, which the children inherit. A test that wants
an ignored signal sets it in its child (``preexec_fn``).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _signals_as_from_a_terminal() -> Iterator[None]:
    defaults = {
        signal.SIGINT: signal.default_int_handler,  # KeyboardInterrupt here, SIG_DFL after exec
        signal.SIGHUP: signal.SIG_DFL,
        signal.SIGTERM: signal.SIG_DFL,
    }
    saved = {}
    for sig, handler in defaults.items():
        if signal.getsignal(sig) == signal.SIG_IGN:
            saved[sig] = signal.signal(sig, handler)
    yield
    for sig, old in saved.items():
        signal.signal(sig, old)

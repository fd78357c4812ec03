"""Starting a launcher thread that a Ctrl-C cannot cut in two (the supervisor's).

Called by :class:`engine.launch.supervise.Supervisor` when it starts watching a run.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType


def start_whole(thread: threading.Thread) -> None:
    """``thread.start()`` that a Ctrl-C cannot cut in two. An interrupt raised inside
    ``Thread.start`` (while it waits for the new thread to begin) leaves a thread that runs but
    is not known to have started: starting it again then runs a second copy of it, and one of
    the two dies on CPython's bookkeeping with a traceback. On the main thread SIGINT is held
    while the thread starts and delivered to its handler as soon as it has."""
    if threading.current_thread() is not threading.main_thread():
        thread.start()  # signals are handled on the main thread only
        return
    held: list[tuple[int, FrameType | None]] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    try:
        thread.start()
    finally:
        signal.signal(signal.SIGINT, previous)
    if not held:
        return
    if callable(previous):
        previous(*held[0])
    elif previous == signal.SIG_DFL:
        signal.raise_signal(signal.SIGINT)

"""The launcher's side of the reaper (:mod:`engine.launch.reaper`): start it beside a run and tell
it when the run ended here. Used by the backends whose run lives on this machine or in a job this
machine submitted (local, slurm): if the launcher is killed outright, the pipe closes and the
reaper sweeps the run's processes, cancels its Slurm job (``RUN/slurm.json``) and marks run.json.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from engine.launch import reaper


class ReaperGuard:
    """One reaper process per run, reading a pipe only this process can write."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._pipe: int | None = None
        """Write end of the reaper's stdin: closed when this process ends, however it ends."""

    def start(self, run_id: str, run_dir: Path) -> None:
        """Start the reaper (its own session, no DTRAIN_RUN_ID in its environment, so no sweep
        of ours kills it); close_fds keeps the pipe's write end out of every node script."""
        r, w = os.pipe()
        os.set_inheritable(w, False)
        env = {k: v for k, v in os.environ.items() if k != "DTRAIN_RUN_ID"}
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", reaper.__file__, run_id, str(run_dir), str(os.getpid())],
                stdin=r,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        self._pipe = w

    def done(self) -> None:
        """Tell the reaper the run ended here (it sweeps once more and exits)."""
        w, self._pipe = self._pipe, None
        if w is not None:
            with contextlib.suppress(OSError):
                os.write(w, reaper.DONE)
            os.close(w)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)

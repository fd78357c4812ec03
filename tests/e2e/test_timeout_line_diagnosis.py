"""A rank's collective-timeout line asks for the stuck-rank diagnosis, as a hang does, once per
run: 2 real gloo ranks of the example trainer, rank 1 skipping the all-reduce of step 3, the hang
timeout far away. The node script echoes, as rank 0's output (torchrun's ``[default0]:``
prefix), the lines the test writes into a FIFO: an NCCL watchdog line, then a gloo one. (gloo's
real timeout ends its rank at once, and torchrun then stops the others: nothing would be left
to ask; NCCL's watchdog line comes while every rank still lives.)"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from engine.diagnose.request import diagnosis_of, request_diagnosis, wait_diagnosis
from engine.launch.local import LocalBackend
from engine.launch.options import LaunchOptions
from engine.rundir.files import read_run
from tests.e2e.launch_util import collect, make_bundle, wait_no_pids

SKIP = ["--skip-collective-at-step", "3", "--skip-rank", "1", "--steps", "6"]
NCCL = (
    "[rank0]:[E1125 01:26:38.693 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=8, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, "
    "Timeout(ms)=600000) ran for 600086 milliseconds before timing out."
)
GLOO = (
    "RuntimeError: [unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete"
)


def _inject_lines(bundle: Path) -> str:
    """launch_node0.sh makes a FIFO beside itself (in the run's copy of the bundle), runs
    torchrun in the background and echoes each line of the FIFO as rank 0's; returns the
    FIFO's name."""
    script = bundle / "launch_node0.sh"
    text = script.read_text()
    text = text.replace("mkdir -p logs\n", "mkdir -p logs\nrm -f inject.fifo; mkfifo inject.fifo\n")
    text = text.replace("exec ${TORCHRUN:-torchrun}", "${TORCHRUN:-torchrun}")
    text = text.rstrip("\n") + " &\n"
    text += 'pid=$!\nwhile IFS= read -r line; do echo "[default0]:$line"; done < inject.fifo\n'
    text += 'wait "$pid"\n'
    assert "mkfifo" in text
    script.write_text(text)
    return "inject.fifo"


def test_a_watchdog_line_names_the_stuck_rank_once(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b", script_args=SKIP)
    run = tmp_path / "run"
    fifo = run / "bundle" / _inject_lines(bundle)
    backend = LocalBackend(bundle, run, LaunchOptions(hang_timeout_s=600))
    backend.start()
    events: list[object] = []
    reader = threading.Thread(target=lambda: events.extend(collect(backend, 180)), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        log = run / "logs" / "rank1.stderr.log"
        while not (log.exists() and "stalls" in log.read_text(errors="replace")):
            assert time.monotonic() < deadline, "rank 1 never reached the skipped collective"
            time.sleep(0.1)  # polling the rank's log for the test hook's line
        # Rank 0 enters the extra all-reduce right after rank 1 stalls: a monitor's diagnose
        # says when it has (as in test_stuck_rank), so the timeout's diagnosis has it to name.
        summary = ""
        while "never entered" not in summary:
            assert time.monotonic() < deadline, summary
            diag = wait_diagnosis(run, request_diagnosis(run), timeout=30)
            assert diag is not None, "the launcher did not answer"
            summary = diag.summary
        # The node script holds the FIFO open for reading: a write never blocks (ENXIO if not).
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, f"{NCCL}\n{GLOO}\n".encode())
        finally:
            os.close(fd)
        why, diag = "", None
        while not why.startswith("rank 0 reported a collective timeout: "):
            assert time.monotonic() < deadline, why
            diag = diagnosis_of(run)
            why = diag.why if diag is not None else ""
            time.sleep(0.1)  # polling run.json for the launcher's answer
        assert why.endswith("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=8, "
                            "OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) "
                            "ran for 600086 milliseconds before timing out."), why  # fmt: skip
        assert diag is not None
        assert diag.summary.startswith("rank 1 (node 0, host localhost) never entered "), diag
        assert diag.stuck_ranks == [1]
        # Both lines reached the log; the first one is the run's (one diagnosis a run).
        rank0 = (run / "logs" / "rank0.stdout.log").read_text()
        assert NCCL in rank0 and GLOO in rank0
        assert backend.pump.timeout_line == (0, 0, NCCL)
        assert backend.supervisor.timeout_diagnosed
        assert read_run(run)["state"] == "running"  # a line alone does not end the run
    finally:
        backend.stop()
        reader.join(60)
    assert wait_no_pids(backend.run_id) == []

"""The example trainer's checkpoints survive what a real run meets, for real: torchrun, 2 ranks
over gloo on CPU, the shipped train.py. A rank SIGKILLed at a random step, then the same command
run again, resumes from the newest complete checkpoint and its losses (and final weights) equal an
uninterrupted run's bit for bit (DDP); a save killed between its shards and its completion marker
is ignored and removed on resume; a full disk (a real tmpfs) fails one save in one line, keeps
the previous checkpoint and trains on; FSDP2 resumes at 2 ranks and, resharded, at 1; DeepSpeed
ZeRO-2 resumes through its own load_checkpoint. Nothing here sleeps to wait: a reader thread
sees the lines, the test waits on events and exits with deadlines."""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.e2e.launch_util import free_port, make_bundle, rank_pid, run_pids
from tests.engine.fullfs import small_tmpfs

pytestmark = pytest.mark.slow

STEPS = 8
EVERY = 2
# The trainer's own pacing knob (--sleep-per-step), so that a kill lands mid-run: a tiny model's
# step takes milliseconds, and the whole run would end before the test's signal arrives.
PACE = ["--sleep-per-step", "0.15"]
STEP_RE = re.compile(
    r"^\[default(?P<rank>\d+)\]:\[dtrain\] step=(?P<n>\d+)/\d+ loss=(?P<loss>\S+) "
)
RESUMED_RE = re.compile(r"\[dtrain\] resumed from step=(?P<n>\d+) \((?P<dir>[^)]+)\)")
CKPT_RE = re.compile(
    r"\[dtrain\] checkpoint step=(?P<n>\d+) dir=(?P<dir>\S+) save_s=(?P<save>[\d.]+) "
    r"stall_s=(?P<stall>[\d.]+)$"
)
DEADLINE = 180.0


_STARTED: list[Run] = []
"""Every run a test started, reaped when the test ends however it ends (a failed wait too)."""


@pytest.fixture(autouse=True)
def _reap_runs() -> Any:
    yield
    while _STARTED:
        _STARTED.pop().reap()


class Run:
    """One launch of a bundle's launch_node0.sh in its own session; a thread reads its lines."""

    def __init__(self, bundle: Path, env: dict[str, str] | None = None) -> None:
        self.run_id = uuid.uuid4().hex
        full = {
            **os.environ,
            "MASTER_PORT": str(free_port()),
            "TORCHRUN": f"{sys.executable} -m torch.distributed.run",
            "DS_ACCELERATOR": "cpu",
            "PYTHONUNBUFFERED": "1",
            "DTRAIN_RUN_ID": self.run_id,
            **(env or {}),
        }
        full.pop("MASTER_ADDR", None)
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(
            [str(bundle / "launch_node0.sh")],
            env=full,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        _STARTED.append(self)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def wait_line(self, pattern: str, timeout: float = DEADLINE) -> str:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                hit = next((ln for ln in self.lines if rx.search(ln)), None)
                if hit is not None:
                    return hit
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None and not self.reader.is_alive():
                    pytest.fail(f"no line matching {pattern!r}:\n" + "\n".join(self.lines[-40:]))
                self.cond.wait(min(left, 0.5))

    def finish(self, timeout: float = DEADLINE) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            pytest.fail("run did not end in time:\n" + "\n".join(self.lines[-40:]))
        self.reader.join(timeout)
        return rc

    def kill_all(self) -> None:
        with_pgid = self.proc.pid
        os.killpg(with_pgid, signal.SIGKILL)
        self.reap()
        self.finish()

    def reap(self) -> None:
        """SIGKILL every process of this run: torchrun starts its workers in sessions of their
        own, so killing the script's group leaves the ranks running."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in run_pids(self.run_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def losses(lines: list[str]) -> dict[tuple[int, int], str]:
    """(rank, step) -> the loss each rank printed."""
    return {(int(m["rank"]), int(m["n"])): m["loss"] for ln in lines if (m := STEP_RE.match(ln))}


def run_ok(bundle: Path, env: dict[str, str] | None = None) -> Run:
    r = Run(bundle, env)
    assert r.finish() == 0, r.text[-4000:]
    return r


def flat_state(ckpt: Path, tmp: Path) -> dict[str, Any]:
    """A DCP checkpoint's model and optimizer, read with torch's own converter."""
    out = tmp / f"{ckpt.name}-{uuid.uuid4().hex}.pt"
    dcp_to_torch_save(ckpt, out)
    data = torch.load(out, weights_only=False)
    flat: dict[str, Any] = {}

    def walk(d: Any, key: str) -> None:
        if isinstance(d, dict):
            for k, v in d.items():
                walk(v, f"{key}/{k}")
        else:
            flat[key] = d

    walk(data, "")
    return flat


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k, va in a.items():
        vb = b[k]
        if isinstance(va, torch.Tensor):
            assert torch.equal(va, vb), k
        else:
            assert va == vb, k


def step_dir(bundle: Path, step: int) -> Path:
    return bundle / "checkpoints" / f"step_{step:08d}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[tuple[int, int], str]]:
    """An uninterrupted DDP run of STEPS steps, a checkpoint every EVERY."""
    b = make_bundle(
        tmp_path_factory.mktemp("ref") / "b", steps=STEPS, script_args=["--ckpt-every", str(EVERY)]
    )
    r = run_ok(b)
    got = losses(r.lines)
    assert len(got) == 2 * STEPS
    saves = [m for ln in r.lines if (m := CKPT_RE.search(ln))]
    assert [int(m["n"]) for m in saves] == list(range(EVERY, STEPS + 1, EVERY))
    assert RESUMED_RE.search(r.text) is None
    return b, got


def resumed_from(r: Run, bundle: Path, *, fresh_ok: bool = False) -> int:
    """The step a run said it resumed from (0: it started afresh, where that may be)."""
    m = RESUMED_RE.search(r.text)
    if m is None and fresh_ok:
        return 0
    assert m is not None, r.text[-3000:]
    assert Path(m["dir"]) == step_dir(bundle, int(m["n"]))
    return int(m["n"])


def kill_rank_at(bundle: Path, rank: int, at: int) -> Run:
    """Run the bundle and SIGKILL ``rank`` once it prints step ``at``; the run's end seen."""
    r = Run(bundle)
    r.wait_line(rf"^\[default{rank}\]:\[dtrain\] step={at}/")
    pid = rank_pid(r.run_id, rank)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert r.finish() != 0
    assert "[dtrain] done" not in r.text
    return r


def test_ddp_killed_runs_resume_bit_for_bit_and_a_killed_save_is_removed(
    tmp_path: Path, reference: tuple[Path, dict[tuple[int, int], str]]
) -> None:
    """One run, stopped three times and started again with the same command each time: rank 1
    SIGKILLed at a random step, then rank 0 at a later random step, then the whole run killed
    while a save waits between its shards and its marker (DTRAIN_TEST_CKPT_HOLD)."""
    ref_bundle, ref = reference
    rng = random.Random(20261202)
    b = make_bundle(tmp_path / "b", steps=STEPS, script_args=["--ckpt-every", str(EVERY), *PACE])
    seen = {}

    k1 = rng.randint(3, 4)
    runs = [kill_rank_at(b, 1, k1)]
    k2 = rng.randint(k1 + 1, 6)
    runs.append(kill_rank_at(b, 0, k2))
    # The kill may come before the first save's marker (the save is asynchronous): afresh then.
    r1 = resumed_from(runs[-1], b, fresh_ok=True)
    assert r1 <= k1 and r1 % EVERY == 0

    hold_at = max(k2 - k2 % EVERY, r1) + EVERY
    hold = tmp_path / "holding"
    held = Run(b, {"DTRAIN_TEST_CKPT_HOLD": f"{hold_at}:{hold}"})
    held.wait_line(rf"\[dtrain\] test hook: holding checkpoint step={hold_at} ")
    assert hold.is_file()  # written with every shard on disk and the marker not yet
    held.kill_all()
    runs.append(held)
    r2 = resumed_from(held, b)
    assert r1 <= r2 <= k2
    broken = step_dir(b, hold_at)
    assert (broken / ".metadata").is_file() and not (broken / "COMPLETE").exists()

    last = run_ok(b)
    runs.append(last)
    assert f"[dtrain] removing half-written checkpoint {broken}" in last.text
    r3 = resumed_from(last, b)
    assert r3 == hold_at - EVERY
    after = losses(last.lines)
    assert {s for _, s in after} == set(range(r3 + 1, STEPS + 1))
    for r in runs:
        seen.update(got := losses(r.lines))
        assert got == {k: ref[k] for k in got}
    assert set(seen) == set(ref)
    # Bit for bit: the final weights and optimizer states equal the uninterrupted run's.
    assert_same_state(
        flat_state(step_dir(b, STEPS), tmp_path), flat_state(step_dir(ref_bundle, STEPS), tmp_path)
    )


def test_a_full_disk_fails_one_save_in_one_line_and_training_goes_on(tmp_path: Path) -> None:
    # One checkpoint of this model takes about 1.8 MB: room for one, not two.
    with small_tmpfs(tmp_path / "disk", "3m") as disk:
        b = make_bundle(
            tmp_path / "b", steps=6, script_args=["--ckpt-every", "2", "--ckpt-keep", "3"]
        )
        r = run_ok(b, {"DTRAIN_CKPT_DIR": str(disk)})
        failed = [ln for ln in r.lines if "checkpoint step=4 failed" in ln]
        assert failed == [
            "[default0]:[dtrain] checkpoint step=4 failed: no space left on device; keeping step=2"
        ], r.text[-3000:]
        assert "Traceback" not in r.text
        assert "[dtrain] done steps=6" in r.text
        assert {s for _, s in losses(r.lines)} == set(range(1, 7))
        kept = sorted(p.name for p in disk.iterdir())
        assert kept == ["step_00000002"]
        state = flat_state(disk / "step_00000002", tmp_path)
        assert any(k.startswith("/model/") for k in state)


def test_fsdp2_resumes_at_two_ranks_and_resharded_at_one(tmp_path: Path) -> None:
    """FSDP2 over gloo sums its gradient shards in a fixed order, but a sharded run's losses are
    held to a stated tolerance, 1e-3 on the printed 4-decimal losses, not bit for bit."""
    args = ["--ckpt-every", "3"]
    full = make_bundle(tmp_path / "full", framework="fsdp", steps=6, script_args=args)
    ref = losses(run_ok(full).lines)
    saved = tmp_path / "saved"
    shutil.copytree(full / "checkpoints", saved)
    shutil.rmtree(saved / "step_00000006")

    two = make_bundle(tmp_path / "two", framework="fsdp", steps=6, script_args=args)
    shutil.copytree(saved, two / "checkpoints")
    r = run_ok(two)
    assert RESUMED_RE.search(r.text) is not None and "resumed from step=3" in r.text
    after = losses(r.lines)
    assert {s for _, s in after} == {4, 5, 6}
    for k, v in after.items():
        assert abs(float(v) - float(ref[k])) <= 1e-3, (k, v, ref[k])

    one = make_bundle(tmp_path / "one", framework="fsdp", steps=6, gpus_per_node=1)
    r1 = run_ok(one, {"DTRAIN_CKPT_DIR": str(saved), "DTRAIN_CKPT_EVERY": "3"})
    assert "world_size=1" in r1.text and "resumed from step=3" in r1.text
    after1 = losses(r1.lines)
    assert {s for _, s in after1} == {4, 5, 6}
    # Step 4 starts from the restored weights and sees rank 0's data: rank 0's loss there.
    assert abs(float(after1[(0, 4)]) - float(ref[(0, 4)])) <= 1e-3
    assert (saved / "step_00000006" / "COMPLETE").is_file()


def test_deepspeed_zero2_resumes_through_its_own_load_checkpoint(tmp_path: Path) -> None:
    args = ["--ckpt-every", "2"]
    full = make_bundle(tmp_path / "full", framework="deepspeed", steps=4, script_args=args)
    r = run_ok(full)
    ref = losses(r.lines)
    ds = step_dir(full, 2) / "ds"
    assert (ds / "mp_rank_00_model_states.pt").is_file()
    assert sorted(p.name for p in ds.glob("zero_pp_rank_*_optim_states.pt")) == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]
    again = make_bundle(tmp_path / "again", framework="deepspeed", steps=4, script_args=args)
    shutil.copytree(full / "checkpoints", again / "checkpoints")
    shutil.rmtree(step_dir(again, 4))
    r2 = run_ok(again)
    assert "resumed from step=2" in r2.text, r2.text[-3000:]
    after = losses(r2.lines)
    assert {s for _, s in after} == {3, 4}
    for k, v in after.items():
        assert abs(float(v) - float(ref[k])) <= 1e-3, (k, v, ref[k])

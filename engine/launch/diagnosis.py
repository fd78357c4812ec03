"""Diagnose a running run from its ranks' Flight Recorder dumps.

Called on the supervisor's thread (:class:`engine.launch.supervise.Supervisor`) when a run hangs,
before it is stopped, when a monitor asks (``RUN/diagnose.request``), when a rank printed a
collective timeout, and after a failed run that left NCCL's own dumps. It asks the ranks through
the node driver (:meth:`engine.launch.driver.NodeDriver.ask_dumps`), reads the answers
(:mod:`engine.launch.frdump`) for at most :data:`~engine.launch.frdump.DUMP_WAIT_S`, and
records the :class:`~engine.diagnose.flight.Diagnosis` in run.json (``diagnosis``) and, as one
``[dtrain-tui] diagnosis: ...`` line, in the run's log.
"""

from __future__ import annotations

import time

from engine.diagnose.flight import Diagnosis, RankDump, diagnose
from engine.launch.driver import DumpReach, NodeDriver
from engine.launch.frdump import (
    DUMP_WAIT_S,
    NCCL_TRACE_PREFIX,
    log_sizes,
    nccl_trace_dumps,
    new_dumps,
)
from engine.launch.run_state import RunContext
from engine.rundir.events import STDERR, LineEvent


def _ask(ctx: RunContext, driver: NodeDriver) -> int:
    """Send the dump request wherever the driver reaches; how many ranks were asked."""
    if driver.dump_reach is DumpReach.ALL_NODES:  # one request reaches every node
        try:
            return int(driver.ask_dumps(None))
        except Exception as e:  # noqa: BLE001 - NCCL's files may still tell
            ctx.say(0, f"could not ask the nodes for their dumps: {e}")
            return 0
    asked = 0
    if driver.dump_reach is DumpReach.EACH_NODE:
        for st in ctx.nodes:
            if st.finished:
                continue
            try:
                asked += int(driver.ask_dumps(st.node))
            except Exception as e:  # noqa: BLE001 - one unreachable node must not stop the rest
                ctx.say(st.node, f"could not ask node {st.node} for its dump: {e}")
    return asked


def collect_diagnosis(
    ctx: RunContext, driver: NodeDriver, why: str, *, ask_ranks: bool = True
) -> Diagnosis | None:
    """Ask every rank of the run for its dump, wait for the answers, diagnose, and record it
    (run.json, the log, an event). None when the driver cannot ask and no NCCL dump is at hand.
    ``ask_ranks=False``: NCCL's files only."""
    m = ctx.manifest
    path = ctx.run.path
    offsets = log_sizes(path, m.world_size)
    asked = _ask(ctx, driver) if ask_ranks else 0
    got: dict[int, RankDump] = {}
    deadline = time.monotonic() + DUMP_WAIT_S
    # Every rank answering ends the wait (a rank's forked children inherit its blocked request
    # signal and are signalled too, but never answer).
    want = min(asked, m.world_size)
    while want and len(got) < want and time.monotonic() < deadline:
        if ctx.final.wait(0.1) or ctx.force.is_set():
            break
        new_dumps(path, offsets, got)
    new_dumps(path, offsets, got)
    for rank, d in nccl_trace_dumps(ctx.run.bundle / "logs", m.world_size).items():
        got.setdefault(rank, d)
    if not got and not asked:
        return None
    # The nodes' hosts as known now (a scheduler's allocated names, not its placeholders).
    hosts = [st.host for st in ctx.nodes] or driver.hosts()
    diag = diagnose(
        got,
        m.world_size,
        hosts=list(hosts) if hosts else None,
        gpus_per_node=m.gpus_per_node,
        why=why,
        at=time.time(),
    )
    text = f"[dtrain-tui] diagnosis: {diag.summary}"
    try:
        ctx.run.set_diagnosis(diag.model_dump(mode="json"))
        ctx.run.append(0, None, STDERR, (text + "\n").encode("utf-8", "replace"))
    except OSError as e:
        ctx.dir_failed(e)
    ctx.emit(LineEvent(0, None, STDERR, text, time.time()))
    return diag


def diagnose_safely(
    ctx: RunContext, driver: NodeDriver, why: str, *, ask_ranks: bool = True
) -> Diagnosis | None:
    """:func:`collect_diagnosis` for the supervisor: a failure is one line in the run's log,
    never the end of supervision."""
    try:
        return collect_diagnosis(ctx, driver, why, ask_ranks=ask_ranks)
    except Exception as e:  # noqa: BLE001
        ctx.say(0, f"could not diagnose the run: {type(e).__name__}: {e}")
        return None


def diagnose_failed_run(ctx: RunContext, driver: NodeDriver) -> Diagnosis | None:
    """A failed run that left NCCL dumps (a collective timed out: the watchdog dumped every
    rank's recorder, TORCH_NCCL_DUMP_ON_TIMEOUT) and has no diagnosis yet: diagnose those."""
    if ctx.run.record.diagnosis is not None:
        return None
    logs = ctx.run.bundle / "logs"
    if not any(logs.glob(f"{NCCL_TRACE_PREFIX}*")):
        return None
    return diagnose_safely(ctx, driver, "a collective timed out (NCCL's dumps)", ask_ranks=False)


def timeout_why(seen: tuple[int, int | None, str]) -> str:
    """Why a diagnosis is asked for a rank's collective-timeout line
    (:func:`engine.launch.frdump.find_timeout_line`)."""
    node, rank, line = seen
    who = f"rank {rank}" if rank is not None else f"node {node}"
    text = line if len(line) <= 300 else line[:297] + "..."
    return f"{who} reported a collective timeout: {text}"

"""run.json's typed record: ``backend``/``framework`` are enums, ``launcher``/``diagnosis``/
``transport`` typed parts (engine/rundir/record_parts.py), and the file is byte for byte what the
record wrote when those were strings and dicts (tests/data/run_json/full_record*.json were
written by that code from these same inputs). A reader never fails on a part it cannot read."""

from __future__ import annotations

import json
from pathlib import Path

from engine.diagnose.flight import Collective, Diagnosis, GroupFinding, RankRef
from engine.diagnose.nccl_facts import TransportNotes
from engine.diagnose.transport import TransportExpectation
from engine.plan.names import Backend, Framework, NetworkTier
from engine.rundir.files import RunDir
from engine.rundir.launcher import launcher_gone, launcher_record
from engine.rundir.record import AttemptRecord, RankRecord, RunRecord, RunState, read_record
from engine.rundir.record_parts import (
    DiagnosisRecord,
    LauncherRecord,
    TransportNode,
    TransportRecord,
)

FIXTURES = Path(__file__).parents[1] / "data" / "run_json"


def nccl(host: str, text: str) -> str:
    return f"{host}:4242:4242 [0] NCCL INFO {text}"


def transport() -> TransportRecord:
    """A judgement with every kind of entry: a finding of each severity, a node naming two
    networks, GPUDirect seen, a plugin failure and an interface error on one node only."""
    notes = TransportNotes(
        TransportExpectation(
            tier=NetworkTier.IB,
            nodes=2,
            dist_backend="nccl",
            backend="ssh",
            nccl_env={"NCCL_IB_DISABLE": "0"},
        )
    )
    notes.feed(
        0,
        "gpu-0",
        [
            nccl("gpu-0", "NET/IB : No device found."),
            nccl("gpu-0", "NCCL_IB_DISABLE set by environment to 1"),
            nccl("gpu-0", "NET/Socket : Using [0]eth0:10.0.0.1<0>"),
            nccl("gpu-0", "Using network Socket"),
        ],
    )
    notes.feed(
        1,
        "gpu-1",
        [
            nccl(
                "gpu-1",
                "NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open shared "
                "object file",
            ),
            nccl("gpu-1", "NET/Socket : Using [0]docker0:172.17.0.1<0>"),
            nccl("gpu-1", "Bootstrap : Using lo:127.0.0.1<0>"),
            nccl("gpu-1", "Using network Socket"),
            nccl("gpu-1", "Using network IB"),
            nccl("gpu-1", "Channel 00/0 : 1[1] -> 0[0] [send] via NET/IB/0/GDRDMA"),
            nccl("gpu-1", "misc.cc:1 NCCL WARN no socket interface found"),
        ],
    )
    return notes.report().to_record()


def diagnosis() -> Diagnosis:
    c8 = Collective(
        pg="0",
        pg_desc="default_pg",
        seq=8,
        op="all_reduce",
        input_sizes=[[1024], [2]],
        input_dtypes=["float32", "bf16"],
        state="scheduled",
        created_ns=12,
    )
    return Diagnosis(
        summary="rank 1 (node 0, host gpu-0) never entered all_reduce #8 of default_pg",
        why="hang: no output for 60s",
        at=1700000000.25,
        stuck_ranks=[1],
        no_dump=[RankRef(rank=3, node=1, host="gpu-1")],
        groups=[
            GroupFinding(
                pg="0",
                pg_desc="default_pg",
                behind=[RankRef(rank=1, node=0, host="gpu-0")],
                behind_last={1: 7},
                missed=c8,
                missed_seq=8,
                waiting=[RankRef(rank=0, node=0, host="gpu-0"), RankRef(rank=2, node=1)],
                waiting_in=c8,
            )
        ],
        stacks={1: ["train.py:10 step", "train.py:3 main"], 0: ["dist.py:1 all_reduce"]},
        dumps=3,
        world_size=4,
    )


def full_record() -> RunRecord:
    return RunRecord(
        name="full",
        run_id="rid-123",
        backend=Backend.SSH,
        state=RunState.FAILED,
        started_at="2026-01-01T00:00:00.000+00:00",
        ended_at="2026-01-01T00:05:00.000+00:00",
        nodes=2,
        gpus_per_node=2,
        world_size=4,
        dist_backend="nccl",
        framework=Framework.FSDP,
        hosts=["gpu-0", "gpu-1"],
        ranks=[
            RankRecord(rank=0, node_rank=0, local_rank=0, host="gpu-0", exit_code=0),
            RankRecord(rank=1, node_rank=0, local_rank=1, host="gpu-0", exit_code=1, reason="hang"),
            RankRecord(rank=2, node_rank=1, local_rank=0, host="gpu-1", reason="stopped"),
            RankRecord(rank=3, node_rank=1, local_rank=1, host="gpu-1"),
        ],
        failed_rank=1,
        failed_node=0,
        reason="rank 1 hung",
        launcher=LauncherRecord(pid=4242, start_ticks=987654, boot_id="b00t-1d", host="gpu-0"),
        launcher_died=True,
        diagnosis=diagnosis(),
        transport=transport(),
        attempts=[
            AttemptRecord(
                attempt=1,
                run_dir="attempts/1",
                state=RunState.FAILED,
                started_at="a",
                ended_at="b",
                cause="rank 1 exited 1",
                failed_node=0,
                failed_rank=1,
                hosts=["gpu-0", "gpu-1"],
                last_step=9,
            ),
            AttemptRecord(
                attempt=2,
                run_dir="attempts/2",
                state=RunState.FAILED,
                resumed_from_step=8,
                last_step=12,
                steps_redone=1,
                lost_s=2.5,
                excluded="gpu-2: lost",
            ),
        ],
    )


def test_a_full_record_writes_the_bytes_it_always_wrote() -> None:
    rec = full_record()
    assert rec.to_json() == (FIXTURES / "full_record.json").read_text()
    assert rec.to_json(compact=True) == (FIXTURES / "full_record.compact.json").read_text()


def test_the_full_file_reads_back_typed_and_writes_the_same_bytes() -> None:
    text = (FIXTURES / "full_record.json").read_text()
    back = RunRecord.from_untrusted(json.loads(text))
    assert back.backend is Backend.SSH and back.framework is Framework.FSDP
    assert back.backend == "ssh" and back.framework == "fsdp"
    assert isinstance(back.launcher, LauncherRecord) and back.launcher.pid == 4242
    assert isinstance(back.diagnosis, DiagnosisRecord) and back.diagnosis.stuck_ranks == [1]
    assert back.diagnosis.stacks[1] == ["train.py:10 step", "train.py:3 main"]
    assert isinstance(back.transport, TransportRecord) and back.transport.chosen == ["Socket", "IB"]
    node1 = back.transport.nodes["node 1 (gpu-1)"]
    assert node1.network == ["Socket", "IB"] and node1.gdrdma is True
    assert back.transport.nodes["node 0 (gpu-0)"].network == "Socket"
    assert back == full_record()
    assert back.to_json() == text


def test_json_values_given_by_a_writer_are_taken_as_the_typed_parts(tmp_path: Path) -> None:
    # What a launch backend passes (its name as a string, launcher_record()'s dict) and what
    # the launcher's diagnosis and transport check used to hand the run directory (dicts).
    rec = RunRecord(backend="slurm", framework="megatron", launcher=launcher_record())
    assert rec.backend is Backend.SLURM and rec.framework is Framework.MEGATRON
    assert isinstance(rec.launcher, LauncherRecord) and launcher_gone(rec.launcher) == ""
    run = RunDir(tmp_path)
    run.begin(rec)
    run.set_diagnosis(diagnosis().model_dump(mode="json"))
    run.set_transport(transport().to_dict())
    assert run.record.diagnosis == diagnosis() and run.record.transport == transport()
    assert read_record(tmp_path).diagnosis == diagnosis()


def test_unknown_names_stay_the_strings_they_were() -> None:
    rec = RunRecord.from_untrusted({"backend": "kubernetes", "framework": "jax"})
    assert (rec.backend, rec.framework) == ("kubernetes", "jax")
    assert not isinstance(rec.backend, Backend) and not isinstance(rec.framework, Framework)
    assert json.loads(rec.to_json())["backend"] == "kubernetes"
    empty = RunRecord.from_untrusted({"backend": 3})
    assert (empty.backend, empty.framework) == ("", "")
    assert '"backend": "",' in RunRecord().to_json()


def test_malformed_parts_keep_what_can_be_read() -> None:
    rec = RunRecord.from_untrusted(
        {
            "launcher": {"pid": "4242", "start_ticks": True, "host": 7, "boot_id": "b"},
            "diagnosis": {"why": "hang", "stuck_ranks": "one", "groups": [{"pg": 1}], "at": 5},
            "transport": {
                "verdict": "ok",
                "expected": [1],
                "chosen": ["IB"],
                "nodes": {"n0": {"network": 5}},
                "findings": "none",
            },
        }
    )
    # A pid this machine cannot check is none (no coercion); bool is JSON's own type here.
    assert rec.launcher == LauncherRecord(pid=None, start_ticks=1, host=None, boot_id="b")
    assert rec.diagnosis == DiagnosisRecord(summary="", why="hang", at=5.0)
    assert rec.transport == TransportRecord(verdict="ok", chosen=["IB"])
    for junk in ([1], "x", 3, None):
        part = RunRecord.from_untrusted({"launcher": junk, "diagnosis": junk, "transport": junk})
        assert (part.launcher, part.diagnosis, part.transport) == (None, None, None)
    # An empty object is a record with nothing known, as the dict was.
    part = RunRecord.from_untrusted({"launcher": {}, "diagnosis": {}, "transport": {}})
    assert part.launcher == LauncherRecord() and launcher_gone(part.launcher) == ""
    assert part.diagnosis == DiagnosisRecord(summary="")
    assert part.transport == TransportRecord()


def test_a_node_entry_omits_empty_failure_lists_as_the_check_wrote_it() -> None:
    rec = TransportRecord(nodes={"n": TransportNode(network="IB")})
    assert set(rec.to_dict()["nodes"]["n"]) == {
        "network",
        "ib_no_device",
        "ib_devices",
        "socket_ifaces",
        "bootstrap_ifaces",
        "gdrdma",
        "plugins",
        "env",
    }

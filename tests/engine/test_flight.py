"""engine.diagnose.flight on Flight Recorder dumps recorded for real (tests/data/fr/, made by
tests/data/fr/record.py with torch's CPU build over gloo): the dump lines the example trainer
prints, the whole buffers it writes (JSON: numbers as strings), and pickled buffers (numbers
as ints) of a run with a subgroup; plus the nccl.env lines that turn the recorder on."""

from __future__ import annotations

import pickle
from pathlib import Path

from engine.diagnose.flight import (
    NO_DUMP,
    RankDump,
    collect_lines,
    diagnose,
    dump_from_trace,
    parse_fr_line,
    read_trace_file,
)
from engine.write.nccl_env import nccl_env_entries
from tests.engine.writers_fixtures import golden_plans

FR = Path(__file__).resolve().parents[1] / "data" / "fr"
SKIP_SUMMARY = (
    "rank 1 (node 0, host localhost) never entered all_reduce #8 (pg default, [1024] float32); "
    "rank 0 waiting in it (rank 1 at skip_collective, train.py:"
)


def _lines() -> dict[int, RankDump]:
    return collect_lines((FR / "skip_rank1.lines").read_text().splitlines())


def _files(name: str, ranks: range) -> dict[int, RankDump]:
    out = {}
    for r in ranks:
        data = read_trace_file(next(FR.glob(f"{name}_rank{r}.*")))
        assert data is not None
        out[r] = dump_from_trace(data, r)
    return out


def test_the_trainers_dump_lines_name_the_rank_that_skipped_the_all_reduce() -> None:
    dumps = _lines()
    assert sorted(dumps) == [0, 1]
    assert dumps[0].last("0") == 8 and dumps[1].last("0") == 7
    d = diagnose(dumps, 2, hosts=["localhost"], gpus_per_node=2, why="hang")
    assert d.summary.startswith(SKIP_SUMMARY), d.summary
    assert d.stuck_ranks == [1] and d.no_dump == [] and d.dumps == 2
    (g,) = d.groups
    assert g.missed is not None and g.missed.op == "all_reduce" and g.missed.seq == 8
    assert g.missed.input_sizes == [[1024]] and g.missed.input_dtypes == ["float32"]
    assert [w.rank for w in g.waiting] == [0] and g.behind_last == {1: 7}
    assert d.stacks[1][0].endswith("skip_collective")


def test_whole_json_buffers_give_the_same_answer_with_string_counters() -> None:
    dumps = _files("skip_rank1", range(2))
    assert dumps[0].groups["0"].enqueued == 8  # "8" in the file
    d = diagnose(dumps, 2, gpus_per_node=2)
    assert d.summary == (
        "rank 1 (node 0) never entered all_reduce #8 (pg default, [1024] float32); "
        "rank 0 waiting in it"
    )


def test_pickled_buffers_and_a_subgroup_name_the_group_and_its_member() -> None:
    dumps = _files("subgroup", range(3))
    assert dumps[1].groups["1"].enqueued == 2  # an int in the pickle
    d = diagnose(dumps, 3, hosts=["nodeA", "nodeB", "nodeC"], gpus_per_node=1)
    # Rank 0 is no member of group "tp" (ranks 1 and 2) and is never blamed for it.
    assert d.summary == (
        "rank 2 (node 2, host nodeC) never entered broadcast #2 (pg 1 (tp), [16] int64); "
        "rank 1 waiting in it"
    )
    assert d.stuck_ranks == [2]


def test_a_rank_without_a_dump_is_named_as_such() -> None:
    dumps = _lines()
    del dumps[1]
    d = diagnose(dumps, 2, hosts=["n0"], gpus_per_node=2)
    assert d.summary == f"rank 1 (node 0, host n0): {NO_DUMP}"
    assert [r.rank for r in d.no_dump] == [1] and d.stuck_ranks == []
    assert diagnose({}, 2).summary.startswith(f"ranks 0 (node 0), 1 (node 1): {NO_DUMP}")


def test_ranks_level_with_each_other_are_not_blamed() -> None:
    r0 = _lines()[0]
    twin = r0.model_copy(update={"rank": 1, "stack": ["train.py:9 load_batch"]})
    d = diagnose({0: r0, 1: twin}, 2, gpus_per_node=2)
    assert d.stuck_ranks == []
    assert d.summary.startswith("no rank is behind: all 2 entered the same collectives (last: ")
    assert "rank 1 at load_batch, train.py:9" in d.summary
    empty = RankDump(rank=0, stack=["train.py:5 main"])
    assert diagnose({0: empty}, 1).summary == (
        "no rank has entered a collective yet (still starting?); rank 0 at main, train.py:5"
    )


def test_lines_that_are_not_dumps_are_ignored() -> None:
    good = (FR / "skip_rank1.lines").read_text().splitlines()[0]
    assert parse_fr_line(good) is not None
    assert parse_fr_line("[default0]:" + good) is not None  # a torchrun prefix left on
    for bad in (
        "",
        "[dtrain] step=1/4 loss=1",
        "[dtrain] fr {not json",
        '[dtrain] fr ["x"]',
        '[dtrain] fr {"rank": "x"}',
        good[:200],
    ):
        assert parse_fr_line(bad) is None, bad
    odd = '[dtrain] fr {"rank":3,"pg_status":{"0":{"last_enqueued_collective":"x"}},"entries":[7]}'
    d = parse_fr_line(odd)
    assert d is not None and d.rank == 3 and d.last("0") == -1 and d.entries == []


def test_a_dump_file_that_would_run_code_is_refused(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("pwned",))

    bad = tmp_path / "nccl_trace_rank_0"
    bad.write_bytes(pickle.dumps({"entries": [Evil()]}))
    assert read_trace_file(bad) is None
    (tmp_path / "junk").write_bytes(b"\x00\x01garbage")
    assert read_trace_file(tmp_path / "junk") is None
    assert read_trace_file(tmp_path / "missing") is None


def test_nccl_env_turns_the_flight_recorder_on_for_gloo_and_nccl() -> None:
    plans = golden_plans()
    cpu = {k: v for k, v, _ in nccl_env_entries(plans["cpu_demo"])}
    assert cpu["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in cpu
    gpu = {k: v for k, v, _ in nccl_env_entries(plans["llama7b_8xa100_zero2"])}
    assert gpu["TORCH_FR_BUFFER_SIZE"] == "2000" and gpu["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert gpu["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "logs/nccl_trace_rank_"

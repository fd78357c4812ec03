"""Step lines of the frameworks people train with (tests/data/framework_logs/, each file naming
its source) parsed into the right values: engine.monitor.logparse.parse_steps / StepTracker."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.monitor.logparse import (
    GIB_IN_GB,
    LineKind,
    StepInfo,
    StepSource,
    StepTracker,
    parse_line,
    parse_steps,
    scan_batch,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "framework_logs"


def lines(name: str) -> list[str]:
    return [x for x in (DATA / name).read_text().splitlines() if x and not x.startswith("#")]


def parsed(name: str) -> list[StepInfo]:
    """Every record of a sample file, made whole by one rank's tracker."""
    tracker = StepTracker()
    out = []
    for line in lines(name):
        for info in parse_steps(line):
            done = tracker.resolve(info)
            if done is not None:
                out.append(done)
    return out


def test_hugging_face_trainer() -> None:
    raw = [parse_steps(x) for x in lines("hf_trainer.txt")]
    assert all(len(r) == 1 for r in raw)
    first, _, strings, ev, final, bar, bar2, empty, slow = (r[0] for r in raw)
    assert (first.step, first.loss, first.lr) == (None, 2.075, 0.0002329900014453396)
    assert (strings.loss, strings.lr) == (1.832, 4.95e-05)  # recent releases print '.4g' strings
    assert ev.val_loss == 2.4411 and ev.loss is None
    assert final.samples_per_s == 37.64 and final.step_time_s is None
    assert (bar.step, bar.total, bar.source) == (50, 1000, StepSource.TQDM)
    assert bar.step_time_s == pytest.approx(1 / 4.98)
    assert bar2.step == 100 and empty.step == 0 and empty.step_time_s is None
    assert slow.step_time_s == 1.0  # "1.00s/it"
    # Log dicts name no step: counted while no bar was seen, the bar's step after.
    tracker = StepTracker()
    assert tracker.resolve(first) == StepInfo(1, loss=2.075, lr=first.lr, source=first.source)
    assert tracker.resolve(strings).step == 2  # type: ignore[union-attr]
    assert tracker.resolve(bar).step == 50  # type: ignore[union-attr]
    assert tracker.resolve(strings).step == 50  # type: ignore[union-attr]
    eval_bar = parse_steps(" 40%|████      | 2/5 [00:00<00:00, 9.50it/s]")[0]
    assert tracker.resolve(eval_bar) is None  # another total than the training bar's


def test_tqdm_line_holds_every_update() -> None:
    line = "".join("\r" + x for x in lines("hf_trainer.txt")[5:7])
    assert [s.step for s in parse_steps(line)] == [50, 100]


def test_accelerate_loops() -> None:
    bar1, bar2, ev = parsed("accelerate.txt")
    assert (bar1.step, bar1.total, bar1.step_time_s) == (250, 1000, 0.25)
    assert bar2.step == 500 and bar2.step_time_s == pytest.approx(1 / 3.99)
    assert ev.step == 500 and ev.val_loss == 3.0609  # the epoch's eval line, at the bar's step
    with_loss = parse_steps(" 30%|███       | 3/10 [00:01<00:02,  3.10it/s, loss=2.41]")[0]
    assert (with_loss.step, with_loss.loss) == (3, 2.41)  # progress_bar.set_postfix(loss=...)


def test_lightning() -> None:
    a, b, c = parsed("lightning.txt")  # the validation bar is no training step
    assert (a.step, a.loss, a.source) == (45, 2.31, StepSource.LIGHTNING)
    assert a.step_time_s == pytest.approx(1 / 4.5)
    assert (b.step, b.loss, b.lr) == (100 + 20, 1.95, 0.0003)  # epoch 1: after 100 batches
    assert (c.step, c.loss) == (300, 1.23)


def test_torchtitan_with_its_colours() -> None:
    a, b, c = parsed("torchtitan.txt")  # "validate step:" is not a training step
    assert (a.step, a.loss, a.tokens_per_s) == (1, 12.2254, 6784.0)
    assert a.mem_gb == pytest.approx(21.31 * GIB_IN_GB) and a.step_time_s is None
    assert (b.step, b.loss, b.tokens_per_s) == (10, 7.9836, 7012.0)
    assert b.step_time_s == pytest.approx(10.5 / 9)  # from the logger's timestamps
    assert (c.step, c.loss) == (20, 6.5123) and c.step_time_s == pytest.approx(1.05)


def test_megatron() -> None:
    a, b, c, d = parsed("megatron.txt")
    assert (a.step, a.total, a.loss, a.step_time_s) == (10, 1000, None, 1.1476)
    assert (b.step, b.loss, b.lr) == (20, 10.72453, 4e-05)
    assert b.samples_per_s == pytest.approx(16 / 0.8207)  # global batch over the step time
    assert (c.step, c.total, c.loss, c.step_time_s) == (100, 500000, 10.5, 1.2345)
    assert (d.step, d.loss, d.samples_per_s, d.tokens_per_s) == (199, 5.905366, 53.753, 1146.733)


def test_deepspeed() -> None:
    prog, timer, prog2, prog3, breakdown, pipe = parsed("deepspeed.txt")
    assert (prog.step, prog.lr, prog.source) == (10, 0.0003333333333333334, StepSource.DEEPSPEED)
    assert (timer.step, timer.samples_per_s) == (10, 111.33670009091573)
    assert timer.mem_gb == pytest.approx(6.12 * GIB_IN_GB)  # its "GB" is GiB
    assert prog2.step == 20 and prog2.step_time_s == pytest.approx((51.108 - 49.647) / 10)
    assert prog3.step == 3 and prog3.lr == 1.5099467743762034e-07
    assert breakdown.step == 3 and breakdown.step_time_s == pytest.approx(
        (3865.91 + 11249.43 + 888.45) / 1000
    )
    assert (pipe.step, pipe.loss, pipe.step_time_s, pipe.samples_per_s) == (
        100, 2.3456, 0.512, 62.5,
    )  # fmt: skip


def test_nanogpt() -> None:
    first, it, ev, it2 = parsed("nanogpt.txt")
    assert (first.step, first.loss) == (0, 10.987) and first.step_time_s == pytest.approx(31.25634)
    assert (it.step, it.loss) == (10, 2.3456) and it.step_time_s == pytest.approx(0.12345)
    assert (ev.step, ev.val_loss, ev.loss) == (250, 2.078, None)
    assert (it2.step, it2.loss) == (250, 1.9922)


def test_batch_and_line_kinds() -> None:
    batch = lines("torchtitan.txt") + lines("nanogpt.txt") + ["plain chatter"]
    assert [s.source for s in scan_batch(batch).steps] == [StepSource.TORCHTITAN] * 3 + [
        StepSource.NANOGPT
    ] * 4
    assert parse_line("[rank0]:" + lines("megatron.txt")[1]).kind is LineKind.STEP
    assert parse_line(lines("lightning.txt")[0]).step.step == 45  # type: ignore[union-attr]
    assert parse_line("Validation DataLoader 0:  50%|█| 5/10 [00:00<00:00, 20it/s]").step is None


@pytest.mark.parametrize(
    "line",
    [
        "iter 10: loss 2.3.4, time 1ms",
        "step: 1  loss: nope  memory: 1GiB  tps: 1",
        "{'loss': 'high', 'epoch': 1}",
        " iteration 5/10 | elapsed time per iteration (ms): ",
        "[Rank 0] step=3, skipped=0, lr=[",
        "the loss went down, 3 it/s",
    ],
)
def test_garbled_lines_are_no_steps(line: str) -> None:
    assert parse_steps(line) == []


FRAGMENTS = [x for name in sorted(DATA.glob("*.txt")) for x in lines(name.name)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(FRAGMENTS), st.integers(0, 400), st.integers(0, 400)),
        max_size=4,
    ),
    st.text(max_size=30),
)
def test_cut_and_spliced_framework_lines_never_raise(
    cuts: list[tuple[str, int, int]], tail: str
) -> None:
    text = "".join(line[a:b] for line, a, b in cuts) + tail
    tracker = StepTracker()
    for info in parse_steps(text) + scan_batch([text, tail]).steps:
        tracker.resolve(info)
    parse_line(text)

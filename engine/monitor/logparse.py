"""Make sense of the lines distributed training prints: strip ANSI colour codes, split the prefixes
launchers add (torchrun, pdsh, SkyPilot, OpenMPI, Ray, TorchX; nested, outermost first), classify
NCCL and torch.distributed lines, spot errors and parse the example trainer's step lines.

Called by the monitor's reader thread (:func:`scan_batch` and :class:`NcclSummary`, per batch),
by the rank state (:mod:`engine.monitor.state`) and by whatever marks error lines (the monitor's
panes, ``monitor --follow --errors-only``: :func:`classify_error`). Pure and total: any string in, a
value out; a cut, spliced or hard-wrapped line never raises, it is attributed as far as its
prefixes allow and the rest is left as plain text.

Two speeds: :func:`parse_line` gives everything about one line of a foreign log (what
:func:`summarize_nccl` reads); :func:`scan_batch` gates on substring tests over the joined batch
first, so a firehose of INFO lines costs well under a microsecond per line.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from engine.diagnose.nccl_facts import CHANNEL_VIA_RE as _CHANNEL_VIA_RE
from engine.diagnose.nccl_facts import INDEX_SEGMENT_RE as _INDEX_SEGMENT_RE
from engine.diagnose.nccl_facts import NETWORK_RE as _NETWORK_RE


class LineKind(StrEnum):
    """What a line is, for routing (NCCL pane) and highlighting."""

    PLAIN = "plain"
    NCCL_INFO = "nccl_info"
    NCCL_WARN = "nccl_warn"
    TORCH_DIST = "torch_dist"
    """torch's ProcessGroupNCCL / c10d / elastic messages."""
    STEP = "step"
    DONE = "done"
    ERROR = "error"


class ErrorKind(StrEnum):
    """The errors people search a distributed log for."""

    TRACEBACK = "traceback"
    CUDA_OOM = "cuda_oom"
    NCCL_WARN = "nccl_warn"
    NCCL_ERROR = "nccl_error"
    WATCHDOG_TIMEOUT = "watchdog_timeout"
    COMM_ABORTED = "comm_aborted"
    RENDEZVOUS = "rendezvous"
    CHILD_FAILED = "child_failed"
    EXCEPTION = "exception"
    DIAGNOSIS = "diagnosis"
    """dtrain-tui's own ``[dtrain-tui] diagnosis: …`` line: the stuck rank named."""


class StepSource(StrEnum):
    """The format a step line is in (what printed it)."""

    DTRAIN = "dtrain"
    """The example trainer's ``[dtrain] step=…`` line."""
    HF_TRAINER = "hf_trainer"
    """A Hugging Face Trainer log dict (``{'loss': …, 'learning_rate': …, 'epoch': …}``)."""
    TQDM = "tqdm"
    """A bare tqdm bar (the Trainer's, Accelerate example loops'): ``50/1000 […, 4.98it/s]``."""
    LIGHTNING = "lightning"
    """PyTorch Lightning's train bar: ``Epoch 0:  45%|…| 45/100 […, 4.50it/s, train_loss=…]``."""
    TORCHTITAN = "torchtitan"
    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"
    NANOGPT = "nanogpt"


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One step line, of the example trainer (``[dtrain] step=<n>/<total> loss=… tokens_per_s=…
    step_time_s=… mem_gb=…``) or of a framework (:class:`StepSource`). A field the line does not
    give is None; throughput is in the unit the line gives (tokens/s or samples/s), never
    converted with a guessed batch or sequence size."""

    step: int | None
    """None when the line names no step (a Trainer log dict, DeepSpeed's timer breakdown): it
    belongs to the rank's current step (:class:`StepTracker`)."""
    total: int | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    step_time_s: float | None = None
    mem_gb: float | None = None
    """Peak memory in GB (10^9 bytes; a GiB figure is converted)."""
    source: StepSource = StepSource.DTRAIN
    lr: float | None = None
    samples_per_s: float | None = None
    val_loss: float | None = None
    ts: float | None = None
    """The line's own timestamp (seconds, its clock): step time from two lines' stamps when
    the line gives none (torchtitan, DeepSpeed)."""


@dataclass(frozen=True, slots=True)
class ParsedLine:
    """A raw line taken apart. ``rank`` is a global rank only when a prefix says so (OpenMPI,
    ``[rankN]:``, or torchrun's local rank with a known node); ``node`` is a node rank."""

    text: str
    rank: int | None = None
    local_rank: int | None = None
    node: int | None = None
    host: str = ""
    stream: str | None = None
    pid: int | None = None
    prefixes: tuple[str, ...] = ()
    """Names of the prefixes removed, outermost first (``openmpi``, ``torchrun``, ``pdsh``…)."""
    repeated: int = 1
    """Ray's ``[repeated Nx across cluster]`` count (the suffix is removed from ``text``)."""
    kind: LineKind = LineKind.PLAIN
    error: ErrorKind | None = None
    step: StepInfo | None = None
    nccl_host: str = ""
    """Host named by NCCL's own ``host:pid:tid [dev] NCCL INFO`` header, if any."""


# ANSI CSI / OSC sequences and lone escapes (a cut line can end inside one).
_ANSI_RE = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]?|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")

_OPENMPI_RE = re.compile(r"\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>:")
_TORCHRUN_RANK_RE = re.compile(r"\[rank(\d+)\]:")
_TORCHRUN_ROLE_RE = re.compile(r"\[([A-Za-z_][A-Za-z_-]*?)(\d+)\]:")
_TORCHRUN_HOST_RE = re.compile(r"\[([A-Za-z0-9][\w.-]*):(\d+)\]:")
_SKY_RE = re.compile(r"\((head|worker(\d+)), rank=(\d+), pid=(\d+)(?:, ip=([0-9a-fA-F.:]+))?\) ?")
_RAY_RE = re.compile(r"\(([A-Za-z_][\w.]*) pid=(\d+)(?:, ip=([0-9a-fA-F.:]+))?\) ?")
_TORCHX_RE = re.compile(r"([A-Za-z_][\w-]*)/(\d+) \[(\d+)\]:")
# pdsh: `host: ` where host is an IP or a lower-case host name with a digit or a dash; a word
# like `Warning: ` or `torch.distributed…Error: ` is not a host.
_PDSH_RE = re.compile(r"((?:\d{1,3}\.){3}\d{1,3}|[a-z0-9][a-z0-9-]*(?:\.[a-z0-9-]+)*): ")
_RAY_REPEAT_RE = re.compile(r"\s*\[repeated (\d+)x across cluster\]\s*$")
_NCCL_HEADER_RE = re.compile(r"([\w.-]+):(\d+):(\d+) \[(\d+)\] NCCL (?:INFO|WARN|TRACE)")

_STEP_RE = re.compile(
    r"\[dtrain\] step=(\d+)/(\d+) loss=(\S+) tokens_per_s=(\S+) step_time_s=(\S+) mem_gb=(\S+)"
)
_DONE_RE = re.compile(r"\[dtrain\] done steps=(\d+) time_s=(\S+)")

_TORCH_DIST_MARKERS = ("ProcessGroupNCCL", "c10d", "torch.distributed", "TCPStore", "[W socket")

# Ordered: the first matching pattern names the error (OOM before a generic exception line).
_ERROR_PATTERNS: tuple[tuple[ErrorKind, re.Pattern[str]], ...] = (
    (
        ErrorKind.CUDA_OOM,
        re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"),
    ),
    (ErrorKind.WATCHDOG_TIMEOUT, re.compile(r"Watchdog caught collective operation timeout")),
    (ErrorKind.COMM_ABORTED, re.compile(r"NCCL communicator was aborted")),
    (ErrorKind.NCCL_WARN, re.compile(r"NCCL WARN")),
    (
        ErrorKind.NCCL_ERROR,
        re.compile(
            r"unhandled (?:system|cuda) error|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|ncclRemoteError|NCCL error"
        ),
    ),
    (
        ErrorKind.RENDEZVOUS,
        re.compile(
            r"Rendezvous\w*Error|RendezvousClosedError|client socket has timed out|"
            r"[Ff]ailed to (?:connect|initialize) (?:to )?(?:the )?(?:rendezvous|store|TCPStore)|"
            r"DistNetworkError|DistStoreError"
        ),
    ),
    (ErrorKind.CHILD_FAILED, re.compile(r"ChildFailedError")),
    (ErrorKind.TRACEBACK, re.compile(r"^\s*Traceback \(most recent call last\)")),
    (ErrorKind.EXCEPTION, re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception): ")),
    # The interpreter refusing the script itself (a wrong --script): the rank's only line.
    (ErrorKind.EXCEPTION, re.compile(r"can't open file .*\[Errno \d+\]")),
    # The launcher's stuck-rank diagnosis (engine.launch.frdump): an error of the run's.
    (ErrorKind.DIAGNOSIS, re.compile(r"^\[dtrain-tui\] diagnosis: ")),
)
# Substrings at least one of which every error line holds: the cheap gate over a whole batch.
_ERROR_GATE = (
    "[dtrain-tui] diagnosis: ",
    "Error",
    "error",
    "Traceback",
    "WARN",
    "out of memory",
    "Watchdog",
    "aborted",
    "timed out",
    "Exception",
    "can't open file",
)


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (a no-op, and fast, when there are none)."""
    if "\x1b" not in text:
        return text
    return _ANSI_RE.sub("", text)


def _dtrain_step(m: re.Match[str]) -> StepInfo:
    return StepInfo(int(m[1]), int(m[2]), float(m[3]), float(m[4]), float(m[5]), float(m[6]))


def parse_step(text: str) -> StepInfo | None:
    """The last step line of any known format in ``text`` (a tqdm line holds many bars), or
    None (also for a cut or garbled one)."""
    found = parse_steps(text)
    return found[-1] if found else None


# ---- the frameworks' step lines ------------------------------------------------------------
# Each format: a substring every one of its lines holds (tested first, per line) and a parser.
# Formats and their sources: tests/data/framework_logs/.

_F = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"
"""A number as Python prints one (``float()`` reads it)."""
GIB_IN_GB = 1024**3 / 1e9
_STAMP_RE = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[,.](\d{1,6}))?")

# tqdm's default bar: `{desc}: {pct}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}{postfix}]`
_BAR_RE = re.compile(
    r"(?P<desc>[^\r|]*?) *\d+%\|[^|\r]*\| *(?P<n>\d+)/(?P<total>\d+) \[[^\]\r,]*, *"
    r"(?:\?|(?P<rate>[\d.]+))(?P<unit>it/s|s/it)(?P<post>[^\]\r]*)\]"
)
_LIGHTNING_DESC_RE = re.compile(r"Epoch (\d+):?$")
_POSTFIX_RE = re.compile(r"([\w/.-]+)=([^,\]]+)")
_HF_DICT_RE = re.compile(r"\{'(loss|eval_loss|train_runtime)': ")
_HF_KV_RE = re.compile(r"'(\w+)': '?([^,'}]+)'?")
_TITAN_RE = re.compile(
    r"(?<!validate )step: *(\d+) +loss: *" + _F + r" .*?memory: *([\d.]+)GiB.*?tps: *([\d,]+)"
)
_MEGATRON_RE = re.compile(
    r"iteration +(\d+)/ *(\d+) \|.*?elapsed time per iteration \(ms\): ([\d.]+)"
)
_MEGATRON_LOSS_RE = re.compile(r"\| (?:lm loss|([\w -]*?loss)): " + _F + " ")
_MEGATRON_LR_RE = re.compile(r"learning rate: " + _F)
_MEGATRON_GBS_RE = re.compile(r"global batch size: +(\d+)")
_MEGATRON_SPS_RE = re.compile(r"samples per second: " + _F)
_MEGATRON_TGS_RE = re.compile(r"tokens per gpu per second \(tgs\): " + _F)
_DS_PROGRESS_RE = re.compile(r"\bstep=(\d+), skipped=\d+, lr=\[?" + _F)
_DS_TIMER_RE = re.compile(
    r"global_step=(\d+), RunningAvgSamplesPerSec=[^,]*, CurrSamplesPerSec="
    + _F
    + r", MemAllocated=[\d.]+GB, MaxMemAllocated=([\d.]+)GB"
)
_DS_PIPE_RE = re.compile(
    r"\bsteps?: *(\d+)(?: */ *(\d+))? loss: "
    + _F
    + r" iter time \(s\): "
    + _F
    + r" (?:total )?samples/sec: "
    + _F
)
_DS_BREAKDOWN_RE = re.compile(
    r"time \(ms\) \| fwd: ([\d.]+) \| bwd: ([\d.]+) \|.*?\| step: ([\d.]+)"
)
_NANO_ITER_RE = re.compile(r"\biter (\d+): loss " + _F + r", time ([\d.]+)ms")
_NANO_EVAL_RE = re.compile(r"\bstep (\d+): train loss " + _F + r", val loss " + _F)
_ACCEL_EVAL_RE = re.compile(r"\bepoch (\d+): perplexity: \S+ eval_loss: " + _F)


def _stamp(text: str) -> float | None:
    """A ``2025-01-20 10:00:01,000`` timestamp in ``text`` as seconds (its own clock)."""
    m = _STAMP_RE.search(text)
    if m is None:
        return None
    y, mo, d, h, mi, sec = (int(m[i]) for i in range(1, 7))
    frac = float("0." + m[7]) if m[7] else 0.0
    try:
        return calendar.timegm((y, mo, d, h, mi, sec, 0, 0, 0)) + frac
    except (ValueError, OverflowError):
        return None


def _postfix(post: str) -> tuple[float | None, float | None]:
    """The training loss and learning rate a bar's ``k=v`` postfix shows, if any."""
    loss = lr = None
    for k, v in _POSTFIX_RE.findall(post):
        key = k.lower()
        try:
            if loss is None and "loss" in key and not key.startswith(("val", "test", "eval")):
                loss = float(v)
            elif lr is None and (key == "lr" or key.startswith("lr-")):
                lr = float(v)
        except ValueError:
            continue
    return loss, lr


def _bars(text: str) -> list[StepInfo]:
    """tqdm bars: the Trainer's and Accelerate loops' bare ones (``set_postfix(loss=…)``
    read), Lightning's ``Epoch N`` one (its step: the epoch's batches before it plus n)."""
    out: list[StepInfo] = []
    for m in _BAR_RE.finditer(text):
        desc = m["desc"].strip()
        rate = float(m["rate"]) if m["rate"] else None
        step_time = None if not rate else (1.0 / rate if m["unit"] == "it/s" else rate)
        n, total = int(m["n"]), int(m["total"])
        e = _LIGHTNING_DESC_RE.search(desc) if desc else None
        if desc and e is None:  # a validation / test / other bar
            continue
        loss, lr = _postfix(m["post"]) if m["post"] else (None, None)
        if e is None:
            info = StepInfo(
                n, total, loss=loss, step_time_s=step_time, lr=lr, source=StepSource.TQDM
            )
        else:
            step = int(e[1]) * total + n
            info = StepInfo(
                step, loss=loss, step_time_s=step_time, lr=lr, source=StepSource.LIGHTNING
            )
        out.append(info)
    return out


def _hf_dict(text: str) -> list[StepInfo]:
    """A Trainer log dict: a logging step's, an evaluation's or the final summary."""
    m = _HF_DICT_RE.search(text)
    if m is None:
        return []
    kv: dict[str, float] = {}
    for k, v in _HF_KV_RE.findall(text[m.start() :]):
        try:
            kv[k] = float(v)
        except ValueError:
            continue
    src = StepSource.HF_TRAINER
    if m[1] == "loss" and "loss" in kv:
        return [StepInfo(None, loss=kv["loss"], lr=kv.get("learning_rate"), source=src)]
    if m[1] == "eval_loss" and "eval_loss" in kv:
        return [StepInfo(None, val_loss=kv["eval_loss"], source=src)]
    if m[1] == "train_runtime" and "train_samples_per_second" in kv:
        return [StepInfo(None, samples_per_s=kv["train_samples_per_second"], source=src)]
    return []


def _torchtitan(text: str) -> list[StepInfo]:
    m = _TITAN_RE.search(text)
    if m is None:
        return []
    return [
        StepInfo(
            int(m[1]),
            loss=float(m[2]),
            mem_gb=float(m[3]) * GIB_IN_GB,
            tokens_per_s=float(m[4].replace(",", "")),
            source=StepSource.TORCHTITAN,
            ts=_stamp(text[: m.start()]),
        )
    ]


def _megatron(text: str) -> list[StepInfo]:
    m = _MEGATRON_RE.search(text)
    if m is None:
        return []
    step_time = float(m[3]) / 1000.0
    loss = _MEGATRON_LOSS_RE.search(text)
    lr = _MEGATRON_LR_RE.search(text)
    sps = _MEGATRON_SPS_RE.search(text)
    tgs = _MEGATRON_TGS_RE.search(text)
    gbs = _MEGATRON_GBS_RE.search(text)
    samples = float(sps[1]) if sps else None
    if samples is None and gbs is not None and step_time > 0:
        samples = int(gbs[1]) / step_time  # the global batch over the step: what Megatron logs
    return [
        StepInfo(
            int(m[1]),
            int(m[2]),
            loss=float(loss[2]) if loss else None,
            tokens_per_s=float(tgs[1]) if tgs else None,
            step_time_s=step_time,
            lr=float(lr[1]) if lr else None,
            samples_per_s=samples,
            source=StepSource.MEGATRON,
        )
    ]


def _deepspeed(text: str) -> list[StepInfo]:
    src = StepSource.DEEPSPEED
    m = _DS_PROGRESS_RE.search(text)
    if m is not None:
        return [StepInfo(int(m[1]), lr=float(m[2]), source=src, ts=_stamp(text[: m.start()]))]
    m = _DS_TIMER_RE.search(text)
    if m is not None:
        return [
            StepInfo(
                int(m[1]),
                samples_per_s=float(m[2]),
                mem_gb=float(m[3]) * GIB_IN_GB,  # DeepSpeed's "GB" is memory / 1024**3
                source=src,
                ts=_stamp(text[: m.start()]),
            )
        ]
    m = _DS_PIPE_RE.search(text)
    if m is not None:
        return [
            StepInfo(
                int(m[1]),
                int(m[2]) if m[2] else None,
                loss=float(m[3]),
                step_time_s=float(m[4]),
                samples_per_s=float(m[5]),
                source=src,
            )
        ]
    m = _DS_BREAKDOWN_RE.search(text)
    if m is not None:  # wall_clock_breakdown: forward + backward + optimizer step, of the last step
        t = (float(m[1]) + float(m[2]) + float(m[3])) / 1000.0
        return [StepInfo(None, step_time_s=t, source=src)]
    return []


def _nanogpt(text: str) -> list[StepInfo]:
    m = _NANO_ITER_RE.search(text)
    if m is not None:
        t = float(m[3]) / 1000.0
        return [StepInfo(int(m[1]), loss=float(m[2]), step_time_s=t, source=StepSource.NANOGPT)]
    m = _NANO_EVAL_RE.search(text)
    if m is not None:
        return [StepInfo(int(m[1]), val_loss=float(m[3]), source=StepSource.NANOGPT)]
    m = _ACCEL_EVAL_RE.search(text)
    if m is not None:  # Accelerate's examples: after each epoch
        return [StepInfo(None, val_loss=float(m[2]), source=StepSource.TQDM)]
    return []


_FORMATS: tuple[tuple[tuple[str, ...], Callable[[str], list[StepInfo]]], ...] = (
    (("%|",), _bars),
    (("{'",), _hf_dict),
    (("tps:",), _torchtitan),
    (("elapsed time per iteration",), _megatron),
    (("skipped=", "SamplesPerSec", "iter time (s)", "| fwd:"), _deepspeed),
    (("iter ", "train loss", "eval_loss:"), _nanogpt),
)
"""(substrings one of which the format's lines hold, parser), tried in order per line."""
STEP_GATE = ("loss", "%|", "step=", "| fwd:", "elapsed time per")
"""At least one of these is in every step line of every format: the batch's cheap gate (few,
as each is a scan of the joined batch; the formats' own substrings are tested per line)."""


def parse_steps(text: str) -> list[StepInfo]:
    """Every step record in one line (ANSI colours and all), in order; [] for any other line,
    and for a cut or garbled one."""
    if "[dtrain] step=" in text:  # the example trainer's: the common case, first
        try:
            return [_dtrain_step(m) for m in _STEP_RE.finditer(text)]
        except ValueError:
            return []
    if "\x1b" in text:
        text = strip_ansi(text)
    for gates, parser in _FORMATS:
        if any(g in text for g in gates):
            try:
                found = parser(text)
            except (ValueError, OverflowError):
                continue
            if found:
                return found
    return []


@dataclass(slots=True)
class StepTracker:
    """One rank's step records made whole, in arrival order: what the rank state and
    ``calibrate`` read. A record naming no step belongs to the rank's current step (a Trainer
    log dict follows its bar; with no bar, log dicts are counted); a step time the line does not
    give comes from its timestamp and the last stamped step's; a bare tqdm bar of another total
    than the first (an evaluation bar) is no training step."""

    step: int | None = None
    bar_total: int | None = None
    """The first bare tqdm bar's total: the training bar's (None before one was seen)."""
    logs: int = 0
    """Trainer log dicts with a loss seen (their step when no bar is)."""
    stamped: tuple[int, float] | None = None
    """(step, timestamp) of the last stamped line of a new step."""

    def resolve(self, info: StepInfo) -> StepInfo | None:
        """``info`` with its step (and step time where it can be had), or None to drop it."""
        if info.source is StepSource.TQDM and info.step is not None:
            if self.bar_total is None:
                self.bar_total = info.total
            elif info.total != self.bar_total:
                return None
        step = info.step
        if step is None:
            if info.source is StepSource.HF_TRAINER and info.loss is not None:
                self.logs += 1
                step = self.step if self.bar_total is not None else self.logs
            else:
                step = self.step
            if step is None:
                return None
        step_time = info.step_time_s
        if info.ts is not None:
            last = self.stamped
            if step_time is None and last is not None and step > last[0] and info.ts >= last[1]:
                step_time = (info.ts - last[1]) / (step - last[0])
            if last is None or step > last[0]:
                self.stamped = (step, info.ts)
        self.step = step
        if step == info.step and step_time == info.step_time_s:
            return info
        return replace(info, step=step, step_time_s=step_time)


def classify_error(text: str) -> ErrorKind | None:
    """Which error ``text`` reports, or None."""
    if not any(g in text for g in _ERROR_GATE):
        return None
    for kind, pattern in _ERROR_PATTERNS:
        if pattern.search(text):
            return kind
    return None


def is_nccl(text: str) -> bool:
    """True for NCCL's own lines and torch's ProcessGroupNCCL / c10d messages: the NCCL pane's."""
    if "NCCL" in text:
        return True
    if "torch.distributed.elastic" in text:
        return False  # torchrun's agent (ChildFailedError, "Sending process ..."): not NCCL's
    return any(m in text for m in _TORCH_DIST_MARKERS)


def classify(text: str) -> tuple[LineKind, ErrorKind | None]:
    """The kind of a prefix-free line, and the error it reports."""
    error = classify_error(text)
    if "[dtrain]" in text and _DONE_RE.search(text):
        return LineKind.DONE, error
    if any(g in text for g in STEP_GATE) and parse_steps(text):
        return LineKind.STEP, error
    if "NCCL WARN" in text:
        return LineKind.NCCL_WARN, error
    if "NCCL INFO" in text or text.lstrip().startswith("NCCL version"):
        return LineKind.NCCL_INFO, error
    if is_nccl(text):
        return LineKind.TORCH_DIST, error
    if error is not None:
        return LineKind.ERROR, error
    return LineKind.PLAIN, None


@dataclass
class _Peeled:
    """What the launcher prefixes peeled off one line said (see :func:`_peel`)."""

    node: int | None
    rank: int | None = None
    local_rank: int | None = None
    host: str = ""
    stream: str | None = None
    pid: int | None = None
    prefixes: list[str] = field(default_factory=list)


def _peel(text: str, p: _Peeled, pdsh: bool) -> int:
    """Match one launcher prefix at the start of ``text`` and record what it says in ``p``;
    the prefix's length, 0 when there is none. Each kind at most once per line except
    torchrun's, which nests ([default0]:[rank0]:)."""
    m = _OPENMPI_RE.match(text)
    if m is not None:
        p.rank = int(m[2])
        p.stream = "stdout" if m[3] != "stderr" else "stderr"
        p.prefixes.append("openmpi")
        return m.end()
    m = _SKY_RE.match(text)
    if m is not None and "skypilot" not in p.prefixes:
        p.node = int(m[3])
        p.pid = int(m[4])
        p.host = m[5] or p.host or m[1]
        p.prefixes.append("skypilot")
        return m.end()
    m = _RAY_RE.match(text)
    if m is not None and "ray" not in p.prefixes:
        p.pid = int(m[2])
        p.host = m[3] or p.host
        p.prefixes.append("ray")
        return m.end()
    return _peel_torch(text, p) or _peel_pdsh(text, p, pdsh)


def _peel_torch(text: str, p: _Peeled) -> int:
    """torchrun's and torchx's prefixes, as :func:`_peel`."""
    m = _TORCHRUN_RANK_RE.match(text)
    if m is not None:
        p.rank = int(m[1])
        p.prefixes.append("torchrun")
        return m.end()
    m = _TORCHRUN_HOST_RE.match(text)
    if m is not None:
        p.host = m[1]
        p.local_rank = int(m[2])
        p.prefixes.append("torchrun")
        return m.end()
    m = _TORCHRUN_ROLE_RE.match(text)
    if m is not None and not m[1].startswith("rank"):
        p.local_rank = int(m[2])
        p.prefixes.append("torchrun")
        return m.end()
    m = _TORCHX_RE.match(text)
    if m is not None and "torchx" not in p.prefixes:
        p.node = int(m[2])
        p.local_rank = int(m[3])
        p.prefixes.append("torchx")
        return m.end()
    return 0


def _peel_pdsh(text: str, p: _Peeled, pdsh: bool) -> int:
    """pdsh's ``host: `` prefix, only as the outermost one, as :func:`_peel`."""
    if pdsh and not p.prefixes:
        m = _PDSH_RE.match(text)
        if m is not None and any(c.isdigit() or c == "-" for c in m[1]):
            p.host = m[1]
            p.prefixes.append("pdsh")
            return m.end()
    return 0


def parse_line(
    raw: str,
    *,
    node: int | None = None,
    gpus_per_node: int | None = None,
    pdsh: bool = True,
) -> ParsedLine:
    """Take ``raw`` apart. ``node`` and ``gpus_per_node``, when the caller knows them (a launch
    backend reading node i's output), turn torchrun's local rank into a global rank."""
    text = strip_ansi(raw).rstrip("\r\n")
    p = _Peeled(node)
    for _ in range(8):  # prefixes, outermost first
        n = _peel(text, p, pdsh)
        if not n:
            break
        text = text[n:]
    node, rank, local_rank, host, pid = p.node, p.rank, p.local_rank, p.host, p.pid
    repeated = 1
    if "repeated" in text:
        m = _RAY_REPEAT_RE.search(text)
        if m is not None:
            repeated = int(m[1])
            text = text[: m.start()]
    if rank is None and local_rank is not None and node is not None and gpus_per_node:
        rank = node * gpus_per_node + local_rank
    nccl_host = ""
    if "NCCL" in text:
        m = _NCCL_HEADER_RE.search(text)
        if m is not None:
            nccl_host = m[1]
            if not host:
                host = m[1]
            if pid is None:
                pid = int(m[2])
    kind, error = classify(text)
    step = parse_step(text) if kind is LineKind.STEP else None
    return ParsedLine(
        text=text,
        rank=rank,
        local_rank=local_rank,
        node=node,
        host=host,
        stream=p.stream,
        pid=pid,
        prefixes=tuple(p.prefixes),
        repeated=repeated,
        kind=kind,
        error=error,
        step=step,
        nccl_host=nccl_host,
    )


# ---- batch helpers: the monitor's hot path -------------------------------------------------


def scan_steps(lines: Sequence[str]) -> list[StepInfo]:
    """The step records of a batch (every format's, :func:`parse_steps`), in order."""
    joined = "\n".join(lines)
    present = [g for g in STEP_GATE if g in joined]
    return _steps_of(lines, present) if present else []


def _steps_of(lines: Sequence[str], present: list[str]) -> list[StepInfo]:
    """:func:`scan_steps` past its gate: only the lines holding one of the ``present`` gates
    are parsed (one or two gates, the usual case, tested without a generator)."""
    if len(present) == 1:
        g = present[0]
        found = [x for x in lines if g in x]
    elif len(present) == 2:
        g, h = present
        found = [x for x in lines if g in x or h in x]
    else:
        found = [x for x in lines if any(g in x for g in present)]
    out: list[StepInfo] = []
    for line in found:
        out.extend(parse_steps(line))
    return out


@dataclass(frozen=True, slots=True)
class BatchFacts:
    """What the monitor needs from a batch of one rank's lines, found in one pass."""

    nccl: list[str]
    """Lines for the NCCL pane, in order."""
    errors: list[tuple[int, ErrorKind]]
    """``(index in the batch, kind)`` of each error line."""
    steps: list[StepInfo]
    done: bool


def scan_batch(lines: Sequence[str]) -> BatchFacts:
    """One pass over a batch: route NCCL lines, find errors, steps and the trainer's done line.

    The hot path of the monitor. NCCL INFO lines (the bulk of a chatty run) are only routed:
    they are never errors, steps or done lines, so the substring gates of the other checks run
    over the joined remaining lines only.
    """
    nccl: list[str] = []
    other: list[str] = []
    other_idx: list[int] = []
    for i, line in enumerate(lines):
        if "NCCL" in line:
            nccl.append(line)
            if "NCCL INFO" in line:
                continue
        other.append(line)
        other_idx.append(i)
    errors: list[tuple[int, ErrorKind]] = []
    steps: list[StepInfo] = []
    done = False
    if other:
        joined = "\n".join(other)
        if any(m in joined for m in _TORCH_DIST_MARKERS):
            seen = set(nccl)
            torch_lines = {j for j, x in enumerate(other) if x not in seen and is_nccl(x)}
            if torch_lines:
                # Keep batch order: rebuild the NCCL list from the original positions.
                keep = {other_idx[j] for j in torch_lines}
                nccl = [x for i, x in enumerate(lines) if "NCCL" in x or i in keep]
        if any(g in joined for g in _ERROR_GATE):
            for j, line in enumerate(other):
                kind = classify_error(line)
                if kind is not None:
                    errors.append((other_idx[j], kind))
        present = [g for g in STEP_GATE if g in joined]
        if present:
            steps = _steps_of(other, present)
        done = "[dtrain] done" in joined
    return BatchFacts(nccl, errors, steps, done)


# ---- NCCL facts from a whole log -----------------------------------------------------------

_NCCL_VERSION_RE = re.compile(r"NCCL version (\d+\.\d+\.\d+)(?:\+(\S+))?")
_INIT_COMPLETE_RE = re.compile(r"comm (0x[0-9a-f]+) rank (\d+) nranks (\d+).*Init COMPLETE")
_SUMMARY_PHRASES = (
    "NCCL WARN",
    "NCCL version",
    "Using network",
    "Init COMPLETE",
    "No device found",
    "bus bandwidth",
    "NCCL INFO Bootstrap",
)
_BUSBW_RE = re.compile(r"Avg bus bandwidth\s*:\s*([\d.]+)")


@dataclass(slots=True)
class NcclSummary:
    """What the NCCL pane's header says about a run: version, transports, init progress."""

    versions: set[str] = field(default_factory=set)
    networks: set[str] = field(default_factory=set)
    """``IB``, ``Socket``, ``AWS Libfabric``… from ``Using network X``."""
    transports: set[str] = field(default_factory=set)
    """Channel transports: ``P2P/IPC/read``, ``NET/IB/0/GDRDMA``…"""
    hosts: set[str] = field(default_factory=set)
    init_complete: int = 0
    init_ranks: set[tuple[str, int]] = field(default_factory=set)
    warnings: int = 0
    ib_no_device: bool = False
    avg_busbw_gbps: float | None = None
    _via_budget: int = 4096
    """Channel lines still looked at in :meth:`feed_batch` (transports are set up at init)."""
    _line_budget: int = 200_000
    """NCCL lines fully looked at by :meth:`feed_batch`; version, network and transports are
    printed at communicator set-up, so a firehose later on costs two substring scans a batch."""

    @property
    def gdrdma(self) -> bool:
        return any("GDRDMA" in t for t in self.transports)

    def feed(self, text: str) -> None:
        """Account for one prefix-free line."""
        if "NCCL" not in text and "bus bandwidth" not in text:
            return
        if "NCCL WARN" in text:
            self.warnings += 1
        m = _NCCL_HEADER_RE.search(text)
        if m is not None:
            self.hosts.add(m[1])
        if "NCCL version" in text:
            m = _NCCL_VERSION_RE.search(text)
            if m is not None:
                self.versions.add(m[1])
        if "Using network" in text:
            m = _NETWORK_RE.search(text)
            if m is not None:
                self.networks.add(m[1])
        if "Init COMPLETE" in text:
            self.init_complete += 1
            m = _INIT_COMPLETE_RE.search(text)
            if m is not None:
                self.init_ranks.add((m[1], int(m[2])))
        if " via " in text:
            m = _CHANNEL_VIA_RE.search(text)
            if m is not None:
                # Drop channel/device indices: NET/IB/3/GDRDMA -> NET/IB/GDRDMA.
                self.transports.add(_INDEX_SEGMENT_RE.sub("", m[1].strip()))
        if "NET/IB : No device found" in text:
            self.ib_no_device = True
        if "bus bandwidth" in text:
            m = _BUSBW_RE.search(text)
            if m is not None:
                self.avg_busbw_gbps = float(m[1])

    def feed_batch(self, lines: Sequence[str]) -> None:
        """Account for a batch of prefix-free lines; cheap for a firehose of plain INFO lines
        (one substring scan of the joined batch per fact, channel lines sampled)."""
        joined = "\n".join(lines)
        if "NCCL" not in joined and "bus bandwidth" not in joined:
            return
        if self._line_budget <= 0:
            # Past start-up only the facts that keep changing are looked for.
            phrases = [p for p in ("Init COMPLETE", "NCCL WARN") if p in joined]
        else:
            self._line_budget -= len(lines)
            phrases = [p for p in _SUMMARY_PHRASES if p in joined]
        if " via " in joined and self._via_budget > 0:
            phrases.append(" via ")
        if not phrases:
            return
        for line in lines:
            if any(p in line for p in phrases):
                if " via " in line:
                    if self._via_budget <= 0:
                        continue
                    self._via_budget -= 1
                self.feed(line)

    def headline(self) -> str:
        """One line for the NCCL pane's title: ``NCCL 2.21.5 · IB/GDRDMA · 16 init`` (empty
        before NCCL said anything)."""
        parts: list[str] = []
        if self.versions:
            parts.append("NCCL " + ",".join(sorted(self.versions)))
        if self.networks:
            net = "+".join(sorted(self.networks))
            parts.append(net + ("/GDRDMA" if self.gdrdma else ""))
        if self.init_complete:
            parts.append(f"{self.init_complete} init")
        if self.warnings:
            parts.append(f"{self.warnings} WARN")
        return " · ".join(parts)


def summarize_nccl(lines: Iterable[str]) -> NcclSummary:
    """Summarise raw lines (prefixes and ANSI are stripped here)."""
    summary = NcclSummary()
    for raw in lines:
        summary.feed(parse_line(raw).text)
    return summary

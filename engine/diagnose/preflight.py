"""The preflight's analysis: rank 0's ``[dtrain] preflight {json}`` line (written by the bundle's
``preflight.py``, :mod:`engine.trainer.preflight`) against what the plan assumed, as a verdict.

Called by :mod:`engine.launch.preflight` (which runs the preflight world and writes the result
to ``RUN/preflight.json``) and by the CLI and the wizard to show it. Pure: no torch, no I/O.

What it decides, and on which figures:

- **Fabric.** The whole world's all-reduce bus bandwidth at the largest size (nccl-tests:
  ``busbw = algbw * 2(n-1)/n``) against the plan's assumption: several GPU nodes, the network
  tier's per-node figure (``bandwidth_gbps`` or the catalog's line rate, times its NCCL
  efficiency, in GB/s); one GPU node, the GPU's scale-up link (catalog ``intra_gbps`` times
  :data:`INTRA_EFFICIENCY`). Below :data:`SLOW_FRACTION` of it is a finding. CPU ranks talk gloo
  over TCP (loopback on one machine), which no catalog fabric describes: their expectation is the
  floor :data:`GLOO_FLOOR_GBPS` a working socket path clears with room to spare.
- **Nodes and links.** Each node's own all-reduce (the intra-node link) and each pair of nodes
  (DLRover's pairing: round 1 neighbours, round 2 slowest with fastest) against the median of
  their peers (each node and rank against the median of the others, each pair against the
  median of the pairs): slower by :data:`GPU_SLOW_FACTOR` (GPU) or :data:`CPU_SLOW_FACTOR` (CPU ranks share
  cores, so they are noisier) is slow. A node slow in every pair it was in (two pairs or more:
  three nodes and up) is a slow node; a slow pair of otherwise healthy nodes is a slow link. With
  two nodes the pair alone cannot tell which node it is: the intra-node comparison does.
- **GPUs.** Each rank's GEMM TFLOP/s against the median of the ranks (same factors) and, on GPU,
  against the catalog's dense peak for the GEMM's dtype times its large-GEMM efficiency.

``preflight.json`` (:meth:`PreflightReport.to_json`) keeps the rows, the findings and, for
``calibrate``, ``measured``: ``allreduce_busbw_gbps`` (whole world, largest size),
``inter_node_busbw_gbps`` (the same figure when the world spans nodes, else null: the per-node
bus bandwidth the planner's network tier stands for), ``intra_node_busbw_gbps`` and
``gemm_tflops`` (median over ranks); all in GB/s (bytes) and TFLOP/s.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from engine.errors import DtrainError
from engine.plan.catalog import GpuType, get_gpu, get_network
from engine.plan.names import NetworkTier

RESULT_MARK = "[dtrain] preflight "
"""Rank 0's result line starts with this, then one JSON object."""
SCHEMA_VERSION = 1
PREFLIGHT_JSON = "preflight.json"

SLOW_FRACTION = 0.5
"""Measured below this fraction of the plan's figure (fabric, GEMM peak): a finding."""
GPU_SLOW_FACTOR = 1.25
"""On GPU, a node, pair or rank this many times slower than the median of its peers is slow
(GPUs of one type agree within a few percent; a throttled one loses 20 % and more)."""
CPU_SLOW_FACTOR = 5.0
"""The same for CPU ranks, which share cores with each other and the machine: wider."""
INTRA_EFFICIENCY = 0.8
"""Fraction of the scale-up link's one-way figure NCCL's all-reduce busbw reaches in a node."""
GLOO_FLOOR_GBPS = 0.05
"""CPU ranks over gloo: the busbw floor a working socket path clears (loopback gives ~1 GB/s)."""

Verdict = Literal["ok", "slow"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SweepRow(_Frozen):
    bytes: int
    seconds: float
    algbw_gbps: float
    busbw_gbps: float


class NodeRow(_Frozen):
    node: int
    host: str
    busbw_gbps: float
    slow: bool


class PairRow(_Frozen):
    round: int
    nodes: tuple[int, int]
    hosts: tuple[str, str]
    busbw_gbps: float
    slow: bool


class GemmRow(_Frozen):
    rank: int
    node: int
    host: str
    tflops: float
    of_peak: float | None
    """Fraction of the catalog's GEMM figure (GPU), None on CPU."""
    slow: bool


class Finding(_Frozen):
    kind: Literal["fabric", "node", "link", "gpu"]
    where: str
    """Who: ``node 1 (host)``, ``nodes 0-1 (h0 - h1)``, ``rank 3 on node 1 (host)``, ``world``."""
    message: str
    hosts: tuple[str, ...] = ()


class Expectation(_Frozen):
    basis: str
    """What the figure stands for: the network tier, the scale-up link, or gloo's floor."""
    busbw_gbps: float
    gemm_tflops: float | None
    """Catalog dense peak times GEMM efficiency for the GEMM's dtype (GPU only)."""


class Measured(_Frozen):
    allreduce_busbw_gbps: float
    inter_node_busbw_gbps: float | None
    intra_node_busbw_gbps: float | None
    gemm_tflops: float


class PreflightReport(_Frozen):
    version: int = SCHEMA_VERSION
    verdict: Verdict
    backend: str
    device: str
    world_size: int
    nodes: int
    gpus_per_node: int
    hosts: tuple[str, ...]
    """One per node, node-rank order (the launcher's names; the ranks' hostnames otherwise)."""
    expected: Expectation
    measured: Measured
    allreduce: tuple[SweepRow, ...]
    intra_node: tuple[NodeRow, ...]
    pairs: tuple[PairRow, ...]
    gemm: tuple[GemmRow, ...]
    gemm_shape: str
    findings: tuple[Finding, ...]
    raw: dict[str, Any]
    """Rank 0's line, as printed."""

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2) + "\n"

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict == "ok" else 1


def parse_result_line(lines: Iterable[str]) -> dict[str, Any] | None:
    """The last ``[dtrain] preflight {json}`` object among ``lines`` (None: there is none)."""
    found: dict[str, Any] | None = None
    for line in lines:
        at = line.find(RESULT_MARK + "{")
        if at < 0:
            continue
        try:
            obj = json.loads(line[at + len(RESULT_MARK) :])
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(obj, dict):
            found = obj
    return found


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _others(xs: Sequence[float], i: int) -> float:
    """The median of every value but the ``i``-th (a slow one must not drag its own yardstick
    down: with two nodes the median of both would need a 9x gap to see a 5x one)."""
    return _median([x for j, x in enumerate(xs) if j != i])


def _num(obj: Mapping[str, Any], key: str) -> float:
    v = obj.get(key)
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise DtrainError(f"preflight result: {key!r} is not a number", field="preflight")
    return float(v)


def _rows(raw: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    v = raw.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        raise DtrainError(f"preflight result: {key!r} is not a list of objects", field="preflight")
    return v


def _node_hosts(
    raw: Mapping[str, Any], nodes: int, per_node: int, hosts: Sequence[str]
) -> list[str]:
    """The launcher's host per node when it has real ones, else the ranks' own hostnames."""
    names = raw.get("hostnames")
    reported = [str(x) for x in names] if isinstance(names, list) else []
    out = []
    for n in range(nodes):
        given = hosts[n] if n < len(hosts) else ""
        mine = reported[n * per_node] if n * per_node < len(reported) else ""
        out.append(given if given and given != "localhost" else (mine or given or f"node{n}"))
    return out


def _gpu(plan: Mapping[str, Any] | None) -> GpuType | None:
    try:
        key = plan["gpu"]["key"] if plan else None
        return get_gpu(str(key)) if key else None
    except (KeyError, TypeError, ValueError):
        return None


def _network_gbps(plan: Mapping[str, Any] | None) -> tuple[float, str] | None:
    """The plan's inter-node figure as busbw, GB/s, and its name."""
    try:
        net = (plan or {}).get("spec", {}).get("network", {}) or {}
        tier = get_network(NetworkTier(net.get("tier", "tcp")))
    except (AttributeError, ValueError):
        return None
    gbits = net.get("bandwidth_gbps") or tier.gbps_per_node
    return float(gbits) / 8 * tier.efficiency, f"{tier.name}, {float(gbits):g} Gbit/s per node"


def expectation(raw: Mapping[str, Any], plan: Mapping[str, Any] | None) -> Expectation:
    """What the plan assumed for this world (see the module docstring)."""
    nodes = int(_num(raw, "nodes"))
    if raw.get("backend") != "nccl":
        return Expectation(
            basis=f"gloo on CPU ranks (a working socket path clears {GLOO_FLOOR_GBPS:g} GB/s)",
            busbw_gbps=GLOO_FLOOR_GBPS,
            gemm_tflops=None,
        )
    gpu = _gpu(plan)
    gemm: float | None = None
    if gpu is not None:
        dtype = str((_rows(raw, "gemm") or [{}])[0].get("dtype", "bfloat16"))
        peak = gpu.fp16_tflops if dtype == "float16" else gpu.peak_tflops(gpu.default_precision())
        gemm = peak * (gpu.gemm_efficiency or gpu.achievable_mfu)
    if nodes > 1:
        net = _network_gbps(plan)
        if net is not None:
            return Expectation(
                basis=f"the plan's network: {net[1]}", busbw_gbps=net[0], gemm_tflops=gemm
            )
    if gpu is not None:
        return Expectation(
            basis=f"{gpu.name} {gpu.intra_link.value} in a node ({gpu.intra_gbps:g} GB/s per GPU)",
            busbw_gbps=gpu.intra_gbps * INTRA_EFFICIENCY,
            gemm_tflops=gemm,
        )
    return Expectation(
        basis="no catalog figure (plan.json lacks the GPU)", busbw_gbps=0.0, gemm_tflops=gemm
    )


def analyze(
    raw: Mapping[str, Any], plan: Mapping[str, Any] | None = None, hosts: Sequence[str] = ()
) -> PreflightReport:
    """The verdict for rank 0's result ``raw``, given the bundle's ``plan.json`` (None: no
    catalog figures) and the launcher's host per node. Raises DtrainError on a malformed result."""
    world, nodes, per_node = (int(_num(raw, k)) for k in ("world_size", "nodes", "gpus_per_node"))
    gpu_side = raw.get("backend") == "nccl"
    factor = GPU_SLOW_FACTOR if gpu_side else CPU_SLOW_FACTOR
    names = _node_hosts(raw, nodes, per_node, hosts)
    exp = expectation(raw, plan)

    sweep = _sweep(raw)
    top = max(sweep, key=lambda r: r.bytes)
    findings = _fabric_findings(top, world, gpu_side, exp, names)
    intra, intra_findings = _intra_node(raw, names, factor)
    findings += intra_findings
    pair_floor = exp.busbw_gbps * SLOW_FRACTION if gpu_side else exp.busbw_gbps
    pairs = _pairs(raw, names, factor, pair_floor)
    findings += _pair_findings(pairs, nodes, {f.where for f in findings})
    gemm, gemm_findings = _gemm(raw, names, per_node, factor, exp.gemm_tflops)
    findings += gemm_findings
    intra_med = _median([row.busbw_gbps for row in intra])

    return PreflightReport(
        verdict="slow" if findings else "ok",
        backend=str(raw.get("backend", "?")),
        device=str(raw.get("device", "?")),
        world_size=world,
        nodes=nodes,
        gpus_per_node=per_node,
        hosts=tuple(names),
        expected=exp,
        measured=Measured(
            allreduce_busbw_gbps=top.busbw_gbps,
            inter_node_busbw_gbps=top.busbw_gbps if nodes > 1 else None,
            intra_node_busbw_gbps=(intra_med or None) if nodes > 1 else top.busbw_gbps,
            gemm_tflops=_median([g.tflops for g in gemm]),
        ),
        allreduce=sweep,
        intra_node=intra,
        pairs=tuple(pairs),
        gemm=tuple(gemm),
        gemm_shape=_gemm_shape(_rows(raw, "gemm")),
        findings=tuple(findings),
        raw=dict(raw),
    )


def _sweep(raw: Mapping[str, Any]) -> tuple[SweepRow, ...]:
    """The whole world's all-reduce, one row per message size (at least one)."""
    sweep = tuple(
        SweepRow(
            bytes=int(_num(r, "bytes")),
            seconds=_num(r, "seconds"),
            algbw_gbps=_num(r, "algbw_gbps"),
            busbw_gbps=_num(r, "busbw_gbps"),
        )
        for r in _rows(raw, "allreduce")
    )
    if not sweep:
        raise DtrainError("preflight result: no all-reduce sizes", field="preflight")
    return sweep


def _fabric_findings(
    top: SweepRow, world: int, gpu_side: bool, exp: Expectation, names: Sequence[str]
) -> list[Finding]:
    """The world's busbw at the largest size below the plan's figure (gloo: below its floor)."""
    if world <= 1 or exp.busbw_gbps <= 0:
        return []
    limit = exp.busbw_gbps if not gpu_side else exp.busbw_gbps * SLOW_FRACTION
    if top.busbw_gbps >= limit:
        return []
    return [
        Finding(
            kind="fabric",
            where="world",
            message=f"all-reduce busbw {top.busbw_gbps:.2f} GB/s at {_size(top.bytes)} is "
            f"below {limit:.2f} GB/s ({exp.busbw_gbps:.2f} GB/s expected from {exp.basis})",
            hosts=tuple(names),
        )
    ]


def _intra_node(
    raw: Mapping[str, Any], names: Sequence[str], factor: float
) -> tuple[tuple[NodeRow, ...], list[Finding]]:
    """Each node's own all-reduce, slow against the median of the other nodes."""
    intra_raw = _rows(raw, "intra_node")
    bws = [_num(r, "busbw_gbps") for r in intra_raw]
    rows = tuple(
        NodeRow(
            node=int(_num(r, "node")),
            host=names[int(_num(r, "node"))],
            busbw_gbps=bw,
            slow=bw * factor < _others(bws, i),
        )
        for i, (r, bw) in enumerate(zip(intra_raw, bws, strict=True))
    )
    findings = [
        Finding(
            kind="node",
            where=f"node {row.node} ({row.host})",
            message=f"its ranks' own all-reduce reaches {row.busbw_gbps:.2f} GB/s busbw, "
            f"under 1/{factor:g} of the other nodes' median {_others(bws, i):.2f} GB/s",
            hosts=(row.host,),
        )
        for i, row in enumerate(rows)
        if row.slow
    ]
    return rows, findings


def _pairs(
    raw: Mapping[str, Any], names: Sequence[str], factor: float, floor: float
) -> list[PairRow]:
    """Each pair of nodes, slow against the median of the pairs or below ``floor``."""
    pair_raw = _rows(raw, "pairs")
    median = _median([_num(r, "busbw_gbps") for r in pair_raw])
    pairs: list[PairRow] = []
    for r in pair_raw:
        a, b = (int(x) for x in r.get("nodes", [0, 0])[:2])
        bw = _num(r, "busbw_gbps")
        pairs.append(
            PairRow(
                round=int(_num(r, "round")),
                nodes=(a, b),
                hosts=(names[a], names[b]),
                busbw_gbps=bw,
                slow=bw * factor < median or bw < floor,
            )
        )
    return pairs


def _gemm(
    raw: Mapping[str, Any],
    names: Sequence[str],
    per_node: int,
    factor: float,
    expected: float | None,
) -> tuple[list[GemmRow], list[Finding]]:
    """Each rank's GEMM, slow against the other ranks' median or the catalog's ``expected``."""
    gemm_raw = _rows(raw, "gemm")
    tf = [_num(r, "tflops") for r in gemm_raw]
    rows: list[GemmRow] = []
    findings: list[Finding] = []
    for i, (r, t) in enumerate(zip(gemm_raw, tf, strict=True)):
        rank = int(_num(r, "rank"))
        node = rank // per_node
        of_peak = t / expected if expected else None
        peers = _others(tf, i)
        slow = t * factor < peers or (of_peak is not None and of_peak < SLOW_FRACTION)
        rows.append(
            GemmRow(rank=rank, node=node, host=names[node], tflops=t, of_peak=of_peak, slow=slow)
        )
        if not slow:
            continue
        why = f"GEMM {t:.3g} TFLOP/s, under 1/{factor:g} of the other ranks' median {peers:.3g}"
        if of_peak is not None and of_peak < SLOW_FRACTION:
            why = f"GEMM {t:.3g} TFLOP/s, {of_peak:.0%} of the catalog's {expected:.0f}"
        findings.append(
            Finding(
                kind="gpu",
                where=f"rank {rank} on node {node} ({names[node]})",
                message=why,
                hosts=(names[node],),
            )
        )
    return rows, findings


def _gemm_shape(gemm_raw: Sequence[Mapping[str, Any]]) -> str:
    """``bfloat16 4096x4096x4096``: the dtype and size of the first rank's GEMM ('' without)."""
    if not gemm_raw:
        return ""
    n = gemm_raw[0].get("n", "?")
    return f"{gemm_raw[0].get('dtype', '?')} {n}x{n}x{n}"


def _pair_findings(pairs: Sequence[PairRow], nodes: int, named: set[str]) -> list[Finding]:
    """A node slow in every pair it was in (at least two) is a slow node; any other slow pair
    is a slow link (with two nodes: unless one of them was already named slow)."""
    out: list[Finding] = []
    by_node: dict[int, list[PairRow]] = {}
    for p in pairs:
        for n in p.nodes:
            by_node.setdefault(n, []).append(p)
    bad_nodes = {
        n
        for n, ps in by_node.items()
        if len({q.nodes for q in ps}) >= 2 and all(q.slow for q in ps)
    }
    for n in sorted(bad_nodes):
        host = by_node[n][0].hosts[by_node[n][0].nodes.index(n)]
        worst = min(q.busbw_gbps for q in by_node[n])
        where = f"node {n} ({host})"
        if where not in named:
            out.append(
                Finding(
                    kind="node",
                    where=where,
                    message=f"slow in each of its {len(by_node[n])} node pairs "
                    f"(down to {worst:.2f} GB/s busbw); its peers are fast with other nodes",
                    hosts=(host,),
                )
            )
    node_named = any(w.startswith("node ") for w in named) or bool(bad_nodes)
    for p in pairs:
        if not p.slow or set(p.nodes) & bad_nodes or (nodes == 2 and node_named):
            continue
        out.append(
            Finding(
                kind="link",
                where=f"nodes {p.nodes[0]}-{p.nodes[1]} ({p.hosts[0]} - {p.hosts[1]})",
                message=f"the pair reaches {p.busbw_gbps:.2f} GB/s busbw (round {p.round})",
                hosts=p.hosts,
            )
        )
    return out


def _label(r: PreflightReport, f: Finding) -> str:
    """What a finding is about, as a person says it (a CPU rank's GEMM is not a GPU's)."""
    if f.kind == "gpu":
        return "GPU" if r.backend == "nccl" else "rank"
    return f.kind


def _size(nbytes: int) -> str:
    if nbytes >= 1 << 30 and nbytes % (1 << 30) == 0:
        return f"{nbytes >> 30} GiB"
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):g} MiB"
    return f"{nbytes / 1024:g} KiB"


def _secs(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def report_lines(r: PreflightReport) -> list[str]:
    """What a person reads: the busbw per size, the node and pair tables, the GEMM table and the
    verdict with each finding."""
    return [line.rstrip() for line in _report_lines(r)]


def _report_lines(r: PreflightReport) -> list[str]:
    out = [
        f"Preflight: {r.world_size} ranks on {r.nodes} node(s), {r.backend} on {r.device}",
        f"  expected busbw {r.expected.busbw_gbps:.2f} GB/s: {r.expected.basis}",
        "",
        "All-reduce, whole world (busbw = algbw x 2(n-1)/n)",
        f"  {'size':>9}  {'time':>10}  {'algbw GB/s':>10}  {'busbw GB/s':>10}",
    ]
    out += [
        f"  {_size(x.bytes):>9}  {_secs(x.seconds):>10}  {x.algbw_gbps:>10.2f}  {x.busbw_gbps:>10.2f}"
        for x in r.allreduce
    ]
    if r.intra_node:
        out += [
            "",
            "Inside each node (the node's ranks only)",
            f"  {'node':>4}  {'host':<24}  {'busbw GB/s':>10}",
        ]
        out += [
            f"  {x.node:>4}  {x.host:<24}  {x.busbw_gbps:>10.2f}{'  SLOW' if x.slow else ''}"
            for x in r.intra_node
        ]
    out += ["", "Node pairs (all ranks of both nodes; round 2 re-pairs slowest with fastest)"]
    if r.pairs:
        out.append(f"  {'round':>5}  {'nodes':>5}  {'hosts':<40}  {'busbw GB/s':>10}")
        out += [
            f"  {p.round:>5}  {p.nodes[0]:>2}-{p.nodes[1]:<2}  {p.hosts[0] + ' - ' + p.hosts[1]:<40}  "
            f"{p.busbw_gbps:>10.2f}{'  SLOW' if p.slow else ''}"
            for p in r.pairs
        ]
    else:
        out.append("  one node: no pairs")
    out += [
        "",
        f"GEMM per rank ({r.gemm_shape})",
        f"  {'rank':>4}  {'node':>4}  {'host':<24}  {'TFLOP/s':>9}  of peak",
    ]
    out += [
        f"  {g.rank:>4}  {g.node:>4}  {g.host:<24}  {g.tflops:>9.3g}  "
        f"{'' if g.of_peak is None else f'{g.of_peak:.0%}':>7}{'  SLOW' if g.slow else ''}"
        for g in r.gemm
    ]
    out.append("")
    if r.verdict == "ok":
        out.append("Verdict: ok: fabric, nodes and GPUs as the plan assumes")
    else:
        out.append(f"Verdict: slow: {len(r.findings)} finding(s)")
        out += [f"  ! slow {_label(r, f)}: {f.where}: {f.message}" for f in r.findings]
    return out


def verdict_line(r: PreflightReport) -> str:
    """One line: the verdict and the first finding (the wizard's status)."""
    if r.verdict == "ok":
        return (
            f"preflight ok: busbw {r.measured.allreduce_busbw_gbps:.2f} GB/s, "
            f"GEMM {r.measured.gemm_tflops:.3g} TFLOP/s per rank"
        )
    f = r.findings[0]
    more = f" (+{len(r.findings) - 1} more)" if len(r.findings) > 1 else ""
    return f"preflight slow {_label(r, f)}: {f.where}: {f.message}{more}"

"""How close the planner's estimates are to published measurements.

For every row of ``tests/data/published_runs.json`` whose layout is known, the row's layout and
settings are forced on the planner (``Spec.layout``: TP, PP, DP, CP, EP, virtual stages,
recompute, micro-batch, the framework's strategy), and the planner's step time is compared with
the measured one. Step time is the common currency: a source that reports TFLOP/s or MFU in its
own FLOP convention (``measured.flops_convention``: Narayanan 2021 counts the recompute pass,
Megatron-Bridge does not) has its step time derived with that same convention (``derived``), so
no FLOP convention leaks into the comparison. Rows that report MFU only (the Llama 3 paper) are
compared on MFU in the PaLM convention (``6N + 12·L·h·s``).

Settings the planner cannot state as published are mapped to its nearest ones, each explained
where it is done: "mixed precision" of 2021 is fp16, torchtitan's "selective" AC is MLP-only
recompute, FSDP2 under TP/EP/PP is a 3D layout with ZeRO-3 (parameters sharded too) except
torchtitan's under PP, which keeps the stage's weights and gradients whole (ZeRO-1), a
torchtitan TP/PP layout is timed and sized as the PyTorch-native stack it is (SDPA attention,
eager kernels), an FP8 Megatron row keeps its linear inputs in FP8 when sizing its recompute, and a
row stating plain 1F1B is not interleaved. torchtitan's Grand Teton H100s are the catalog's
``h100-sxm-500w`` (96 GB HBM2e, 500 W), as its benchmark page describes them.

The rows are split by SOURCE into a calibration set (Narayanan 2021, Korthikanti 2022,
torchtitan, and for MoE the MoE Parallel Folding paper, Liu et al. 2025), on which the model's
few global efficiency parameters were chosen, and a held-out
set (NeMo, Megatron-Bridge, AutoModel, Llama 3, BLOOM, BigScience's tr11 topology sweep,
MosaicML's MPT benchmarks under FSDP) that was never used to tune it.

Printed: one line per row (``-v``), MAPE per source and per set, the rank correlation (Spearman)
of per-GPU throughput inside each layout sweep (same source, model, GPU type, sequence length,
precision and GPU count, several layouts), whether the layout predicted fastest in each sweep
measures within 5 % of the sweep's best (the same again across GPU counts, as ``*_scale_*``),
and whether every layout that really trained on an 80 GB GPU is judged to fit. Last line, for
scripts::

    cal_mape=0.123 held_mape=0.145 all_mape=0.130 cal_spearman=0.9 ... mem_unfit=0

Run: ``.venv/bin/python benchmarks/estimate_accuracy.py [-v]``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.errors import SpecError  # noqa: E402
from engine.plan.catalog import get_gpu, list_gpus  # noqa: E402
from engine.plan.context import hardware  # noqa: E402
from engine.plan.memory import LayoutDraft, estimate_memory, logits_bytes  # noqa: E402
from engine.plan.models import resolve_model  # noqa: E402
from engine.plan.names import (  # noqa: E402
    Fp8Recipe,
    Framework,
    MoeDispatcher,
    NetworkTier,
    Offload,
    Precision,
    Recompute,
    Strategy,
)
from engine.plan.perf import estimate_time  # noqa: E402
from engine.plan.planner import plan  # noqa: E402
from engine.plan.result import Layout  # noqa: E402
from engine.plan.search import training_settings  # noqa: E402
from engine.plan.specs import (  # noqa: E402
    HardwareSpec,
    LayoutSpec,
    ModelSpec,
    NetworkSpec,
    Spec,
    TrainingSpec,
)

DATA = ROOT / "tests" / "data" / "published_runs.json"
CALIBRATION = ("narayanan2021", "korthikanti2022", "torchtitan", "liu2025")
"""Sources (row-id prefixes) the global parameters were chosen on; every other source is held
out."""
BEST_WITHIN = 0.05
GIB = 1024**3

# GPU strings as the sources print them -> catalog key (first match).
_GPU_KEYS = (
    ("gb300", "gb300"),
    ("b300", "b300"),
    ("gb200", "gb200"),
    ("h800", "h800"),
    ("h200", "h200"),
    ("hbm2e", "h100-sxm-500w"),  # torchtitan's Grand Teton H100s: 96GB HBM2e, 500 W
    ("h100", "h100-sxm"),
    ("a10040gb", "a100-40gb"),
    ("a100", "a100-80gb"),
    ("b200", "b200"),
)


@dataclass
class Row:
    """One published run as the harness uses it."""

    id: str
    source: str
    raw: dict[str, Any]
    spec: Spec | None = None
    skip: str = ""
    measured_s: float = 0.0
    measured_mfu: float = 0.0
    predicted: Layout | None = None
    error: float = math.nan
    """Signed relative error of the predicted step time (or MFU), (pred - meas) / meas."""
    notes: list[str] = field(default_factory=list)

    @property
    def held_out(self) -> bool:
        return not self.id.startswith(CALIBRATION)

    @property
    def measured_tps(self) -> float:
        """Measured tokens/s per GPU (the ranking quantity inside a sweep)."""
        t = self.raw["training"]
        gpus = self.raw["hardware"]["total_gpus"]
        return float(t["global_batch"] * t["seq_len"] / (self.measured_s * gpus))


def source_of(row_id: str) -> str:
    """The source family of a row id: ``mbridge2511``, ``narayanan2021``, ``torchtitan``..."""
    if row_id.startswith("torchtitan"):
        return "torchtitan"
    return re.split(r"_", row_id, maxsplit=1)[0]


# --------------------------------------------------------------------------------------------
# Row -> Spec


def _gpu_key(text: str) -> str | None:
    low = text.lower().replace(" ", "")
    for needle, key in _GPU_KEYS:
        if needle in low:
            return key
    return None


def is_fp8(row: dict[str, Any]) -> bool:
    """FP8 linears (Transformer Engine current/delayed scaling, MXFP8, torchao float8)."""
    text = (row["training"].get("precision") or "").lower()
    return any(k in text for k in ("fp8", "float8")) and "fp4" not in text


def _precision(row: dict[str, Any]) -> Precision | None:
    """bf16/fp16/fp8 rows (fp8: the planner's ``--precision fp8``, linear layers at the FP8
    peak); None for FP4 training and for rows whose precision is not stated."""
    text = (row["training"].get("precision") or "").lower()
    if not text or "fp4" in text:
        return None
    if is_fp8(row):
        return Precision.FP8
    if "not stated" in text:
        # "mixed precision (fp16/bf16 not stated)": Megatron-LM's 2021 GPT recipes train in
        # fp16 with dynamic loss scaling (``--fp16``), as its A100 runs of that year did.
        return Precision.FP16
    if "bf16" in text and row["id"].startswith("bloom"):
        # BLOOM trained in bf16 on Megatron-DeepSpeed (2022): unfused ALiBi attention, the
        # classic kernels the planner times for fp16 (the same A100 peak); its bf16 is not
        # Megatron-Core with Transformer Engine, which is what the planner's bf16 means.
        return Precision.FP16
    if "bf16" in text:
        return Precision.BF16
    if "mixed precision" in text or "fp16" in text:
        return Precision.FP16
    return None


def _fp8_recipe(row: dict[str, Any]) -> Fp8Recipe | None:
    """The FP8 scaling the row names: Megatron-Bridge's "FP8-MX" / "MXFP8" and torchao's
    mxfp8 (MX block scales), its 25.09 "blockwise" and DeepSeek-V3's fine-grained 1x128 /
    128x128 (block scales), "FP8-CS", "per-tensor" and torchao's "tensorwise" (one scale per
    tensor); None where it names none (per-tensor either way in the time model)."""
    if not is_fp8(row):
        return None
    text = (row["training"].get("precision") or "").lower()
    if "mx" in text:
        return Fp8Recipe.MXFP8
    if "blockwise" in text or "1x128" in text:
        return Fp8Recipe.BLOCKWISE
    if "-cs" in text or "per-tensor" in text or "tensorwise" in text:
        return Fp8Recipe.TENSORWISE
    return None


def _network(row_id: str, gpu: str) -> NetworkSpec:
    """The fabric each source ran on: Selene's 8 x HDR, DGX H100's 8 x NDR, Meta's 400 Gb/s
    RoCE per GPU, and for BLOOM and BigScience's tr11 topology benchmarks Jean Zay's Omni-Path
    as NCCL measured it: 4 x 100 Gb/s links a node on paper, but "we trained BLOOM on 50Gbps"
    (S. Bekman, who ran it, on all_reduce_bench's bus bandwidth: stas00/ml-engineering,
    network/benchmarks/README.md). The measured figure is what a user would enter (or what
    ``dtrain-tui preflight`` measures), so the row states it."""
    if row_id.startswith(("torchtitan", "llama3")):
        return NetworkSpec(tier=NetworkTier.ROCE, bandwidth_gbps=3200)
    if row_id.startswith(("bloom", "bigscience")):
        return NetworkSpec(tier=NetworkTier.IB, bandwidth_gbps=50)
    if row_id.startswith("llmfoundry_a100"):
        # MosaicML's A100 tables: "1600 Gbps node-node interconnect (RoCE)".
        return NetworkSpec(tier=NetworkTier.ROCE, bandwidth_gbps=1600)
    if gpu.startswith("a100"):
        return NetworkSpec(tier=NetworkTier.IB_HDR)
    if gpu == "b300":
        # HGX B300: a ConnectX-8 at 800 Gb/s per GPU, eight a node (HGX B300 datasheet).
        return NetworkSpec(tier=NetworkTier.IB_NDR, bandwidth_gbps=6400)
    # GB200 / GB300 NVL72: the catalog's NIC per GPU (ConnectX-7 / -8) times a tray's 4 GPUs.
    return NetworkSpec(tier=NetworkTier.IB_NDR)


def _mtp(row: dict[str, Any]) -> int | None:
    """The row's multi-token prediction modules where they differ from its preset's (DeepSeek-V3:
    one). Megatron-Bridge's DeepSeek-V3 recipe trains with one (``model_cfg.mtp_num_layers = 1``,
    src/megatron/bridge/recipes/deepseek/deepseek_v3.py) unless the table says "w/o MTP"; NeMo
    AutoModel's DeepSeek-V3 has no MTP module (its ``DeepseekV3ForCausalLM`` is the layers and
    the head: nemo_automodel/components/models/deepseek_v3/model.py); DeepSeek's own run trained
    with one (report §2.2, D = 1)."""
    if row["id"].startswith("automodel") or "w/o mtp" in row["model"]["name"].lower():
        return 0
    return None


def _model(m: dict[str, Any], mtp: int | None = None) -> ModelSpec:
    """The row's preset where it names one (DeepSeek-V3, Kimi K2: multi-head latent attention,
    shared experts, leading dense layers); otherwise explicit dimensions, an MLP gated unless
    its width is 4h. A shared expert left in the flat fields counts as one more active expert."""
    if m.get("preset"):
        # DeepSeek-V3 and Kimi K2: their MLA, shared experts and leading dense layers are in
        # the preset (the model's own configuration), not in the flat fields.
        return ModelSpec(preset=m["preset"], mtp_layers=mtp)
    if m["name"].upper().replace("-", " ").startswith("GPT OSS"):
        # GPT-OSS: its 128-token window on every second layer, attention sinks and biases are
        # in its configuration (the preset), not in the flat fields.
        return ModelSpec(preset=f"gpt-oss-{m['name'].split()[-1].lower()}")
    moe = m.get("moe")
    # The schema stores 4h for GPT-style two-matrix MLPs and the stated width for SwiGLU ones.
    gated = bool(moe) or (m.get("ffn") or 4 * m["hidden"]) != 4 * m["hidden"]
    kw: dict[str, Any] = {
        "layers": m["layers"],
        "hidden": m["hidden"],
        "heads": m["heads"],
        "kv_heads": m.get("kv_heads") or m["heads"],
        "head_dim": m.get("head_dim"),
        "vocab": m.get("vocab") or 129280,
        "gated_mlp": gated,
    }
    if moe:
        kw["ffn"] = moe["expert_ffn"]
        kw["num_experts"] = moe["routed_experts"]
        kw["experts_per_token"] = moe["top_k"] + (moe.get("shared_experts") or 0)
    else:
        kw["ffn"] = m.get("ffn") or 4 * m["hidden"]
    return ModelSpec(**kw)


def _layout(row: dict[str, Any], strategy: Strategy) -> LayoutSpec:
    lay = row["layout"]
    tr = row["training"]
    tp, pp = _tp_pp(row)
    mb = tr.get("micro_batch")
    if row["id"].startswith("torchtitan") and pp > 1:
        # torchtitan prints the local batch; unless told otherwise it splits it into as many
        # micro-batches as there are pipeline stages (``pipeline_parallel_microbatches``'s
        # default in its Dec 2024 config).
        local = tr["global_batch"] // lay["dp"]
        mb = local // pp if local % pp == 0 else None
    vs = lay.get("virtual_stages")
    if vs and row["model"]["layers"] % (pp * vs):
        vs = None  # an uneven interleaved split the planner cannot express: plain 1F1B
    schedule = (lay.get("pipeline_schedule") or "").lower()
    if pp > 1 and schedule and "interleav" not in schedule and "dualpipe" not in schedule:
        vs = 1  # stated plain 1F1B: not left to the search, which may interleave
    rc = lay.get("recompute")
    recompute = Recompute(rc.split()[0]) if rc else None
    if recompute == Recompute.SELECTIVE and row["id"].startswith("torchtitan"):
        # torchtitan's "selective" AC is not Korthikanti's (which FlashAttention makes free):
        # per-op SAC keeps every other matmul output and recomputes the rest, per-layer SAC
        # checkpoints every second block; both keep about a third of the activations and redo
        # about half a forward, as the planner's MLP-only recompute does.
        recompute = Recompute.MLP
    zero = None
    if strategy == Strategy.THREE_D:
        z = lay.get("zero_stage")
        if z is None and lay.get("fsdp"):
            z = 3  # FSDP2 under EP / PP (NeMo AutoModel): parameters, grads and states sharded
        if row["id"].startswith("torchtitan") and pp > 1:
            # torchtitan's FSDP2 under PP does not reshard after the forward ("For PP, by
            # default do not reshard after forward to avoid per-microbatch all-gathers",
            # ``fsdp_reshard_after_forward = "default"``) and accumulates the micro-batches'
            # unsharded gradients in the fp32 reduce dtype until the last one: the stage's
            # 16-bit parameters and fp32 gradients stay whole, the fp32 master and Adam's
            # moments sharded, one all-gather and one reduce-scatter a step -- Megatron's
            # distributed optimizer (ZeRO-1) in memory and in traffic.
            z = 1
        # 3D with ZeRO-3: FSDP2 under TP/PP/EP, non-expert weights sharded over DP x CP, the
        # experts over their EP x FSDP mesh (DP x CP / EP).
        zero = 1 if z is None else z
    sp = lay.get("sequence_parallel")
    etp = lay.get("expert_tp")
    if etp is None and row["id"].startswith("mbridge") and row["model"].get("moe") and tp > 1:
        # Megatron-Bridge's MoE recipes keep experts whole: ``expert_tensor_parallel_size=1``
        # (scripts/performance/configs/qwen/qwen3_workload_base_configs.py).
        etp = 1
    return LayoutSpec(
        strategy=strategy,
        tp=tp,
        pp=pp,
        dp=lay["dp"],
        cp=lay.get("cp") or 1,
        ep=lay.get("ep") or None,
        expert_tp=etp,
        zero_stage=zero,
        micro_batch=mb,
        recompute=recompute,
        virtual_stages=vs or None,
        sequence_parallel=(tp > 1) if sp is None else (bool(sp) and tp > 1),
        # No published run offloaded: left free, the planner would offload a layout that does
        # not fit its (80 GB) memory model and time the offload instead of the run.
        offload=Offload.NONE,
    )


def _dispatcher(row: dict[str, Any]) -> MoeDispatcher | None:
    """Hierarchical MoE dispatch where the source says so: NeMo AutoModel's rows name DeepEP
    ("kernel optimizations: TE + DeepEP"), and Megatron-Bridge's MoE hardware guide gives
    DeepEP as the dispatcher on H100 and B200 and HybridEP on GB200 / GB300
    (docs.nvidia.com/nemo/megatron-bridge, perf-techniques "MoE Hardware Configuration
    Reference"); both send a token once per remote node. Otherwise NCCL all-to-all, and
    always for Megatron-Bridge's token-drop rows: its token-drop helper
    (``megatron.bridge.training.utils.moe_token_drop.apply_moe_token_drop``) asserts the
    all-to-all dispatcher ("moe_expert_capacity_factor only works with alltoall token
    dispatcher"). A row that states its dispatcher (``training.moe_dispatcher``) runs it:
    Megatron-Bridge 26.02's GPT-OSS 120B rows, whose release's performance config set no flex
    backend for that model, so its provider's all-to-all ran."""
    if not row["model"].get("moe"):
        return None
    stated = row["training"].get("moe_dispatcher")
    if stated:
        return MoeDispatcher(stated)
    named = row["id"].startswith("automodel") and any(
        "DeepEP" in c for c in row.get("caveats") or []
    )
    token_drop = row["training"].get("moe_capacity_factor") is not None
    bridge = row["id"].startswith("mbridge") and not token_drop
    return MoeDispatcher.DEEPEP if named or bridge else None


def _tp_pp(row: dict[str, Any]) -> tuple[int, int]:
    """The row's TP and PP; Narayanan 2021 Table 2 states only the model-parallel size, which
    Table 1 splits as TP 8 within a node and PP across (96 = 8 x 12, 280 = 8 x 35)."""
    lay = row["layout"]
    mps = lay.get("model_parallel_size")
    if lay.get("tp") is None and lay.get("pp") is None and mps and mps % 8 == 0:
        return 8, mps // 8
    return lay.get("tp") or 1, lay.get("pp") or 1


def _strategy(row: dict[str, Any]) -> Strategy:
    lay = row["layout"]
    if row["id"].startswith("narayanan2021_t2_zero3"):
        return Strategy.ZERO3
    tp, pp, ep = lay.get("tp") or 1, lay.get("pp") or 1, lay.get("ep") or 1
    if row["id"].startswith("torchtitan") and tp == 1 and pp == 1:
        return Strategy.FSDP_FULL
    if row["id"].startswith("automodel") and tp == 1 and pp == 1 and ep == 1:
        return Strategy.FSDP_FULL
    if row["id"].startswith("llmfoundry"):
        return Strategy.FSDP_FULL  # Composer's FSDP, FULL_SHARD
    return Strategy.THREE_D


def build_spec(row: dict[str, Any]) -> tuple[Spec | None, str]:
    """The row as a forced-layout Spec, or None and why it cannot be one."""
    hw, lay, tr = row["hardware"], row["layout"], row["training"]
    if row["scope"] == "ratio":
        return None, "ratio row: its GPUs' power limit is not stated (see the FP8 recipe test)"
    if row["scope"] != "end_to_end":
        return None, "per-layer timing"
    gpu = _gpu_key(hw["gpu"])
    if gpu is None or gpu not in {g.key for g in list_gpus()}:
        return None, f"GPU {hw['gpu']!r} not in the catalog"
    precision = _precision(row)
    if is_fp8(row) and not get_gpu(gpu).fp8_tflops:
        return None, f"{gpu} has no FP8 peak in the catalog"
    if precision is None:
        return None, f"precision {tr.get('precision')!r} not modelled"
    if lay.get("dp") is None or (
        lay.get("tp") is None and lay.get("pp") is None and not lay.get("model_parallel_size")
    ):
        return None, "layout (tp/pp) not stated"
    if not tr.get("seq_len") or not tr.get("global_batch"):
        return None, "sequence length or global batch not stated"
    m = row["model"]
    if not all(m.get(k) for k in ("layers", "hidden", "heads")):
        return None, "model dimensions not stated"
    gpn = hw.get("gpus_per_node") or 4
    spec = Spec(
        model=_model(row["model"], _mtp(row)),
        hardware=HardwareSpec(gpu=gpu, gpus_per_node=gpn, nodes=hw["total_gpus"] // gpn),
        network=_network(row["id"], gpu),
        training=TrainingSpec(
            seq_len=tr["seq_len"],
            global_batch=tr["global_batch"],
            precision=precision,
            fp8_recipe=_fp8_recipe(row),
            # Megatron-Bridge's performance recipes keep bf16 gradients:
            # ``cfg.ddp.grad_reduce_in_fp32 = False`` (scripts/performance/configs/llama/
            # llama31_llm_pretrain.py, set_llama31_common_configs); a row whose source
            # configuration says so states it (``grad_reduce_dtype``).
            grads_bf16=(
                row["id"].startswith("mbridge") or tr.get("grad_reduce_dtype") == "bf16" or None
            ),
            # A row states how its context parallelism moved keys and values where its source
            # says (``cp_comm``); otherwise Megatron's default ring.
            cp_comm=tr.get("cp_comm"),
            # Adam's moments in bf16, the activations and the optimizer states offloaded to
            # the host, where the row's source configuration says so (``moments_bf16``,
            # ``offload_modules``, ``offload_optimizer_states``).
            moments_bf16=tr.get("moments_bf16"),
            offload_modules=tr.get("offload_modules"),
            offload_optimizer_states=tr.get("offload_optimizer_states"),
            moe_dispatcher=_dispatcher(row),
            # Megatron's all-to-all overlap is off, its default (Megatron-LM's
            # --overlap-moe-expert-parallel-comm, Megatron-Bridge's WorkloadBaseConfig
            # moe_a2a_overlap=False), said explicitly so the plan makes no offer for it; on
            # for DeepSeek-V3's DualPipe, which is that overlap (see _DUALPIPE_CHUNKS), and
            # where a row's source turned it on (``moe_a2a_overlap``: the Megatron Core MoE
            # report's "1F1B overlap: ON").
            moe_a2a_overlap=_dualpipe(row) or tr.get("moe_a2a_overlap") is True,
            moe_capacity_factor=tr.get("moe_capacity_factor"),
            # A benchmark that forced balanced routing says so (``moe_imbalance`` 1.0).
            moe_imbalance=tr.get("moe_imbalance"),
            # llm-foundry's MPT computes its loss with flash-attn's fused CrossEntropyLoss
            # (``loss_fn`` defaults to ``fused_crossentropy``: llmfoundry/models/mpt/
            # modeling_mpt.py, ComposerMPTCausalLM).
            fused_cross_entropy=row["id"].startswith("llmfoundry") or None,
            # torchtitan's Python modules run eagerly unless the row compiled them
            # (``training.compile``, from the source's table, command line or preset).
            torch_compile=tr.get("compile"),
        ),
        layout=_layout(row, _strategy(row)),
    )
    return spec, ""


# --------------------------------------------------------------------------------------------
# Measured values


def measured(row: dict[str, Any]) -> tuple[float, float]:
    """(step time s, MFU): the measured step time, else the collector's derived one (in the
    source's own FLOP convention), else one from tokens/s per GPU; MFU when only that is given."""
    me, de, tr = row["measured"], row.get("derived") or {}, row["training"]
    step = me.get("step_time_s") or de.get("step_time_s")
    tps = me.get("tokens_per_s_per_gpu") or de.get("tokens_per_s_per_gpu")
    if not step and tps and tr.get("global_batch") and tr.get("seq_len"):
        step = tr["global_batch"] * tr["seq_len"] / (tps * row["hardware"]["total_gpus"])
    return float(step or 0.0), float(me.get("mfu") or 0.0)


def palm_mfu(row: dict[str, Any], step_s: float, peak_flops: float) -> float:
    """MFU in the PaLM convention (``6N + 12·L·h·s`` per token) of a step of ``step_s``."""
    m, tr = row["model"], row["training"]
    n = (m.get("active_params_b") or m["params_b"]) * 1e9
    per_token = 6 * n + 12 * m["layers"] * m["hidden"] * tr["seq_len"]
    tokens = tr["global_batch"] * tr["seq_len"]
    return float(per_token * tokens / (step_s * row["hardware"]["total_gpus"] * peak_flops))


def evaluate(row: Row) -> None:
    """Fill in the prediction and its error (or why the row is skipped)."""
    if row.spec is None:
        return
    try:
        p = plan(row.spec)
    except SpecError as e:
        row.skip = f"refused: {e}"
        return
    row.predicted = p.recommended
    step = p.recommended.step_time_s
    eager = row.id.startswith("torchtitan") and p.recommended.framework == Framework.MEGATRON
    chunks = _uneven_chunks(row.raw)
    if eager:
        step = _retimed(row.spec, row.predicted, eager=True, chunks=chunks)
    elif chunks:
        # The planner chose recompute and end-stage split at an interleaving it can write;
        # at the row's own, it would choose again: the fastest of those that fit.
        same = [a for a in p.alternatives if a.fits and _same_mesh(a, p.recommended)]
        step = min(
            _retimed(row.spec, lay, eager=False, chunks=chunks) for lay in [p.recommended, *same]
        )
    if row.measured_s:
        row.error = (step - row.measured_s) / row.measured_s
    elif row.measured_mfu:
        mfu = palm_mfu(row.raw, step, p.gpu.peak_tflops * 1e12)
        row.error = (mfu - row.measured_mfu) / row.measured_mfu
    else:
        row.skip = "no measured time or MFU"


def _same_mesh(a: Layout, b: Layout) -> bool:
    """Two layouts on the same devices and batch split (they differ in recompute, end-stage
    split or interleaving only)."""
    keys = ("framework", "tp", "pp", "dp", "cp", "ep", "expert_tp", "zero_stage", "micro_batch")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def _draft(lay: Layout, spec: Spec) -> LayoutDraft:
    """The planned layout as the time model takes it, with what the planner adds from the
    spec's training settings (the expert TP, the MoE dispatcher and capacity)."""
    return replace(lay.draft(), etp=lay.expert_tp, **training_settings(spec))


_DUALPIPE_CHUNKS = 2
"""DeepSeek-V3's DualPipe (report §3.2.1) feeds micro-batches from both ends of the pipeline,
each rank holding two model chunks (its "two copies of the model parameters"), and pairs one
chunk's forward with another's backward so that each one's all-to-all dispatch and combine
run under the other's computation on 20 of the H800's 132 SMs: Megatron-Core's expert-parallel
all-to-all overlap over two virtual stages, which is how the row is timed."""


def _dualpipe(raw: dict[str, Any]) -> bool:
    return "dualpipe" in (raw["layout"].get("pipeline_schedule") or "").lower()


def _uneven_chunks(raw: dict[str, Any]) -> int:
    """The row's stated interleaving where its layers do not split evenly over pp x v model
    chunks, DualPipe's two chunks a rank included (0 otherwise)."""
    lay = raw["layout"]
    v, pp = lay.get("virtual_stages") or 1, lay.get("pp") or 1
    schedule = (lay.get("pipeline_schedule") or "").lower()
    if _dualpipe(raw):
        v = _DUALPIPE_CHUNKS
    elif schedule and "interleav" not in schedule:
        return 0  # a stated plain 1F1B
    if v <= 1 or pp <= 1:
        return 0
    return v if raw["model"]["layers"] % (pp * v) else 0


def _retimed(spec: Spec, lay: Layout, *, eager: bool, chunks: int = 0) -> float:
    """The planned layout re-timed as the row ran it. ``eager``: a torchtitan TP/PP layout,
    which the planner can only state as a Megatron one, timed as the PyTorch-native (FSDP2)
    stack it is: SDPA attention, eager element-wise kernels, no Megatron overlap of the
    backward TP all-reduce."""
    gpu = get_gpu(spec.hardware.gpu)
    hw = hardware(spec, gpu, lay.precision)
    draft = _draft(lay, spec)
    if eager:
        draft = replace(draft, framework=Framework.FSDP)
    if chunks:
        draft = replace(
            draft, virtual_stages=chunks, a2a_overlap=bool(spec.training.moe_a2a_overlap)
        )
    dims = resolve_model(spec.model)
    return estimate_time(dims, draft, hw, seq_len=spec.training.seq_len).step_time_s


def load_rows(path: Path = DATA) -> list[Row]:
    out = []
    for raw in json.loads(path.read_text())["runs"]:
        spec, why = build_spec(raw)
        step, mfu = measured(raw)
        out.append(
            Row(raw["id"], source_of(raw["id"]), raw, spec, why, measured_s=step, measured_mfu=mfu)
        )
    return out


# --------------------------------------------------------------------------------------------
# Figures


def mape(errors: list[float]) -> float:
    return statistics.fmean(abs(e) for e in errors) if errors else math.nan


def ranks(xs: list[float]) -> list[float]:
    """Ranks (1-based), ties given their average rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = math.sqrt(sum((x - ma) ** 2 for x in ra))
    vb = math.sqrt(sum((y - mb) ** 2 for y in rb))
    return cov / (va * vb) if va and vb else math.nan


@dataclass
class Sweep:
    key: str
    rows: list[Row]

    def figures(self) -> tuple[float, bool]:
        """(Spearman of per-GPU throughput, predicted-fastest measures within 5 % of the best)."""
        meas = [r.measured_tps for r in self.rows]
        pred = [r.measured_tps / (1 + r.error) for r in self.rows]
        rho = spearman(pred, meas) if len(self.rows) >= 3 else math.nan
        pick = max(range(len(pred)), key=lambda i: pred[i])
        return rho, meas[pick] >= (1 - BEST_WITHIN) * max(meas)

    def best_predicted_near(self) -> bool:
        """The issue's criterion: the layout that measured fastest is predicted within 5 % of
        the fastest prediction (its predicted step at most 1.05 times the shortest). The converse
        of :meth:`figures`' (the predicted fastest measures within 5 % of the best), which a
        near tie in the prediction can fail."""
        meas = [r.measured_tps for r in self.rows]
        pred = [r.measured_tps / (1 + r.error) for r in self.rows]
        best = max(range(len(meas)), key=lambda i: meas[i])
        return max(pred) <= (1 + BEST_WITHIN) * pred[best]


def sweeps(rows: list[Row], *, by_size: bool = True) -> list[Sweep]:
    """Layout sweeps: rows of one source, model, GPU type, sequence length, precision and GPU
    count with at least two distinct forced layouts (a row whose spec repeats another's, e.g.
    the same layout with torch.compile, is left out: the model cannot tell them apart). The
    layouts a planner chooses between for one job. ``by_size=False``: across GPU counts too,
    which adds scale series (one layout at 16 to 128 GPUs, where per-GPU throughput barely
    moves and its ranks are noise; a cluster size is not a layout choice)."""
    groups: dict[str, list[Row]] = defaultdict(list)
    seen: set[str] = set()
    for r in rows:
        if r.spec is None or not r.measured_s or math.isnan(r.error):
            continue
        sig = r.spec.model_dump_json() + str(is_fp8(r.raw))
        if sig in seen:
            continue
        seen.add(sig)
        t = r.spec.training
        prec = "fp8" if is_fp8(r.raw) else t.precision
        key = f"{r.source}|{r.raw['model']['name']}|{r.spec.hardware.gpu}|{t.seq_len}|{prec}"
        if by_size:
            key += f"|{r.raw['hardware']['total_gpus']}"
        groups[key].append(r)
    return [Sweep(k, v) for k, v in groups.items() if len(v) >= 2]


def memory_check(rows: list[Row]) -> list[Row]:
    """Rows that really trained on an 80 GB GPU but are judged not to fit."""
    bad = []
    for r in rows:
        p = r.predicted
        if p is None or "80" not in r.raw["hardware"]["gpu"]:
            continue
        if not p.fits:
            bad.append(r)
    return bad


def _line(r: Row) -> str:
    p = r.predicted
    if p is None:
        return f"  {r.id:56s} skipped: {r.skip}"
    what = "step" if r.measured_s else "mfu "
    meas = r.measured_s if r.measured_s else r.measured_mfu
    pred = meas * (1 + r.error)
    mem = p.memory_per_gpu.total / GIB
    return (
        f"  {r.id:56s} {what} meas {meas:9.3f} pred {pred:9.3f} err {r.error:+7.1%} "
        f"mem {mem:6.1f} GiB{'' if p.fits else ' (does not fit)'}"
    )


def _kind(r: Row) -> str:
    assert r.spec is not None
    return "moe" if resolve_model(r.spec.model).is_moe else "dense"


def report(rows: list[Row], verbose: bool) -> dict[str, float]:
    """Print the figures; return the key=value summary."""
    ok = [r for r in rows if not math.isnan(r.error)]
    if verbose:
        for r in rows:
            print(_line(r))
    print("\nMAPE by source (step time; MFU for rows reporting MFU only):")
    by_src: dict[str, list[float]] = defaultdict(list)
    for r in ok:
        by_src[r.source].append(r.error)
    for src, errs in sorted(by_src.items()):
        bias = statistics.fmean(errs)
        held = "held-out" if not src.startswith(CALIBRATION) else "calibration"
        print(f"  {src:16s} {held:11s} n={len(errs):3d} MAPE {mape(errs):6.1%} bias {bias:+6.1%}")
    out: dict[str, float] = {}
    for name, subset in (
        ("cal", [r for r in ok if not r.held_out]),
        ("held", [r for r in ok if r.held_out]),
        ("all", ok),
    ):
        out[f"{name}_n"] = len(subset)
        out[f"{name}_mape"] = mape([r.error for r in subset])
    print("\nMAPE by kind of model (dense transformers, mixtures of experts):")
    for name, held in (("cal", False), ("held", True)):
        for kind in ("dense", "moe"):
            errs = [r.error for r in ok if r.held_out == held and _kind(r) == kind]
            if errs:
                out[f"{name}_{kind}_mape"] = mape(errs)
                print(f"  {name:4s} {kind:5s} n={len(errs):3d} MAPE {mape(errs):6.1%}")
    _sweep_figures(ok, out, by_size=True)
    _sweep_figures(ok, out, by_size=False)
    bad = memory_check(ok)
    print(f"\nLayouts that trained on 80 GB GPUs judged not to fit: {len(bad)}")
    for r in bad:
        assert r.predicted is not None
        print(f"  {r.id}: {r.predicted.memory_per_gpu.total / GIB:.1f} GiB")
    out["mem_unfit"] = len(bad)
    print("\nPeak memory against the published figure (torchtitan's peak memory per GPU):")
    for fw, errs in memory_errors(ok).items():
        out[f"mem_{fw}_mape"] = mape(errs)
        bias = statistics.fmean(errs)
        print(f"  planned as {fw:9s} n={len(errs):3d} MAPE {mape(errs):6.1%} bias {bias:+6.1%}")
    out["skipped"] = len(rows) - len(ok)
    return out


def _sweep_figures(ok: list[Row], out: dict[str, float], *, by_size: bool) -> None:
    """Print each sweep's Spearman and whether its predicted-fastest layout measures within
    5 % of its best, and whether the best measured is predicted within 5 % of the fastest
    prediction; set ``{cal,held}_spearman`` / ``_best_ok`` / ``_best_near`` (layout sweeps,
    one GPU count) or ``{cal,held}_scale_spearman`` / ``_best_ok`` / ``_best_near`` (across
    GPU counts too)."""
    if by_size:
        print("\nLayout sweeps, one GPU count (Spearman of tokens/s per GPU; predicted fastest")
        print("within 5 % of measured best):")
    else:
        print("\nAcross GPU counts too (adds scale series: one layout at several cluster sizes):")
    suffix = "" if by_size else "_scale"
    for tag in ("cal", "held"):
        rhos, hits, near = [], [], []
        for sw in sweeps([r for r in ok if r.held_out == (tag == "held")], by_size=by_size):
            rho, hit = sw.figures()
            near.append(sw.best_predicted_near())
            gpus = "/".join(
                str(g) for g in sorted({r.raw["hardware"]["total_gpus"] for r in sw.rows})
            )
            print(
                f"  {tag:4s} {sw.key:75s} n={len(sw.rows)} gpus={gpus} rho={rho:+.2f} "
                f"best_ok={hit} best_near={near[-1]}"
            )
            if not math.isnan(rho):
                rhos.append(rho)
            hits.append(hit)
        out[f"{tag}{suffix}_spearman"] = statistics.fmean(rhos) if rhos else math.nan
        out[f"{tag}{suffix}_best_ok"] = sum(hits) / len(hits) if hits else math.nan
        out[f"{tag}{suffix}_best_near"] = sum(near) / len(near) if near else math.nan


def memory_errors(rows: list[Row]) -> dict[str, list[float]]:
    """Signed relative errors of the predicted peak memory per GPU, by the framework the row's
    layout is planned as, over the rows that publish a peak (``measured.peak_memory_gib``:
    torchtitan's, which counts what PyTorch's allocator held, so not NCCL's buffers). A torchtitan TP/PP row, which
    the planner can only state as a Megatron one, is sized as the eager modules it runs
    (:func:`eager_peak_bytes`), as it is timed; reported apart."""
    out: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        peak = r.raw["measured"].get("peak_memory_gib")
        if not peak or r.predicted is None or r.spec is None:
            continue
        # torch.cuda.max_memory_reserved never sees NCCL's buffers (NCCL allocates its own).
        mem = r.predicted.memory_per_gpu
        total = float(mem.total - mem.nccl)
        if r.id.startswith("torchtitan") and r.predicted.framework == Framework.MEGATRON:
            total = eager_peak_bytes(r.spec, r.predicted) - mem.nccl
        out[r.predicted.framework.value].append(total / GIB / peak - 1)
    return dict(sorted(out.items()))


def eager_peak_bytes(spec: Spec, lay: Layout) -> float:
    """The planned layout's peak with the activations and the loss's logits of plain PyTorch
    modules (SDPA attention, an unfused SwiGLU, K and V repeated to every head, the eager
    cross-entropy's 14 bytes a logit) in place of Megatron-Core's fused ones; the model states
    as planned."""
    dims = resolve_model(spec.model)
    seq = spec.training.seq_len
    s_local = max(1, seq // lay.cp)
    fused = _draft(lay, spec)
    eager = replace(fused, framework=Framework.FSDP)
    sizes = [
        estimate_memory(dims, d, seq_len=seq, optimizer=spec.training.optimizer)
        for d in (fused, eager)
    ]
    logits = [logits_bytes(dims, d, s_local) if d.pp == 1 else 0.0 for d in (fused, eager)]
    swap = sizes[1].activations + logits[1] - sizes[0].activations - logits[0]
    return float(lay.memory_per_gpu.total + swap)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per row")
    args = ap.parse_args(argv)
    rows = load_rows()
    for r in rows:
        evaluate(r)
    out = report(rows, args.verbose)
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in out.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

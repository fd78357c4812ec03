"""The memory model against its sources: the ZeRO paper's Table 1, Korthikanti et al.'s activation
formulas, and DeepSpeed's own estimators (called for real)."""

from __future__ import annotations

import io
import math
import os
import re
from contextlib import redirect_stdout

import pytest

from engine.plan.dims import ModelDims
from engine.plan.memory import (
    LayoutDraft,
    estimate_memory,
    korthikanti_layer_bytes,
    largest_layer_params,
    layer_activation_bytes,
    model_states,
    pipeline_in_flight,
    zero_k,
    zero_model_states_bytes,
)
from engine.plan.models import resolve_model
from engine.plan.names import (
    Framework,
    Offload,
    Optimizer,
    PPSchedule,
    Precision,
    Recompute,
    Strategy,
)
from engine.plan.specs import ModelSpec

GB = 1e9

# ZeRO paper (Rajbhandari et al. 2020, arXiv:1910.02054), Table 1: per-device memory (GB) of
# model states for P_os, P_os+g, P_os+g+p, K = 12, as printed.
ZERO_TABLE_1 = {
    # dp: {(model params): (Pos, Pos+g, Pos+g+p)}
    1: {7.5e9: (120, 120, 120), 128e9: (2048, 2048, 2048), 1e12: (16000, 16000, 16000)},
    4: {7.5e9: (52.5, 41.3, 30), 128e9: (896, 704, 512), 1e12: (7000, 5500, 4000)},
    16: {7.5e9: (35.6, 21.6, 7.5), 128e9: (608, 368, 128), 1e12: (4750, 2875, 1000)},
    64: {7.5e9: (31.4, 16.6, 1.88), 128e9: (536, 284, 32), 1e12: (4187, 2218, 250)},
    256: {7.5e9: (30.4, 15.4, 0.47), 128e9: (518, 263, 8), 1e12: (4046, 2054, 62.5)},
    1024: {7.5e9: (30.1, 15.1, 0.12), 128e9: (513, 257, 2), 1e12: (4011, 2013, 15.6)},
}


@pytest.mark.parametrize("nd", sorted(ZERO_TABLE_1))
def test_zero_paper_table_1(nd: int) -> None:
    k = zero_k(Precision.FP16, Optimizer.ADAMW)
    assert k == 12
    for psi, printed in ZERO_TABLE_1[nd].items():
        for stage, want in zip((1, 2, 3), printed, strict=True):
            got = zero_model_states_bytes(psi, k, nd, stage) / GB
            # The paper prints 2-3 significant figures; within 1% (or its last printed digit).
            assert got == pytest.approx(want, rel=0.01, abs=0.006), (nd, psi, stage)


def test_zero_paper_7_5b_on_64_gpus() -> None:
    """§1/§5: a 7.5B model with 64-way DP needs 120 GB without ZeRO, 31.4 GB with P_os,
    16.6 GB with P_os+g and 1.88 GB with P_os+g+p."""
    psi, nd, k = 7.5e9, 64, 12
    assert zero_model_states_bytes(psi, k, nd, 0) / GB == pytest.approx(120, rel=0.01)
    assert zero_model_states_bytes(psi, k, nd, 1) / GB == pytest.approx(31.4, rel=0.01)
    assert zero_model_states_bytes(psi, k, nd, 2) / GB == pytest.approx(16.6, rel=0.01)
    assert zero_model_states_bytes(psi, k, nd, 3) / GB == pytest.approx(1.88, rel=0.01)


def test_framework_states_follow_the_paper_where_they_should() -> None:
    """Megatron without the distributed optimizer holds 18 B/param (fp32 main grads); FSDP and
    DDP 16; DeepSpeed's stage-3 model states are (2+4+12)/N."""
    psi = 1e9
    kw = {"precision": Precision.BF16, "optimizer": Optimizer.ADAMW}
    meg = model_states(
        psi, 8, framework=Framework.MEGATRON, strategy=Strategy.THREE_D, zero_stage=0, **kw
    )  # type: ignore[arg-type]
    assert (meg.params, meg.grads, meg.optimizer) == (2 * psi, 4 * psi, 12 * psi)
    dist = model_states(
        psi, 8, framework=Framework.MEGATRON, strategy=Strategy.THREE_D, zero_stage=1, **kw
    )  # type: ignore[arg-type]
    assert dist.params + dist.grads + dist.optimizer == pytest.approx(6 * psi + 12 * psi / 8)
    ddp = model_states(psi, 8, framework=Framework.DDP, strategy=Strategy.DDP, zero_stage=0, **kw)  # type: ignore[arg-type]
    assert ddp.params + ddp.grads + ddp.optimizer == 16 * psi
    assert ddp.buffers == 4 * psi  # DDP's buckets copy the fp32 grads (gradient_as_bucket_view off)
    fsdp = model_states(
        psi, 8, framework=Framework.FSDP, strategy=Strategy.FSDP_FULL, zero_stage=3, **kw
    )  # type: ignore[arg-type]
    assert fsdp.params + fsdp.grads + fsdp.optimizer == pytest.approx(16 * psi / 8)
    sgd = model_states(
        psi,
        1,
        framework=Framework.DDP,
        strategy=Strategy.DDP,
        zero_stage=0,
        precision=Precision.FP32,
        optimizer=Optimizer.SGD,
    )
    assert sgd.optimizer == 4 * psi
    a8 = model_states(
        psi,
        1,
        framework=Framework.DDP,
        strategy=Strategy.DDP,
        zero_stage=0,
        precision=Precision.FP32,
        optimizer=Optimizer.ADAM8BIT,
    )
    assert a8.optimizer == 2 * psi


# ---------------------------------------------------------------------------------------------
# Korthikanti et al. 2022


def _gpt(h: int, a: int, layers: int = 4, vocab: int = 51200) -> ModelDims:
    """A model with the paper's assumptions: MHA, a non-gated 4h MLP."""
    return resolve_model(ModelSpec(layers=layers, hidden=h, heads=a, vocab=vocab))


@pytest.mark.parametrize(
    ("s", "b", "h", "a", "t"),
    [
        (2048, 1, 12288, 96, 8),
        (2048, 4, 6144, 64, 8),
        (4096, 2, 4096, 32, 4),
        (1024, 8, 1024, 16, 2),
    ],
)
def test_korthikanti_formulas_exact(s: int, b: int, h: int, a: int, t: int) -> None:
    sbh = s * b * h
    # Table 2, the formulas as printed.
    assert korthikanti_layer_bytes(s, b, h, a) == sbh * (34 + 5 * a * s / h)
    assert korthikanti_layer_bytes(s, b, h, a, t=t) == pytest.approx(
        sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12
    )
    assert korthikanti_layer_bytes(s, b, h, a, t=t, sp=True) == pytest.approx(
        sbh / t * (34 + 5 * a * s / h), rel=1e-12
    )
    assert korthikanti_layer_bytes(
        s, b, h, a, t=t, sp=True, recompute=Recompute.SELECTIVE
    ) == pytest.approx(sbh * 34 / t, rel=1e-12)
    assert korthikanti_layer_bytes(s, b, h, a, t=t, recompute=Recompute.SELECTIVE) == pytest.approx(
        sbh * (10 + 24 / t), rel=1e-12
    )
    assert korthikanti_layer_bytes(s, b, h, a, recompute=Recompute.FULL) == 2 * sbh
    assert (
        korthikanti_layer_bytes(s, b, h, a, t=t, sp=True, recompute=Recompute.FULL) == 2 * sbh / t
    )
    # Our generalised accounting reduces to the paper's for the paper's shape.
    dims = _gpt(h, a)
    for tt, sp, rc in [
        (1, False, Recompute.NONE),
        (t, False, Recompute.NONE),
        (t, True, Recompute.NONE),
        (t, True, Recompute.SELECTIVE),
        (t, False, Recompute.SELECTIVE),
        (t, True, Recompute.FULL),
        (1, False, Recompute.FULL),
    ]:
        ours = layer_activation_bytes(dims, s, b, t=tt, sp=sp, recompute=rc)
        paper = korthikanti_layer_bytes(s, b, h, a, t=tt, sp=sp, recompute=rc)
        assert ours == pytest.approx(paper, rel=1e-12), (tt, sp, rc)


def test_activation_shape_effects() -> None:
    dims = _gpt(4096, 32)
    none = layer_activation_bytes(dims, 4096, 1)
    flash = layer_activation_bytes(dims, 4096, 1, flash=True)
    assert flash == layer_activation_bytes(dims, 4096, 1, recompute=Recompute.SELECTIVE)
    assert flash < none
    assert layer_activation_bytes(dims, 4096, 1, bytes_per_value=4) == 2 * none
    gqa = resolve_model(ModelSpec(layers=4, hidden=4096, heads=32, kv_heads=8, vocab=51200))
    assert layer_activation_bytes(gqa, 4096, 1) < none
    # 1F1B: the first stage holds p micro-batches; interleaving multiplies by 1 + (p-1)/(p*v).
    assert pipeline_in_flight(4, 32, PPSchedule.ONE_F_ONE_B, 1) == 4
    assert pipeline_in_flight(4, 2, PPSchedule.ONE_F_ONE_B, 1) == 2
    assert pipeline_in_flight(4, 32, PPSchedule.INTERLEAVED, 2) == pytest.approx(4 * (1 + 3 / 8))
    assert pipeline_in_flight(1, 32, PPSchedule.ONE_F_ONE_B, 1) == 1


def test_layout_effects_on_the_breakdown() -> None:
    dims = resolve_model(ModelSpec(preset="llama-2-7b"))

    def mem(**kw: object) -> object:
        base = {
            "strategy": Strategy.ZERO2,
            "framework": Framework.DEEPSPEED,
            "dp": 8,
            "zero_stage": 2,
        }
        base.update(kw)
        return estimate_memory(dims, LayoutDraft(**base), seq_len=4096, optimizer=Optimizer.ADAMW)  # type: ignore[arg-type]

    # ZeRO-1 keeps full 16-bit grads between accumulation boundaries; ZeRO-2 reduces each micro-step.
    z1 = mem(strategy=Strategy.ZERO1, zero_stage=1, grad_accum=4)
    assert mem(strategy=Strategy.ZERO1, zero_stage=1).grads == mem().grads  # type: ignore[attr-defined]
    z2 = mem(grad_accum=4)
    z3 = mem(strategy=Strategy.ZERO3, zero_stage=3)
    assert z1.total > z2.total > z3.total  # type: ignore[attr-defined]
    off = mem(strategy=Strategy.ZERO3, zero_stage=3, offload=Offload.OPTIMIZER_PARAMS)
    assert off.params == off.grads == off.optimizer == 0  # type: ignore[attr-defined]
    assert off.cpu_bytes > 0  # type: ignore[attr-defined]
    for m in (z1, z2, z3, off):
        assert m.total == m.params + m.grads + m.optimizer + m.activations + m.buffers  # type: ignore[attr-defined]
    # TP halves the weights; PP holds fewer layers' weights on the first stage; CP splits activations.
    a = mem(strategy=Strategy.THREE_D, framework=Framework.MEGATRON, zero_stage=0, dp=1)
    b = mem(
        strategy=Strategy.THREE_D,
        framework=Framework.MEGATRON,
        zero_stage=0,
        dp=1,
        tp=2,
        sequence_parallel=True,
    )
    c = mem(
        strategy=Strategy.THREE_D,
        framework=Framework.MEGATRON,
        zero_stage=0,
        dp=1,
        pp=4,
        grad_accum=16,
    )
    d = mem(strategy=Strategy.THREE_D, framework=Framework.MEGATRON, zero_stage=0, dp=1, cp=4)
    assert b.params == pytest.approx(a.params / 2, rel=0.01)  # type: ignore[attr-defined]
    assert b.activations == pytest.approx(a.activations / 2, rel=0.01)  # type: ignore[attr-defined]
    assert c.params < a.params / 3  # type: ignore[attr-defined]
    # 4 stages x 8 layers x 4 in flight = same activations as 32 layers x 1 (Korthikanti §4.2.3).
    assert c.activations == pytest.approx(a.activations, rel=0.01)  # type: ignore[attr-defined]
    assert d.activations == pytest.approx(a.activations / 4, rel=0.01)  # type: ignore[attr-defined]
    full = mem(recompute=Recompute.FULL)
    assert full.activations < z2.activations / 5  # type: ignore[attr-defined]


def test_expert_parallelism_divides_expert_weights() -> None:
    dims = resolve_model(ModelSpec(preset="mixtral-8x7b"))
    base = {"strategy": Strategy.THREE_D, "framework": Framework.MEGATRON, "dp": 8, "zero_stage": 0}
    m1 = estimate_memory(dims, LayoutDraft(**base), seq_len=4096, optimizer=Optimizer.ADAMW)  # type: ignore[arg-type]
    m8 = estimate_memory(dims, LayoutDraft(**base, ep=8), seq_len=4096, optimizer=Optimizer.ADAMW)  # type: ignore[arg-type]
    expert_share = dims.params_experts / dims.params_total
    assert m8.params == pytest.approx(m1.params * (1 - expert_share * 7 / 8), rel=0.01)


# ---------------------------------------------------------------------------------------------
# DeepSpeed's own estimators, called for real


def _parse_all_cold(text: str) -> list[tuple[float, str]]:
    """(per-GPU GiB, options) rows of DeepSpeed's ``*_all_cold`` printout."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"\s*([0-9.]+)GB \|\s*([0-9.]+)GB \| (.*)$", line)
        if m:
            rows.append((float(m.group(2)), m.group(3)))
    return rows


@pytest.fixture(scope="module")
def ds_estimators() -> tuple[object, object, object, object]:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero import stage3, stage_1_and_2

    return (
        stage_1_and_2.estimate_zero2_model_states_mem_needs_all_cold,
        stage3.estimate_zero3_model_states_mem_needs_all_cold,
        stage_1_and_2.estimate_zero2_model_states_mem_needs,
        stage3.estimate_zero3_model_states_mem_needs,
    )


SWEEP_MODELS = [
    "gpt2-xl",
    "llama-3.2-1b",
    "llama-2-7b",
    "llama-3-8b",
    "llama-2-13b",
    "llama-2-70b",
    "mixtral-8x7b",
]
SWEEP_GPUS = [(1, 1), (8, 1), (8, 4), (8, 16), (4, 2)]


def _ours(dims: ModelDims, n: int, stage: int, offload: Offload) -> float:
    st = model_states(
        dims.params_total,
        n,
        framework=Framework.DEEPSPEED,
        strategy=Strategy.ZERO2 if stage == 2 else Strategy.ZERO3,
        zero_stage=stage,
        precision=Precision.BF16,
        optimizer=Optimizer.ADAMW,
        offload=offload,
        largest_layer=largest_layer_params(dims),
    )
    # DeepSpeed's ZeRO-3 figure includes the gathered largest layer (4 bytes/param) too.
    return st.params + st.grads + st.optimizer + st.gathered


def test_deepspeed_estimators_agree_within_5_percent(ds_estimators: tuple[object, ...]) -> None:
    all_cold2, all_cold3, est2, est3 = ds_estimators
    checked = 0
    for name in SWEEP_MODELS:
        dims = resolve_model(ModelSpec(preset=name))
        ll = int(largest_layer_params(dims))
        for gpn, nodes in SWEEP_GPUS:
            n = gpn * nodes
            # The exact figures behind the printout.
            _, gpu2 = est2(dims.params_total, gpn, nodes, cpu_offload=False)  # type: ignore[operator]
            _, gpu2o = est2(dims.params_total, gpn, nodes, cpu_offload=True)  # type: ignore[operator]
            _, gpu3, _ = est3(
                dims.params_total, ll, gpn, nodes, cpu_offload=False, cpu_offload_params=False
            )  # type: ignore[operator]
            _, gpu3o, _ = est3(
                dims.params_total, ll, gpn, nodes, cpu_offload=True, cpu_offload_params=False
            )  # type: ignore[operator]
            _, gpu3op, _ = est3(
                dims.params_total, ll, gpn, nodes, cpu_offload=True, cpu_offload_params=True
            )  # type: ignore[operator]
            cases = [
                (gpu2, _ours(dims, n, 2, Offload.NONE)),
                (gpu2o, _ours(dims, n, 2, Offload.OPTIMIZER)),
                (gpu3, _ours(dims, n, 3, Offload.NONE)),
                (gpu3o, _ours(dims, n, 3, Offload.OPTIMIZER)),
                (gpu3op, _ours(dims, n, 3, Offload.OPTIMIZER_PARAMS)),
            ]
            for theirs, ours in cases:
                assert ours == pytest.approx(theirs, rel=0.05), (name, gpn, nodes, theirs, ours)
                checked += 1
            # And the functions the brief names, parsing what they print (GiB, 2 decimals).
            buf = io.StringIO()
            with redirect_stdout(buf):
                all_cold2(total_params=dims.params_total, num_gpus_per_node=gpn, num_nodes=nodes)  # type: ignore[operator]
                all_cold3(
                    total_params=dims.params_total,
                    largest_layer_params=ll,
                    num_gpus_per_node=gpn,
                    num_nodes=nodes,
                )  # type: ignore[operator]
            rows = _parse_all_cold(buf.getvalue())
            assert len(rows) == 8
            printed = {
                "z2-offload": rows[0][0],
                "z2": rows[1][0],
                "z3-offload-all": rows[2][0],
                "z3-offload-opt": rows[4][0],
                "z3": rows[6][0],
            }
            ours_gib = {
                "z2-offload": _ours(dims, n, 2, Offload.OPTIMIZER),
                "z2": _ours(dims, n, 2, Offload.NONE),
                "z3-offload-all": _ours(dims, n, 3, Offload.OPTIMIZER_PARAMS),
                "z3-offload-opt": _ours(dims, n, 3, Offload.OPTIMIZER),
                "z3": _ours(dims, n, 3, Offload.NONE),
            }
            for key, gib in printed.items():
                ours = ours_gib[key] / 1024**3
                assert math.isclose(ours, gib, rel_tol=0.05, abs_tol=0.006), (
                    name,
                    gpn,
                    nodes,
                    key,
                    gib,
                    ours,
                )
    assert checked == len(SWEEP_MODELS) * len(SWEEP_GPUS) * 5


def test_mlp_only_recompute_sits_between_none_and_full() -> None:
    # Partial recompute (Megatron-Core --recompute-modules mlp): the MLP's intermediates are not
    # kept, everything else is; one layer's MLP intermediates come back while it is recomputed.
    dims = resolve_model(ModelSpec(preset="llama-3-8b"))

    def acts(rc: Recompute) -> float:
        d = LayoutDraft(
            strategy=Strategy.THREE_D, framework=Framework.MEGATRON, tp=2, dp=4, recompute=rc
        )
        return estimate_memory(dims, d, seq_len=8192, optimizer=Optimizer.ADAMW).activations

    none, mlp, full = acts(Recompute.NONE), acts(Recompute.MLP), acts(Recompute.FULL)
    assert full < mlp < none
    # Llama 3 8B's gated MLP (f = 3.5h) holds about half of a layer's activations (TP2, no SP).
    assert mlp < 0.6 * none
    one_none = layer_activation_bytes(dims, 8192, 1, t=2, flash=True, dropout=False)
    one_mlp = layer_activation_bytes(
        dims, 8192, 1, t=2, flash=True, dropout=False, recompute=Recompute.MLP
    )
    assert one_none - one_mlp == pytest.approx(8192 * dims.ffn * 6 / 2)


def test_megatron_fused_cross_entropy_keeps_half_the_logit_bytes() -> None:
    # A 152K vocabulary: eager PyTorch keeps fp32 logits and their fp32 gradient (8 bytes a
    # logit), Megatron's fused vocab-parallel cross-entropy the 16-bit logits and one 16-bit
    # working copy (4 bytes).
    dims = resolve_model(
        ModelSpec(layers=4, hidden=2048, heads=16, vocab=151936, ffn=6144, gated_mlp=True)
    )
    meg = LayoutDraft(strategy=Strategy.THREE_D, framework=Framework.MEGATRON, tp=2, dp=4)
    fsdp = LayoutDraft(strategy=Strategy.FSDP_FULL, framework=Framework.FSDP, dp=8)
    m = estimate_memory(dims, meg, seq_len=4096, optimizer=Optimizer.ADAMW)
    f = estimate_memory(dims, fsdp, seq_len=4096, optimizer=Optimizer.ADAMW)
    assert m.buffers >= 4 * 4096 * 151936 / 2
    assert f.buffers >= 8 * 4096 * 151936
    assert m.buffers < f.buffers / 3


def test_stage_peaks_with_lighter_ends_and_interleaving() -> None:
    from engine.plan.stages import in_flight

    # Interleaving holds p + (p-1)/v micro-batches on the first stage, but never more than all m.
    assert in_flight(16, 64, 2, 0) == pytest.approx(16 + 15 / 2)
    assert in_flight(16, 16, 2, 0) == 16
    assert in_flight(16, 64, 1, 1) == 15
    dims = resolve_model(ModelSpec(preset="llama-3.1-405b"))

    def acts(first: int, last: int, v: int, m: int) -> float:
        d = LayoutDraft(
            strategy=Strategy.THREE_D,
            framework=Framework.MEGATRON,
            tp=8,
            pp=16,
            dp=64,
            zero_stage=1,
            micro_batch=1,
            grad_accum=m,
            sequence_parallel=True,
            precision=Precision.BF16,
            pp_schedule=PPSchedule.INTERLEAVED if v > 1 else PPSchedule.ONE_F_ONE_B,
            virtual_stages=v,
            first_stage_layers=first,
            last_stage_layers=last,
        )
        return estimate_memory(
            dims, d, seq_len=8192, optimizer=Optimizer.ADAMW, flash=True
        ).activations

    # 7/8x14/7: the second stage's 8 layers x 15 in flight outweigh the first's 7 x 16.
    assert acts(7, 7, 1, 32) == pytest.approx(acts(0, 0, 1, 32) * 15 / 16, rel=1e-6)
    # A lighter last stage leaves the peak on the first (8 layers); interleaving at m = p
    # holds no more than 1F1B.
    assert acts(0, 6, 2, 16) == pytest.approx(acts(0, 6, 1, 16))
    assert acts(0, 6, 2, 32) > acts(0, 6, 1, 32)


def test_fully_sharded_3d_shards_experts_over_their_own_mesh() -> None:
    # FSDP2 + EP (NeMo AutoModel): non-expert weights shard over DP x CP, experts over
    # DP x CP / EP after the EP split; the fp32 shards are the master (4 + 4 + 8 bytes, Adam).
    dims = resolve_model(
        ModelSpec(
            layers=48,
            hidden=2048,
            heads=32,
            kv_heads=4,
            vocab=151936,
            ffn=768,
            num_experts=128,
            experts_per_token=8,
            gated_mlp=True,
        )
    )

    def mem(zero: int, dp: int, ep: int) -> object:
        d = LayoutDraft(
            strategy=Strategy.THREE_D,
            framework=Framework.MEGATRON,
            dp=dp,
            ep=ep,
            zero_stage=zero,
            micro_batch=1,
            grad_accum=8,
            recompute=Recompute.FULL,
            precision=Precision.BF16,
        )
        return estimate_memory(dims, d, seq_len=4096, optimizer=Optimizer.ADAMW, flash=True)

    z2, z3 = mem(2, 8, 8), mem(3, 8, 8)
    # fp32 parameter shards replace the 16-bit copy and the fp32 master.
    assert z3.total < z2.total  # type: ignore[attr-defined]
    st = model_states(
        1e9,
        8,
        framework=Framework.MEGATRON,
        strategy=Strategy.THREE_D,
        zero_stage=3,
        precision=Precision.BF16,
        optimizer=Optimizer.ADAMW,
    )
    assert (st.params, st.grads, st.optimizer) == pytest.approx((0.5e9, 0.5e9, 1e9))
    # Twice the replicas for the same EP: the experts' states halve again.
    assert mem(3, 16, 8).optimizer < 0.6 * z3.optimizer  # type: ignore[attr-defined]


def test_fp8_linears_save_their_inputs_in_one_byte() -> None:
    # Transformer Engine keeps the FP8 cast of each linear layer's input for the weight
    # gradient: QKV's and the MLP's inputs (sbh each), the output projection's (q·sbh) and the
    # second MLP matrix's (sbf) take 1 byte instead of 2.
    dims = resolve_model(ModelSpec(preset="llama-3-70b"))
    s, b, t = 8192, 1, 4
    bf16 = layer_activation_bytes(dims, s, b, t=t, sp=True, flash=True, dropout=False)
    fp8 = layer_activation_bytes(
        dims, s, b, t=t, sp=True, flash=True, dropout=False, fp8_linears=True
    )
    sbh = s * b * dims.hidden
    q = dims.heads * dims.head_dim / dims.hidden
    saved = sbh / t * (2 + q + dims.ffn / dims.hidden)
    assert bf16 - fp8 == pytest.approx(saved)
    # Full recompute keeps only the layer input: nothing to save.
    full = {"t": t, "sp": True, "recompute": Recompute.FULL, "flash": True}
    assert layer_activation_bytes(dims, s, b, fp8_linears=True, **full) == (  # type: ignore[arg-type]
        layer_activation_bytes(dims, s, b, **full)  # type: ignore[arg-type]
    )


def test_fp16_megatron_keeps_fp16_grads_and_an_fp32_copy() -> None:
    """Megatron-LM's distrib_optimizer.md table: fp16 params and grads hold 20 B/param, 4 + 16/d
    with the distributed optimizer (bf16: 18 and 6 + 12/d). A 181B GPT at TP8 x PP2 x DP24
    (BigScience, 2022: nvidia-smi 76 GB on its first node) fits an 80 GB A100 with it; with
    fp32 grads it did not."""
    psi = 1e9
    kw = {
        "framework": Framework.MEGATRON,
        "strategy": Strategy.THREE_D,
        "optimizer": Optimizer.ADAMW,
    }
    plain = model_states(psi, 8, zero_stage=0, precision=Precision.FP16, **kw)  # type: ignore[arg-type]
    assert plain.params + plain.grads + plain.optimizer == pytest.approx(20 * psi)
    dist = model_states(psi, 8, zero_stage=1, precision=Precision.FP16, **kw)  # type: ignore[arg-type]
    assert dist.params + dist.grads + dist.optimizer == pytest.approx(4 * psi + 16 * psi / 8)
    bf16 = model_states(psi, 8, zero_stage=1, precision=Precision.BF16, **kw)  # type: ignore[arg-type]
    assert bf16.params + bf16.grads + bf16.optimizer == pytest.approx(6 * psi + 12 * psi / 8)

"""``dtrain-tui plan``: the planner without the TUI. Reads the spec from options or ``--spec FILE``
(see :mod:`cli.spec_options`), runs :func:`engine.plan.planner.plan`, and prints either a
readable report (summary, flowchart path with reasons, memory table for the recommended layout and
the alternatives, estimates, warnings) or, with ``--json``, the ``Plan.to_json_dict()`` object
documented in the README; exits 1 (after printing) when the layout does not fit, 2 on bad input.
Imports no torch: it must answer in well under half a second."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TextIO

from cli.spec_options import add_spec_options, spec_from_args
from engine.plan.names import Precision, Recompute
from engine.plan.result import Layout, Plan

GIB = 1024**3


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="plan the parallel layout for a model on a cluster",
        description=(
            "Walk the decision flowchart for a model, machines and training set-up; search nearby "
            "layouts; print the recommendation with its reasons, memory per GPU and estimates."
        ),
    )
    add_spec_options(p)
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.plan.planner import plan

    spec = spec_from_args(args)
    result = plan(spec)
    if args.json:
        json.dump(result.to_json_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render(result, sys.stdout, forcing=_forcing(result))
    # Scripts can gate on it: 1 when the recommended (or forced) layout does not fit.
    return 0 if result.recommended.fits else 1


def _forcing(forced: Plan) -> str:
    """With a forced layout: the auto plan of the same spec and what forcing costs ("" when
    nothing is forced)."""
    if not forced.forced:
        return ""
    from engine.errors import SpecError, one_line
    from engine.plan.annotate import forcing_cost
    from engine.plan.planner import plan
    from engine.plan.specs import LayoutSpec

    try:
        auto = plan(forced.spec.model_copy(update={"layout": LayoutSpec()}))
    except SpecError as e:
        return forcing_cost(forced, None, one_line(e))
    return forcing_cost(forced, auto)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f}"


def _count(n: float) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


def _duration(s: float) -> str:
    """A time as the plan's step times read (``84 ms``, ``57.1 s``, ``2.0 min``)."""
    from engine.plan.annotate import step_time_text

    return step_time_text(s).removesuffix("/step")


def render(p: Plan, out: TextIO, *, forcing: str = "") -> None:
    """The human report; ``forcing``: the line that says what a forced layout costs."""
    w = out.write
    _render_setup(p, w)
    _render_recommendation(p, w, forcing)
    w("\nDecision path\n")
    for i, s in enumerate(p.path, 1):
        w(f"  {i}. {s.question}\n     -> {s.answer}: {s.reason}\n")
    _render_memory_table(p, w)
    _render_closing_sections(p, w)


def _render_setup(p: Plan, w: Callable[[str], object]) -> None:
    """The Model, Hardware, Training (and Estimates) lines, then a blank line."""
    from engine.plan.models import architecture_notes

    m = p.model
    r = p.recommended
    moe = f", MoE {m.num_experts}x top-{m.experts_per_token}" if m.is_moe else ""
    notes = "".join(f", {n}" for n in architecture_notes(m))
    w(
        f"Model     {m.name}: {_count(m.params_total)} params ({_count(m.params_active)} active{moe}), "
        f"{m.layers} layers, hidden {m.hidden}, {m.heads} heads ({m.kv_heads} kv), vocab {m.vocab}"
        f"{notes}\n"
    )
    w(
        f"Hardware  {p.nodes} node(s) x {p.gpus_per_node} {p.gpu.name} = {p.world_size} "
        f"({_gib(p.gpu.memory_bytes)} GiB each, {p.gpu.dist_backend})\n"
    )
    t = p.spec.training
    precision = r.precision.value
    if t.fp8_recipe and r.precision == Precision.FP8:
        precision += f" ({t.fp8_recipe.value})"
    w(
        f"Training  seq {t.seq_len}, global batch {t.global_batch}, {precision}, "
        f"{t.optimizer.value}\n"
        + (f"Estimates {p.calibration.label()}\n" if p.calibration is not None else "")
        + "\n"
    )


def _render_recommendation(p: Plan, w: Callable[[str], object], forcing: str) -> None:
    """The recommended (or forced) layout: its batch split, step time, budget and notes."""
    from engine.plan.annotate import describe, recompute_text

    r = p.recommended
    t = p.spec.training
    status = p.margin_text()
    label = "Forced" if p.forced else "Plan"
    w(f"{label}: {describe(r)}  [{status}]\n")
    if forcing:
        w(f"  {forcing}\n")
    w(
        f"  micro-batch {r.micro_batch} x grad-accum {r.grad_accum} x dp {r.dp} = global batch "
        f"{r.global_batch}; {recompute_text(r)}"
        + ("; sequence parallel" if r.sequence_parallel else "")
        + ("; expert all-to-all overlapped" if r.a2a_overlap else "")
        + "\n"
    )
    w(
        f"  step {_duration(r.step_time_s)} (compute {_duration(r.compute_time_s)}, exposed comm "
        f"{_duration(r.comm_time_s)}, bubble {r.bubble_fraction:.0%}), {r.tokens_per_s:,.0f} tokens/s, "
        f"MFU (Megatron convention) {r.mfu:.0%}, scaling efficiency {r.scaling_efficiency:.0%}\n"
    )
    if r.gpu_hours is not None:
        cost = f", ${r.cost_usd:,.0f}" if r.cost_usd is not None else ""
        w(f"  token budget {_count(t.tokens or 0)}: {r.gpu_hours:,.0f} GPU-hours{cost}\n")
    for n in r.notes:
        w(f"  note: {n}\n")


def _render_memory_table(p: Plan, w: Callable[[str], object]) -> None:
    """Memory per GPU for the recommended layout (starred) and each alternative."""
    from engine.plan.annotate import describe

    r = p.recommended
    w("\nMemory per GPU (GiB)\n")
    rows: list[tuple[str, Layout]] = [("* " + describe(r), r)] + [
        ("  " + describe(a), a) for a in p.alternatives
    ]
    width = max(len(name) for name, _ in rows)
    cols = ("params", "grads", "optim", "activ", "buffers", "nccl", "total", "fits", "step")
    w(f"  {'layout':<{width}} " + " ".join(f"{c:>8}" for c in cols) + "\n")
    for name, lay in rows:
        mb = lay.memory_per_gpu
        vals = [
            _gib(v)
            for v in (
                mb.params,
                mb.grads,
                mb.optimizer,
                mb.activations,
                mb.buffers,
                mb.nccl,
                mb.total,
            )
        ]
        vals.append("yes" if lay.fits else "no")
        vals.append(_duration(lay.step_time_s) if lay.fits else "-")
        w(f"  {name:<{width}} " + " ".join(f"{v:>8}" for v in vals) + "\n")
    kept = f"; {_gib(p.headroom_bytes)} GiB more kept free" if p.headroom_bytes else ""
    w(f"  (usable: {_gib(p.usable_bytes)} GiB of {_gib(p.gpu.memory_bytes)}{kept})\n")


def _render_closing_sections(p: Plan, w: Callable[[str], object]) -> None:
    """What failures cost, the alternatives with why each lost, and the warnings (each only when
    there is something to say)."""
    from engine.plan.annotate import describe

    if p.resilience is not None:
        from engine.plan.resilience import summary_lines

        w("\nWhat failures cost\n")
        for line in summary_lines(p.resilience):
            w(f"  {line}\n")
    if p.alternatives:
        w("\nAlternatives\n")
        for a in p.alternatives:
            w(f"  {describe(a)}{_recompute_note(a)}: {a.rejected_because}\n")
    if p.warnings:
        w("\nWarnings\n")
        for x in p.warnings:
            w(f"  ! {x}\n")


def _recompute_note(lay: Layout) -> str:
    """``, recompute full (the first 1 layers of each model chunk)``: what an alternative
    recomputes (empty for none), which its name does not say."""
    from engine.plan.annotate import recompute_text

    return "" if lay.recompute == Recompute.NONE else f", {recompute_text(lay)}"

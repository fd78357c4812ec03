"""What each :class:`~engine.plan.names.Strategy` means to the planner: the framework that runs
it, its ZeRO stage, what it can offload, how simple it is and its display name. Read by the
forced-layout checks (:mod:`engine.plan.forced`), the candidate search (:mod:`engine.plan.search`)
and the narration (:mod:`engine.plan.annotate`): one table per fact, so they never disagree.
"""

from __future__ import annotations

from engine.plan.names import Framework, Offload, Strategy

FRAMEWORK_OF = {
    Strategy.DDP: Framework.DDP,
    Strategy.ZERO1: Framework.DEEPSPEED,
    Strategy.ZERO2: Framework.DEEPSPEED,
    Strategy.ZERO3: Framework.DEEPSPEED,
    Strategy.FSDP_FULL: Framework.FSDP,
    Strategy.FSDP_GRAD_OP: Framework.FSDP,
    Strategy.FSDP_HYBRID: Framework.FSDP,
    Strategy.THREE_D: Framework.MEGATRON,
}
"""The framework a strategy runs on when none is forced."""
ZERO_STAGE_OF = {
    Strategy.DDP: 0,
    Strategy.ZERO1: 1,
    Strategy.ZERO2: 2,
    Strategy.ZERO3: 3,
    Strategy.FSDP_FULL: 3,
    Strategy.FSDP_GRAD_OP: 2,
    Strategy.FSDP_HYBRID: 3,
}
"""The ZeRO stage a data-parallel strategy amounts to (3D picks its own: the distributed
optimizer or not)."""
STRATEGIES_OF = {
    Framework.DDP: (Strategy.DDP,),
    Framework.DEEPSPEED: (Strategy.DDP, Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3),
    Framework.FSDP: (Strategy.FSDP_GRAD_OP, Strategy.FSDP_FULL, Strategy.FSDP_HYBRID),
    Framework.MEGATRON: (Strategy.THREE_D,),
}
"""The strategies a framework can run."""
# What each strategy can offload: ZeRO-Offload (stage 2/3), ZeRO-Infinity to CPU (stage 3),
# FSDP's CPUOffload (params, grads and optimizer together).
OFFLOADS_OF = {
    Strategy.DDP: (Offload.NONE,),
    Strategy.ZERO1: (Offload.NONE,),
    Strategy.ZERO2: (Offload.NONE, Offload.OPTIMIZER),
    Strategy.ZERO3: (Offload.NONE, Offload.OPTIMIZER, Offload.OPTIMIZER_PARAMS),
    Strategy.FSDP_FULL: (Offload.NONE, Offload.OPTIMIZER_PARAMS),
    Strategy.FSDP_GRAD_OP: (Offload.NONE,),
    Strategy.FSDP_HYBRID: (Offload.NONE,),
    Strategy.THREE_D: (Offload.NONE,),
}
# Preference among equally fast layouts: simpler first (dtrain-tui's flowchart: "start simple").
SIMPLICITY = {
    Strategy.DDP: 0,
    Strategy.ZERO2: 1,
    Strategy.FSDP_GRAD_OP: 2,
    Strategy.ZERO1: 3,
    Strategy.FSDP_FULL: 4,
    Strategy.ZERO3: 5,
    Strategy.FSDP_HYBRID: 6,
    Strategy.THREE_D: 7,
}
DISPLAY_NAME = {
    Strategy.DDP: "DDP",
    Strategy.ZERO1: "ZeRO-1",
    Strategy.ZERO2: "ZeRO-2",
    Strategy.ZERO3: "ZeRO-3",
    Strategy.FSDP_FULL: "FSDP FULL_SHARD",
    Strategy.FSDP_GRAD_OP: "FSDP SHARD_GRAD_OP",
    Strategy.FSDP_HYBRID: "FSDP HYBRID_SHARD",
    Strategy.THREE_D: "3D",
}
"""How a plan's text names a strategy."""

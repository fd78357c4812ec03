"""Planning: what the user asks for (``specs``), what hardware and models are (``catalog``,
``models``), what a layout costs (``memory``, ``perf``) and the planner that walks the flowchart
(``planner``) to a frozen :class:`engine.plan.result.Plan`. Imports only ``engine.errors``."""

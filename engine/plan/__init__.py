"""Planning: what the user asks for (``specs``), what hardware and models are (``catalog``,
``models``), what a layout costs (``memory``, ``perf``) and the planner (``planner.plan``) that
goes to a frozen :class:`engine.plan.result.Plan` through its steps: the facts it works from
(``context``, ``strategies``), the forced-layout checks (``forced``), the candidate search
(``search``), the flowchart walk (``flowchart``) and the narration (``annotate``). Imports only
``engine.errors``."""

"""dtrain-tui's pure core: specs, catalog, model resolution, the memory / time model, the planner
(the flowchart), config writers, launch backends and log parsing.

Nothing here imports textual or rich, and torch, deepspeed, sky and paramiko are imported inside
the functions that need them, never at import time (tests/engine/test_purity.py proves it).
"""

__version__ = "0.1.0"

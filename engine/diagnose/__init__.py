"""Diagnosing a cluster and a run: the preflight's measurements and verdicts (``preflight``),
NCCL's chosen transport against the plan (``transport``), and the stuck rank named from every
rank's Flight Recorder dump (``flight``). Pure analysis over text and JSON; testable without
torch or Textual. Used by monitor and launch; uses rundir, write and plan."""

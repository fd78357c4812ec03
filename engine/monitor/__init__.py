"""Watching a run: the event a backend emits (``events``), what a log line means (``logparse``),
each rank's state (``state``), reading a run directory back (``tail``) and making untrusted text
safe for a terminal (``textsafe``). Testable without Textual; imports ``engine.plan`` for nothing."""

"""Watching a run: the events a backend emits (``events``), what a log line means
(``logparse``), each rank's state (``state``), reading a run directory back (``tail``), the
batching reader that feeds a screen without flooding it (``reader``) and making untrusted text
safe for a terminal (``textsafe``). Testable without Textual."""

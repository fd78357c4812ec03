"""The run directory: the contract between a launch backend (which writes it) and every reader
(the monitor, ``monitor RUN_DIR``, the reaper). ``files``: its layout and the writer of its logs
and ``run.json``; ``launcher``: whether the launcher that owns the run is still alive, and the stop
request a monitor leaves for it. Imports only ``engine.errors``, ``engine.fsio`` and the bundle
manifest's bounds."""

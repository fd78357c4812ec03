"""The docs' pictures (``docs/screenshots.py``, ``make screenshots``): the GPU panel's canned run
feeds the monitor the telemetry lines the rank agent really prints, the picture comes out the
same byte for byte every time, and every picture under ``docs/images/`` is one the script makes
and a page shows."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from engine.monitor.machines import all_flags, machines
from engine.monitor.state import MonitorState
from engine.monitor.telemetry import parse_telemetry_line

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
GIB = 1024**3


def _screenshots() -> ModuleType:
    """docs/screenshots.py, a script rather than a package module, loaded by its path."""
    name = "dtrain_docs_screenshots"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "screenshots.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_the_gpu_runs_telemetry_is_the_agents_and_healthy() -> None:
    shots = _screenshots()
    world = 2 * shots.GPUS_PER_NODE
    samples = [parse_telemetry_line(shots.telemetry_line(r)) for r in range(world)]
    assert all(t is not None and t.gpu is not None for t in samples)
    t = samples[9]
    assert t is not None and t.gpu is not None
    assert (t.rank, t.node, t.host, t.gpu.index) == (9, 1, "gpu-1", "1")
    g = t.gpu
    assert g.name == "NVIDIA H100 80GB HBM3" and g.power_limit_w == 700.0  # mW read as W
    assert g.mem_total_bytes is not None and round(g.mem_total_bytes / GIB, 1) == 79.6
    assert g.throttle == () and g.sm_clock_mhz == 1980
    state = MonitorState(world)
    for batch in shots.healthy_gpu_run(world):
        for ev in batch:
            if hasattr(ev, "lines"):
                state.ingest_lines(ev.rank, ev.node, list(ev.lines), now=shots.CLOCK)
    state.evaluate(shots.CLOCK)
    nodes = machines(state.ranks)
    assert [len(n.rows) for n in nodes] == [8, 8]
    assert all(row.sampled and row.gpu for n in nodes for row in n.rows)
    assert all_flags(nodes) == []  # a healthy run: nothing hot, throttled or behind its peers


def test_the_gpu_picture_is_the_same_twice(tmp_path: Path) -> None:
    shots = _screenshots()
    pictures = []
    for run in ("first", "second"):
        (tmp_path / run).mkdir()
        pictures.append(asyncio.run(shots.monitor_gpus(tmp_path / run)).read_bytes())
    first, second = pictures
    assert first == second
    text = first.decode().replace("&#160;", " ")
    assert "machines: 16 GPU(s) on 2 node(s)<" in text  # no flag counted
    assert re.search(r"plan&#x27;s estimate: [0-9.]+ GiB per GPU", text)  # the marked bars
    assert "dtrain-screenshot-" not in text  # the scratch run directory is never shown


def test_the_charts_picture_is_the_same_twice_and_flags_the_slow_rank(tmp_path: Path) -> None:
    shots = _screenshots()
    pictures = []
    for run in ("first", "second"):
        (tmp_path / run).mkdir()
        pictures.append(asyncio.run(shots.monitor_charts(tmp_path / run)).read_bytes())
    first, second = pictures
    assert first == second
    text = first.decode().replace("&#160;", " ")
    assert "step time (s)" in text and "tokens/s" in text  # the three charts' titles
    assert text.count("SLOW") >= 1  # rank 2, about 60 % slower than its peers
    state = MonitorState(4)
    for batch in shots.charted_run(4):
        for ev in batch:
            if hasattr(ev, "lines"):
                state.ingest_lines(ev.rank, ev.node, list(ev.lines), now=shots.CLOCK)
    state.evaluate(shots.CLOCK)
    assert [r for r, st in sorted(state.ranks.items()) if st.straggler] == [2]


def test_every_picture_is_made_by_the_script_and_shown() -> None:
    script = (ROOT / "docs" / "screenshots.py").read_text()
    pages = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
    svgs = sorted(p.name for p in IMAGES.glob("*.svg"))
    assert "monitor-gpus.svg" in svgs
    for name in svgs:
        assert f'"{name}"' in script, f"docs/images/{name} is not made by docs/screenshots.py"
        assert re.search(rf"\(\S*images/{re.escape(name)}\)", pages), f"no page shows {name}"

"""SSH fan-out: time for the SSH backend to connect to every node, send it the bundle and start
each node's script, for 1 node and for 8 nodes (8 real sshd on 127.0.0.1, 8 ports).

"Start" is the whole of ``SshBackend.start()``: connect (key exchange, host key check, auth),
start the node wrapper on one exec channel, send the bundle tar on its stdin, wait until every
node has unpacked it and reports ready, then tell every node "go". Nodes are handled in
parallel, so 8 nodes should take well under 1.5x one node. The node scripts only print a line
and exit (this measures the launch path, not training). Each node's account has a home of its
own (tests/e2e/sshd.py), as a fresh cluster account would: this machine's ~/.bashrc is not run
per session. All 8 servers share this machine's cores with the client, which real nodes do not:
on a 2-core machine the 8-node start is bound by the CPU of 8 sshd, their shells and the client
together (the line before the last gives the load). Each figure is the median of several
rounds, 1 node and 8 nodes alternating.
Last line: ``one_node_s=.. eight_nodes_s=.. ratio=..``.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.launch import LaunchOptions  # noqa: E402
from engine.launch.ssh import SshBackend  # noqa: E402
from engine.plan.specs import Host  # noqa: E402
from tests.e2e.launch_util import collect, make_bundle  # noqa: E402
from tests.e2e.sshd import sshd_path, start_many  # noqa: E402

ROUNDS = 9


def _time_start(work: Path, servers: list, key: Path, kh: Path, n: int, tag: str) -> float:
    b = make_bundle(work / f"bundle{n}-{tag}", nodes=n, gpus_per_node=1)
    for i in range(n):
        (b / f"launch_node{i}.sh").write_text("#!/usr/bin/env bash\necho '[default0]:hello'\n")
    opts = LaunchOptions(
        hosts=[Host.parse(f"127.0.0.1:{s.port}") for s in servers[:n]],
        identity_file=key,
        known_hosts=kh,
        remote_workdir=str(work / "remote"),
        hang_timeout_s=60,
    )
    backend = SshBackend(b, work / f"run{n}-{tag}", opts)
    backend.start()
    collect(backend, timeout=60)
    assert backend.state == "succeeded", backend.run.record.reason
    assert backend.start_time_s is not None
    return backend.start_time_s


def main() -> int:
    if sshd_path() is None:
        print("sshd is not installed (make system-deps)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="dtrain-fanout-") as tmp:
        work = Path(tmp)
        servers, key, kh = start_many(work, 8)
        try:
            _time_start(work, servers, key, kh, 8, "warm")  # warm caches and sshd
            ones, eights = [], []
            for r in range(ROUNDS):
                ones.append(_time_start(work, servers, key, kh, 1, str(r)))
                eights.append(_time_start(work, servers, key, kh, 8, str(r)))
        finally:
            for s in servers:
                s.stop()
    one, eight = statistics.median(ones), statistics.median(eights)
    print(f"1 node:  {', '.join(f'{t:.3f}' for t in ones)} s")
    print(f"8 nodes: {', '.join(f'{t:.3f}' for t in eights)} s")
    print(f"cpus={os.cpu_count()} load1={os.getloadavg()[0]:.2f} rounds={ROUNDS}")
    print(f"one_node_s={one:.3f} eight_nodes_s={eight:.3f} ratio={eight / one:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

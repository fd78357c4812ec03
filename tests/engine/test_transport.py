"""The NCCL transport check (engine.diagnose.transport, fed by engine.monitor.logparse): the three
real shared logs against their ground truth (tests/data/logs/README.md), lines built from the
formats documented there for every other finding, expectations read from real bundles, and
run.json's ``transport`` entry as the launcher writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.diagnose.nccl_facts import (
    NODE_LINE_BUDGET,
    TransportNotes,
    nccl_transport_facts,
    scan_transport,
)
from engine.diagnose.transport import (
    FactKind,
    FindingKind,
    NcclFact,
    Severity,
    TransportCheck,
    TransportExpectation,
    TransportReport,
    ifname_matches,
    parse_env_file,
)
from engine.launch.transport_watch import TransportWatch
from engine.monitor.state import MonitorState
from engine.monitor.transport_feed import check_log
from engine.plan.names import NetworkTier
from engine.plan.planner import plan
from engine.plan.specs import Spec
from engine.rundir.events import LineBatch
from engine.rundir.files import RunDir, read_run
from engine.rundir.record import RunRecord
from engine.write.bundle import write_bundle

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "tests" / "data" / "logs"
IB_LOG = LOGS / "01_ib_multinode_vllm_ray_prefixed.log"
SOCKET_LOG = LOGS / "02_socket_fallback_vllm_ray_ansi.log"
EFA_LOG = LOGS / "04_efa_ofi_nccltests_openmpi_prefixed.log"
SOCKET_HOSTS = ("deepseek-v2-5-0", "deepseek-v2-5-0-1")


def log_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


def bundle(tmp: Path, network: str, *, nodes: int = 2, gpu: str = "h100", **launch: object) -> Path:
    """A real bundle written by the writers for a ``nodes`` x 8 plan on ``network``."""
    spec = Spec.model_validate(
        {
            "model": {"preset": "llama-3-8b"},
            "hardware": {"gpu": gpu, "gpus_per_node": 8 if gpu != "cpu" else 2, "nodes": nodes},
            "network": {"tier": network},
            "training": {"seq_len": 2048, "global_batch": 64 * nodes},
            "launch": launch,
        }
    )
    out = tmp / f"bundle-{network}-{nodes}-{gpu}"
    write_bundle(plan(spec), out)
    return out


@pytest.fixture(scope="module")
def ib_plan(tmp_path_factory: pytest.TempPathFactory) -> TransportExpectation:
    return TransportExpectation.load(bundle(tmp_path_factory.mktemp("ib"), "ib"))


@pytest.fixture(scope="module")
def efa_plan(tmp_path_factory: pytest.TempPathFactory) -> TransportExpectation:
    return TransportExpectation.load(bundle(tmp_path_factory.mktemp("efa"), "efa"))


def kinds(report: TransportReport) -> list[FindingKind]:
    return [f.kind for f in report.findings]


def nccl(host: str, text: str) -> str:
    """A line in NCCL's own format: ``host:pid:tid [dev] NCCL INFO text``."""
    return f"{host}:4242:4242 [0] NCCL INFO {text}"


def two_nodes(*per_node: list[str], expect: TransportExpectation | None = None) -> TransportReport:
    """Lines of node 0, node 1… fed as a live run feeds them (node index, host)."""
    notes = TransportNotes(expect)
    for i, lines in enumerate(per_node):
        notes.feed(i, f"gpu-{i}", lines)
    return notes.report()


def tcp(nodes: int = 2) -> TransportExpectation:
    return TransportExpectation(tier=NetworkTier.TCP, nodes=nodes, dist_backend="nccl")


# ---- the three real logs against their ground truth -------------------------------------------


def test_socket_fallback_log_is_flagged_as_infiniband_planned_socket_chosen(
    ib_plan: TransportExpectation,
) -> None:
    assert ib_plan.tier == NetworkTier.IB and ib_plan.expected_net == "IB" and ib_plan.nodes == 2
    report = check_log(log_lines(SOCKET_LOG), ib_plan)
    assert kinds(report) == [FindingKind.NETWORK_MISMATCH]
    top = report.findings[0]
    assert top.title == "plan assumes InfiniBand, NCCL chose Socket"
    assert top.severity is Severity.ERROR and top.nodes == SOCKET_HOSTS
    # The cause is the evidence both nodes printed: no IB device visible.
    assert top.causes[0].startswith("`NET/IB : No device found` on deepseek-v2-5-0, deepseek")
    assert "/dev/infiniband" in top.causes[0] and "ibv_devinfo" in top.causes[0]
    assert report.headline() == "⚠ plan assumes InfiniBand, NCCL chose Socket"
    assert report.chosen == ("Socket",) and not report.ok
    for host in SOCKET_HOSTS:
        node = report.nodes[host]
        assert node["network"] == "Socket" and node["ib_no_device"] is True
        assert node["socket_ifaces"] == ["eth0"] and node["bootstrap_ifaces"] == ["eth0"]
    assert report.to_json()["verdict"] == "mismatch"


def test_ib_log_is_not_flagged_and_shows_gdrdma_on_both_nodes(
    ib_plan: TransportExpectation,
) -> None:
    report = check_log(log_lines(IB_LOG), ib_plan)
    assert report.findings == () and report.ok and report.headline() == ""
    assert report.chosen == ("IB",)
    assert set(report.nodes) == set(SOCKET_HOSTS)
    for node in report.nodes.values():
        assert node["gdrdma"] is True and node["network"] == "IB"
        assert node["ib_devices"] == [f"mlx5_{i}:1/IB" for i in range(8)]
        assert node["env"]["NCCL_IB_DISABLE"] == "0"
    assert report.to_json()["verdict"] == "ok"


def test_efa_log_is_not_flagged(efa_plan: TransportExpectation) -> None:
    assert efa_plan.expected_net == "AWS Libfabric"
    report = check_log(log_lines(EFA_LOG), efa_plan)
    assert report.findings == ()
    assert report.chosen == ("AWS Libfabric",)
    assert sorted(report.nodes) == ["nccl-tests-efa-16-worker-0", "nccl-tests-efa-16-worker-1"]
    for node in report.nodes.values():
        assert node["gdrdma"] is True and "OFI" in node["plugins"]


def test_the_same_logs_judged_against_another_plan_are_flagged(
    efa_plan: TransportExpectation,
) -> None:
    # The check can fail: the IB log under an EFA plan, the socket log under a TCP plan is fine.
    ib_under_efa = check_log(log_lines(IB_LOG), efa_plan)
    assert [f.title for f in ib_under_efa.findings] == ["plan assumes AWS EFA, NCCL chose IB"]
    assert check_log(log_lines(SOCKET_LOG), tcp()).findings == ()
    # Without a plan there is nothing to compare the network with: only facts.
    assert check_log(log_lines(SOCKET_LOG)).findings == ()


# ---- findings from lines built from the documented formats -----------------------------------


def test_efa_expected_but_socket_names_the_missing_ofi_plugin(
    efa_plan: TransportExpectation,
) -> None:
    lines = [
        nccl(
            "ip-1",
            "NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: "
            "cannot open shared object file: No such file or directory",
        ),
        nccl("ip-1", "NET/Plugin : No plugin found, using internal implementation"),
        nccl("ip-1", "NET/IB : No device found."),
        nccl("ip-1", "NET/Socket : Using [0]ens5:10.0.1.5<0>"),
        nccl("ip-1", "Using network Socket"),
    ]
    report = two_nodes(lines, [x.replace("ip-1", "ip-2") for x in lines], expect=efa_plan)
    top = report.findings[0]
    assert top.title == "plan assumes AWS EFA, NCCL chose Socket"
    assert top.nodes == ("node 0 (gpu-0)", "node 1 (gpu-1)")
    assert "aws-ofi-nccl" in top.causes[0] and "cannot open shared object file" in top.causes[0]
    assert "fi_info -p efa" in top.causes[-1]


def test_interfaces_that_differ_across_nodes_are_flagged() -> None:
    a = [nccl("a", "NET/Socket : Using [0]eth0:10.0.0.1<0>"), nccl("a", "Using network Socket")]
    b = [nccl("b", "NET/Socket : Using [0]ens5:10.0.0.2<0>"), nccl("b", "Using network Socket")]
    report = two_nodes(a, b, expect=tcp())
    assert kinds(report) == [FindingKind.IFACES_DIFFER]
    f = report.findings[0]
    assert f.severity is Severity.WARNING and "node 0 (gpu-0): eth0" in f.causes[0]
    assert "node 1 (gpu-1): ens5" in f.causes[0]
    # The same interface everywhere is fine.
    assert two_nodes(a, [x.replace("a:", "b:") for x in a], expect=tcp()).findings == ()


@pytest.mark.parametrize("iface", ["lo", "docker0", "veth6163fba", "br-05ab815fa14e"])
def test_loopback_or_docker_interface_between_nodes_is_flagged(iface: str) -> None:
    lines = [
        nccl("h", f"Bootstrap : Using {iface}:172.17.0.1<0>"),
        nccl("h", f"NET/Socket : Using [0]{iface}:172.17.0.1<0>"),
        nccl("h", "Using network Socket"),
    ]
    report = two_nodes(lines, lines, expect=tcp())
    want = FindingKind.LOOPBACK_IFACE if iface == "lo" else FindingKind.DOCKER_IFACE
    assert kinds(report) == [want]
    assert "NCCL_SOCKET_IFNAME" in report.findings[0].fix
    # On one node nothing crosses machines: lo is what NCCL should use there.
    assert two_nodes(lines, expect=tcp(nodes=1)).findings == ()


def test_ifname_set_to_an_interface_nccl_did_not_find_is_flagged() -> None:
    # NVIDIA/nccl#1837: the only hint is torch's "Last error" line after the set-by-env lines.
    lines = [
        "h:1958:1958 [3] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth2",
        "h:1958:1958 [3] NCCL INFO NCCL_SOCKET_IFNAME set to eth2",
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
        "internal error - please report this issue to the NCCL developers, NCCL version 2.27.7",
        "ncclInternalError: Internal check failed.",
        "Last error:",
        "ncclSocketInit: connecting to address  with family 59936 is neither AF_INET(2) nor "
        "AF_INET6(10)",
    ]
    report = two_nodes(lines, expect=tcp())
    assert kinds(report) == [FindingKind.IFNAME_NOT_FOUND]
    f = report.findings[0]
    assert f.title == "NCCL_SOCKET_IFNAME=eth2 names no interface NCCL could use"
    assert "nccl#1837" in f.causes[0] and "ip -br addr" in f.fix
    # Newer NCCL says it in a WARN line; no IFNAME known: a plainer title.
    warn = ["h:1:1 [0] NCCL WARN Bootstrap : no socket interface found"]
    assert two_nodes(warn).findings[0].title == "NCCL found no socket interface to use"


def test_ib_disabled_by_the_environment_is_the_likely_cause_and_overrides_nccl_env(
    ib_plan: TransportExpectation,
) -> None:
    assert ib_plan.nccl_env["NCCL_IB_DISABLE"] == "0"
    lines = [
        nccl("h", "NCCL_IB_DISABLE set by environment to 1."),
        nccl("h", "NET/Socket : Using [0]eth0:10.0.0.1<0>"),
        nccl("h", "Using network Socket"),
    ]
    report = two_nodes(lines, lines, expect=ib_plan)
    assert kinds(report) == [FindingKind.NETWORK_MISMATCH, FindingKind.ENV_OVERRIDE]
    assert report.findings[0].causes[0].startswith("NCCL_IB_DISABLE=1 (NCCL saw it on node 0")
    assert "NCCL_IB_DISABLE=1 (nccl.env: 0)" in report.findings[1].title


def test_skypilot_without_network_tier_best_is_named(tmp_path: Path) -> None:
    b = bundle(tmp_path, "ib", backend="skypilot")
    sky = (b / "sky.yaml").read_text()
    assert "network_tier: best" in sky
    assert TransportExpectation.load(b).sky_network_tier_best is True
    (b / "sky.yaml").write_text(sky.replace("network_tier: best", "disk_size: 256"))
    expect = TransportExpectation.load(b)
    assert expect.backend == "skypilot" and expect.sky_network_tier_best is False
    lines = [nccl("h", "Using network Socket")]
    causes = two_nodes(lines, lines, expect=expect).findings[0].causes
    assert any("lacks `resources.network_tier: best`" in c for c in causes)


def test_gloo_plans_and_single_node_plans_are_not_judged(tmp_path: Path) -> None:
    cpu = TransportExpectation.load(bundle(tmp_path, "ib", gpu="cpu"))
    assert cpu.dist_backend == "gloo"
    lines = [nccl("h", "Using network Socket"), nccl("h", "Bootstrap : Using lo:127.0.0.1<0>")]
    assert two_nodes(lines, lines, expect=cpu).findings == ()
    one = TransportExpectation.load(bundle(tmp_path, "ib", nodes=1))
    assert one.nodes == 1 and two_nodes(lines, expect=one).findings == ()


def test_channels_without_gdrdma_are_a_note() -> None:
    lines = [
        nccl("h", "Using network IB"),
        nccl("h", "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0"),
    ]
    expect = TransportExpectation(tier=NetworkTier.IB, nodes=2, dist_backend="nccl")
    report = two_nodes(lines, lines, expect=expect)
    assert kinds(report) == [FindingKind.NO_GDRDMA] and report.ok
    assert report.headline().startswith("ⓘ no GPUDirect RDMA")


# ---- parsing, matching, loading --------------------------------------------------------------


def test_transport_facts_of_each_documented_format() -> None:
    F = FactKind
    cases = {
        "NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>": [
            NcclFact(F.IB_DEVICE, "mlx5_0:1/RoCE"),
            NcclFact(F.IB_DEVICE, "mlx5_1:1/RoCE"),
        ],
        "NET/IBext_v8 : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>": [
            NcclFact(F.IB_DEVICE, "mlx5_0:1/IB"),
            NcclFact(F.PLUGIN, "IBext"),
        ],
        "NET/Socket : Using [0]bond0:192.168.1.161<0> [1]veth6163fba:fe80::b878%veth6163fba<0>": [
            NcclFact(F.SOCKET_IFACE, "bond0"),
            NcclFact(F.SOCKET_IFACE, "veth6163fba"),
        ],
        "Bootstrap: Using ib0:10.0.0.1<0>": [NcclFact(F.BOOTSTRAP_IFACE, "ib0")],
        "NCCL_SOCKET_IFNAME set by environment to ^lo,docker": [
            NcclFact(F.ENV, "NCCL_SOCKET_IFNAME=^lo,docker")
        ],
        "NET/Plugin: Loaded net plugin NCCL RDMA Plugin (v8)": [
            NcclFact(F.PLUGIN, "NCCL RDMA Plugin")
        ],
        "Channel 02/0 : 1[1] -> 9[1] [send] via NET/IB/3/GDRDMA": [
            NcclFact(F.CHANNEL, "NET/IB/GDRDMA")
        ],
        "Using network AWS Libfabric": [
            NcclFact(F.NETWORK, "AWS Libfabric"),
            NcclFact(F.PLUGIN, "OFI"),
        ],
        "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read": [],
        "comm 0x1 rank 0 nranks 16 cudaDev 0 busId 1000 - Init COMPLETE": [],
    }
    for text, want in cases.items():
        assert nccl_transport_facts(nccl("h", text)) == want, text
    # A garbled or cut line never raises.
    for junk in ["", "NCCL", "NCCL INFO NET/Socket : Using [", "NCCL INFO Bootstrap : Using"]:
        nccl_transport_facts(junk)
    assert scan_transport(["[dtrain] step=1/2 loss=1", nccl("h", "Init COMPLETE")]) == []


@pytest.mark.parametrize(
    ("spec", "iface", "hit"),
    [
        ("eth", "eth0", True),
        ("eth0,ens5", "ens5", True),
        ("^lo,docker", "lo", False),
        ("^lo,docker", "docker0", False),
        ("^lo,docker", "eth0", True),
        ("=eth0", "eth01", False),
        ("=eth0", "eth0", True),
    ],
)
def test_ifname_matches_like_nccl(spec: str, iface: str, hit: bool) -> None:
    assert ifname_matches(spec, iface) is hit


def test_expectation_from_garbage_is_unknown_never_an_error(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text("{not json")
    (tmp_path / "nccl.env").write_text("NCCL_X='a b'\nnot a line\nexport NCCL_Y=\"2\"\n# c=1\n")
    e = TransportExpectation.load(tmp_path)
    assert e.tier is None and e.nodes == 0 and e.nccl_env == {"NCCL_X": "a b", "NCCL_Y": "2"}
    (tmp_path / "plan.json").write_text(json.dumps({"spec": {"network": {"tier": "warp"}}}))
    assert TransportExpectation.load(tmp_path).tier is None
    assert TransportExpectation.load(tmp_path / "missing") == TransportExpectation()
    assert parse_env_file("A=$(id)\nB='x'") == {"A": "$(id)", "B": "x"}


def test_a_check_keeps_bounded_state_for_a_log_naming_endless_nodes() -> None:
    check = TransportCheck()
    check.observe("h", [NcclFact(FactKind.SOCKET_IFACE, f"eth{j}") for j in range(100)])
    assert len(check.nodes["h"].socket_ifaces) == 64
    for i in range(5000):
        check.observe(f"h{i}", [NcclFact(FactKind.NETWORK, "Socket")])
    assert len(check.nodes) == 4096


# ---- the monitor state, run.json ------------------------------------------------------------


def test_monitor_state_judges_against_the_run_directory_plan(tmp_path: Path) -> None:
    b = bundle(tmp_path, "ib-ndr")
    state = MonitorState(16)
    state.transport_dir = b
    assert state.snapshot(0.0).transport is None
    for node in (0, 1):
        lines = tuple(
            x.replace("deepseek-v2-5-0", f"n{node}")
            for x in (
                nccl("deepseek-v2-5-0", "NET/IB : No device found."),
                nccl("deepseek-v2-5-0", "Using network Socket"),
            )
        )
        state.apply([LineBatch(node, node * 8, "stdout", lines, 0.0, f"n{node}")], 0.0)
    report = state.snapshot(1.0).transport
    assert report is not None
    assert report.headline() == "⚠ plan assumes InfiniBand, NCCL chose Socket"
    assert report.findings[0].nodes == ("node 0 (n0)", "node 1 (n1)")


def test_launcher_writes_the_transport_entry_into_run_json(tmp_path: Path) -> None:
    b = bundle(tmp_path, "ib")
    run = RunDir(tmp_path / "run")
    (run.path / "logs").mkdir(parents=True)
    run.begin(RunRecord(name="t", nodes=2))
    watch = TransportWatch(run, b, "ssh")
    socket_lines = [nccl("n", "NET/IB : No device found."), nccl("n", "Using network Socket")]
    watch.feed({(0, 0): socket_lines, (1, 8): socket_lines}, ["n0", "n1"])
    entry = read_run(run.path)["transport"]
    assert entry["verdict"] == "mismatch" and entry["chosen"] == ["Socket"]
    assert entry["expected"]["tier"] == "ib" and entry["expected"]["backend"] == "ssh"
    assert entry["findings"][0]["title"] == "plan assumes InfiniBand, NCCL chose Socket"
    assert entry["findings"][0]["nodes"] == ["node 0 (n0)", "node 1 (n1)"]
    # A reader takes any transport entry; one of the wrong type reads as none.
    typed = RunRecord.from_untrusted({"transport": entry}).transport
    assert typed is not None and typed.to_dict() == entry
    assert RunRecord.from_untrusted({"transport": [1, 2]}).transport is None
    assert "transport" not in RunRecord().to_dict()


def test_each_node_is_read_until_its_own_budget_runs_out() -> None:
    notes = TransportNotes(tcp())
    chatter = [
        nccl("a", f"Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read seq={i}")
        for i in range(NODE_LINE_BUDGET)
    ]
    assert notes.feed(0, "a", chatter) is False
    late = [nccl("a", "Bootstrap : Using lo:127.0.0.1<0>")]
    assert notes.feed(0, "a", late) is False  # past node 0's start-up: not looked at
    assert notes.feed(1, "b", late) is True  # node 1 still is
    assert list(notes.report().nodes) == ["node 1 (b)"]

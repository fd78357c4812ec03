"""Step 3, the fabric: network tier and the interfaces NCCL/Gloo should use, with the
bandwidth the plan will assume."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Select, Static

from engine.errors import one_line
from engine.plan.names import NetworkTier
from engine.plan.specs import NetworkSpec
from tui import services
from tui.screens.step import StepPane, set_text
from tui.session import Step
from tui.widgets.field_row import FieldRow


class NetworkStep(StepPane):
    STEP = Step.NETWORK

    def compose(self) -> ComposeResult:
        yield Static("Network", classes="step-title")
        yield Static("", id="network-summary", classes="summary", markup=False)
        yield Static("Inter-node tier", classes="select-label")
        options = []
        for tier in NetworkTier:
            net = services.get_network(tier)
            label = f"{tier.value:<7} {net.name} · {net.gbps_per_node:g} Gbit/s per node"
            options.append((label, tier.value))
        yield Select(
            options, value=NetworkTier.TCP.value, allow_blank=False, compact=True, id="f-tier"
        )
        yield FieldRow(
            "bandwidth_gbps",
            "Bandwidth override",
            placeholder="Gbit/s per node; empty: the tier's figure",
        )
        yield FieldRow(
            "socket_ifname",
            "Socket interfaces",
            placeholder="NCCL/GLOO_SOCKET_IFNAME, e.g. eth0 or ^lo,docker",
        )
        yield FieldRow("ib_hca", "InfiniBand HCAs", placeholder="NCCL_IB_HCA, e.g. mlx5_0,mlx5_1")

    def load(self) -> None:
        net = self.session.spec.network
        self.query_one("#f-tier", Select).value = net.tier.value
        rows = self.rows()
        rows["bandwidth_gbps"].value = (
            "" if net.bandwidth_gbps is None else f"{net.bandwidth_gbps:g}"
        )
        rows["socket_ifname"].value = net.socket_ifname or ""
        rows["ib_hca"].value = net.ib_hca or ""

    def check(self) -> list[str]:
        data, errs = self.read_fields(
            {"bandwidth_gbps": "float", "socket_ifname": "str", "ib_hca": "str"}
        )
        data["tier"] = self.select_value("tier") or NetworkTier.TCP.value
        model, problems = self.build(NetworkSpec, data, errs)
        summary = self.query_one("#network-summary", Static)
        if model is None:
            set_text(summary, "")
            return problems
        assert isinstance(model, NetworkSpec)
        try:
            net = services.get_network(model.tier)
            gbps = model.bandwidth_gbps or net.gbps_per_node
            source = "your override" if model.bandwidth_gbps else net.name
            text = f"The plan assumes {gbps:g} Gbit/s per node ({gbps / 8:g} GB/s one way), from {source}."
        except Exception as e:  # noqa: BLE001
            text = one_line(e)
        if self.session.spec.hardware.nodes == 1:
            text += "\nOne node: the inter-node network is not used by this run."
        env = []
        if model.socket_ifname:
            env.append(f"NCCL_SOCKET_IFNAME={model.socket_ifname}")
        if model.ib_hca:
            env.append(f"NCCL_IB_HCA={model.ib_hca}")
        if env:
            text += "\nnccl.env gets " + " ".join(env)
        set_text(summary, text)
        self.session.set_section("network", model)
        return []

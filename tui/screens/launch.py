"""Step 7, launch: choose the backend (local by default), the hosts for SSH, the Slurm job's
partition, time limit, account, QoS, constraint and reservation, the run directory, and start;
the monitor screen then shows every rank. The summary says where the ranks run for the backend
chosen (even while its fields are incomplete), and labels a 3D plan launched with the example
trainer a smoke test, pointing at the bundle's Megatron-LM command (``pretrain_gpt.sh``).

Its Preflight button asks; the step writes the bundle, runs the preflight (all-reduce busbw,
node pairs, GEMM per GPU) on the chosen backend in a thread worker and shows the verdict in its
result line. The full tables are in ``RUN/preflight.json`` and ``dtrain-tui preflight``.

Ctrl+F runs the fault drill (:func:`engine.launch.drill.run_drill`, as ``dtrain-tui drill``) on
this machine in a thread worker before the real run: one rank SIGKILLed at a random step, the
restart checked; its verdict goes to the result line."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Button, Select, Static

from engine.plan.names import Backend
from engine.plan.specs import LaunchSpec
from tui.lifecycle import torn_down
from tui.messages import PreflightRequested
from tui.screens.step import StepPane, set_text
from tui.session import Step
from tui.widgets.field_row import FieldRow
from tui.widgets.preflight_button import PreflightButton

if TYPE_CHECKING:
    from engine.plan.result import Plan

SLURM_ROWS = (
    ("slurm_partition", "Partition (slurm)", "empty: the cluster's default (sinfo lists them)"),
    ("slurm_time_limit", "Time limit (slurm)", "MINUTES, HH:MM:SS or D-HH:MM:SS; empty: default"),
    ("slurm_account", "Account (slurm)", "empty: your default account"),
    ("slurm_qos", "QoS (slurm)", "empty: the account's default"),
    ("slurm_constraint", "Constraint (slurm)", "node features, e.g. a100&ib"),
    ("slurm_reservation", "Reservation (slurm)", "empty: none"),
)
"""(field, label, placeholder) of the Slurm fields, shown when the backend is slurm."""


def default_root_text() -> str:
    """Where runs go when the field is empty (XDG_DATA_HOME and the platform respected), with
    the home directory written as ``~``."""
    from engine.rundir.files import default_runs_root

    root = default_runs_root()
    try:
        return f"~/{root.relative_to(Path.home())}"
    except ValueError:
        return str(root)


class LaunchStep(StepPane):
    STEP = Step.LAUNCH
    BINDINGS = [Binding("ctrl+f", "drill", "Fault drill", show=False)]

    def compose(self) -> ComposeResult:
        yield Static("Launch", classes="step-title")
        yield Static("", id="launch-summary", classes="summary", markup=False)
        yield Static("Backend", classes="select-label")
        yield Select(
            [
                ("local: ranks on this machine", Backend.LOCAL.value),
                ("ssh: one node per host", Backend.SSH.value),
                ("skypilot: a cluster from the cloud", Backend.SKYPILOT.value),
                ("slurm: a batch job on Slurm", Backend.SLURM.value),
            ],
            value=Backend.LOCAL.value,
            allow_blank=False,
            compact=True,
            id="f-backend",
        )
        yield FieldRow(
            "hosts", "Hosts (ssh)", placeholder="user@host[:port], one per node, comma-separated"
        )
        yield FieldRow(
            "identity_file", "SSH key file", placeholder="path to a private key (never stored)"
        )
        for name, label, hint in SLURM_ROWS:
            row = FieldRow(name, label, placeholder=hint)
            row.display = False  # shown for the slurm backend only
            yield row
        yield FieldRow("run_root", "Runs directory", placeholder=f"empty: {default_root_text()}")
        yield Static("", id="launch-result", classes="summary", markup=False)
        with Horizontal(classes="buttons"):
            yield Button("Start run  ^l", id="start", variant="success", compact=True)
            yield PreflightButton()

    def load(self) -> None:
        la = self.session.spec.launch
        self.query_one("#f-backend", Select).value = la.backend.value
        rows = self.rows()
        rows["hosts"].value = ", ".join(la.hosts)
        rows["identity_file"].value = str(la.identity_file) if la.identity_file else ""
        rows["run_root"].value = str(self.session.run_root) if self.session.run_root else ""
        for name, _label, _hint in SLURM_ROWS:
            rows[name].value = getattr(la, name) or ""
            rows[name].display = la.backend == Backend.SLURM

    def check(self) -> list[str]:
        slurm_fields = [name for name, _label, _hint in SLURM_ROWS]
        data, errs = self.read_fields(
            {"hosts": "str", "identity_file": "str", **dict.fromkeys(slurm_fields, "str")}
        )
        backend = self.select_value("backend") or Backend.LOCAL.value
        data["backend"] = backend
        rows = self.rows()
        for name in slurm_fields:
            rows[name].display = backend == Backend.SLURM.value
            data.setdefault(name, None)  # an emptied field is unset, not the old value
        if "hosts" in data:
            data["hosts"] = [h.strip() for h in str(data["hosts"]).split(",") if h.strip()]
        nodes = self.session.spec.hardware.nodes
        if (
            backend == Backend.SSH.value
            and len(data.get("hosts", [])) != nodes
            and "hosts" not in errs
        ):
            errs["hosts"] = f"ssh needs one host per node: {nodes} host(s), in node-rank order"
        old = self.session.spec.launch.model_dump(exclude={"backend", "hosts", "identity_file"})
        old.update(data)
        model, problems = self.build(LaunchSpec, old, errs)
        run_root = self.rows()["run_root"].value.strip()
        if "\0" in run_root:
            self.rows()["run_root"].set_error("a path cannot contain NUL")
            problems.append("run_root: invalid path")
        # The summary follows the backend chosen, valid or not yet (an ssh backend with no
        # hosts typed must not keep saying "on this machine").
        hosts = model.hosts if isinstance(model, LaunchSpec) else list(data.get("hosts", []))
        partition = str(data.get("slurm_partition") or "default")
        set_text(self.query_one("#launch-summary", Static), self.summary(backend, hosts, partition))
        label = "Start smoke test  ^l" if self.smoke_test else "Start run  ^l"
        plan = self.session.plan
        if plan is not None and not plan.recommended.fits:
            label = "✗ Does not fit: see 5 Decision"  # ^l refuses it, and says why
        start = self.query_one("#start", Button)
        if str(start.label) != label:
            start.label = label
        if model is None or problems:
            return problems
        assert isinstance(model, LaunchSpec)
        self.session.run_root = Path(run_root).expanduser() if run_root else None
        self.session.set_section("launch", model)
        return []

    def summary(self, backend: str, hosts: list[str], partition: str) -> str:
        """Where the ranks run, for ``backend``; and, for a 3D plan launched with the example
        trainer, that it is a smoke test and where the real Megatron-LM command is."""
        hw = self.session.spec.hardware
        if backend == Backend.LOCAL.value:
            where = "this machine"
        elif backend == Backend.SSH.value:
            where = (
                f"{len(hosts)} host(s) over SSH: {', '.join(hosts)}"
                if hosts
                else f"SSH hosts (type {hw.nodes}, one per node)"
            )
        elif backend == Backend.SLURM.value:
            where = f"a Slurm job (partition {partition})"
        else:
            where = "a SkyPilot cluster"
        text = (
            f"{hw.world_size} rank(s), {hw.nodes} node(s) × {hw.gpus_per_node}, on {where}; "
            f"the bundle is written to {self.session.out_dir} first."
        )
        if backend == Backend.LOCAL.value and hw.nodes > 1:
            text += (
                f"\n⚠ local runs every node's ranks on this machine ({hw.world_size} processes)."
            )
        plan = self.session.plan
        if self.smoke_test and plan is not None and plan.recommended.framework.value == "megatron":
            text += (
                "\n⚠ SMOKE TEST: this 3D (Megatron-LM) plan starts the example trainer, which "
                "trains its data-parallel part only. The real run is pretrain_gpt.sh in the "
                "bundle (MEGATRON_LM=/path/to/Megatron-LM ./pretrain_gpt.sh; Ctrl+Y on the "
                "Configs step copies it)."
            )
        elif self.smoke_test:
            text += (
                "\n⚠ SMOKE TEST: this mixture-of-experts plan starts the example trainer, which "
                "has no experts: it trains a dense model with one expert-sized MLP a block. The "
                "real run is your training script (a profile's launch.script, or dtrain-tui "
                "launch DIR --script PATH)."
            )
        return text

    @property
    def smoke_test(self) -> bool:
        """The launch starts the example trainer on a plan it can only approximate: a 3D
        (Megatron-LM) plan, or a mixture-of-experts one (the trainer has no experts)."""
        plan = self.session.plan
        return (
            plan is not None
            and plan.spec.launch.script is None
            and (plan.recommended.framework.value == "megatron" or plan.model.is_moe)
        )

    @on(Button.Pressed, "#start")
    async def _start(self, event: Button.Pressed) -> None:
        event.stop()
        await self.run_action("app.launch")

    def show_plan(self) -> None:
        """A new plan arrived: the summary (smoke test or not) and the start button follow it."""
        self.revalidate()

    def show_result(self, message: str, *, ok: bool) -> None:
        res = self.query_one("#launch-result", Static)
        res.update(("✓ " if ok else "✗ ") + message)
        res.add_class("-shown")
        res.set_class(not ok, "-error")

    # --- the preflight ------------------------------------------------------------------------
    @on(PreflightRequested)
    def _preflight(self, event: PreflightRequested) -> None:
        event.stop()
        session = self.session
        if self.check() or session.plan is None:
            self.show_result("preflight: finish the steps first (no valid plan yet)", ok=False)
            return
        self.show_result("preflight: writing the bundle and measuring…", ok=True)
        self.query_one(PreflightButton).disabled = True
        plan, out, root = session.plan, Path(session.out_dir), session.run_root
        self.run_worker(
            lambda: self._run_preflight(plan, out, root),
            thread=True,
            exclusive=True,
            group="preflight",
            description="preflight",
            exit_on_error=False,
        )

    def _run_preflight(self, plan: Plan, out: Path, root: Path | None) -> None:
        from engine.diagnose.preflight import verdict_line
        from engine.errors import one_line
        from engine.launch.options import LaunchOptions, backend_hosts
        from engine.launch.preflight import run_preflight
        from engine.rundir.files import new_run_dir
        from engine.write.naming import run_name
        from tui import services

        try:
            services.write_bundle(plan, out)
            launch = plan.spec.launch
            kind = launch.backend.value
            options = LaunchOptions.from_spec(launch)
            options.hosts = backend_hosts(kind, options.hosts)
            run_dir = new_run_dir(f"{run_name(plan)}-preflight", root)
            backend, report = run_preflight(kind, out, run_dir, options)
            text, ok = f"{verdict_line(report)} ({backend.run.path})", report.verdict == "ok"
        except Exception as e:  # noqa: BLE001 - any failure is one line on the step
            text, ok = f"preflight: {one_line(e)}", False
        self.app.call_from_thread(self.preflight_done, text, ok)

    def preflight_done(self, text: str, ok: bool) -> None:
        """The preflight's verdict (from its worker): on the result line, the button again."""
        if torn_down(self):
            return  # the step went away while the preflight ran (its report is in the run dir)
        self.query_one(PreflightButton).disabled = False
        self.show_result(text, ok=ok)

    # --- the fault drill ----------------------------------------------------------------------
    def action_drill(self) -> None:
        session = self.session
        if self.check() or session.plan is None:
            self.show_result("drill: finish the steps first (no valid plan yet)", ok=False)
            return
        self.show_result("drill: writing the bundle, a reference run, then a kill…", ok=True)
        plan, out, root = session.plan, Path(session.out_dir), session.run_root
        self.run_worker(
            lambda: self._run_drill(plan, out, root),
            thread=True,
            exclusive=True,
            group="drill",
            description="fault drill",
            exit_on_error=False,
        )

    def _run_drill(self, plan: Plan, out: Path, root: Path | None) -> None:
        import random

        from engine.errors import one_line
        from engine.launch.drill import run_drill
        from engine.launch.options import LaunchOptions
        from engine.rundir.files import new_run_dir
        from engine.write.naming import run_name
        from tui import services

        try:
            services.write_bundle(plan, out)
            options = LaunchOptions.from_spec(plan.spec.launch, hosts=[])
            work = new_run_dir(f"{run_name(plan)}-drill", root)
            seed = random.SystemRandom().randrange(1 << 16)
            report = run_drill(out, work, kills=1, seed=seed, options=options, say=lambda _: None)
            lines = report.lines()
            problems = [x for x in lines[:-1] if not x.endswith(": held")]
            text = lines[-1] + (f": {problems[0]}" if problems else "") + f" ({work})"
            ok = report.ok
        except Exception as e:  # noqa: BLE001 - any failure is one line on the step
            text, ok = f"drill: {one_line(e)}", False
        self.app.call_from_thread(self.drill_done, text, ok)

    def drill_done(self, text: str, ok: bool) -> None:
        if not torn_down(self):
            self.show_result(text, ok=ok)

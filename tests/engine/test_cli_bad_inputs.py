"""Bad input to the CLI is one line naming the field, exit 2; never a traceback.

A corpus of more than 300 bad inputs, built below, goes through ``plan``, ``write``, ``launch``,
``monitor``, ``profiles`` and ``model`` in-process (``cli.main``; fast), a hypothesis
search adds random junk for every numeric option, and a small sample runs as a real subprocess.
Every input fails before anything is planned, written or started, so none needs a GPU or a
network. The regression tests after the corpus pin each reported case of issue 10 (points 16, 17).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli import main
from cli.spec_options import _LAUNCH_OPTS, _MODEL_OPTS, _OTHER_OPTS, whole_number
from tests.engine.fullfs import small_tmpfs

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    names: tuple[str, ...]
    """The error line must contain one of these: the flag, the spec key, or the file."""

    def __str__(self) -> str:
        return shlex.join(self.argv)


@dataclass
class Result:
    code: int | str | None
    out: str
    err: str


def run_cli(argv: list[str] | tuple[str, ...]) -> Result:
    import engine.launch

    assert getattr(engine.launch.make_backend, "__name__", "") == "no_backend", "unguarded"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code: int | str | None = main(list(argv))
        except SystemExit as e:  # argparse's own errors
            code = e.code
    return Result(code, out.getvalue(), err.getvalue())


def assert_one_line_error(r: Result, case: Case) -> None:
    assert "Traceback" not in r.err, f"{case}: {r.err}"
    assert r.code == 2, f"{case}: exit {r.code}, stderr {r.err!r}"
    lines = r.err.splitlines()
    assert len(lines) == 1, f"{case}: {len(lines)} lines: {r.err!r}"
    assert "error" in lines[0], f"{case}: {lines[0]}"
    assert any(n in lines[0] for n in case.names), (
        f"{case}: {lines[0]!r} names none of {case.names}"
    )


# --------------------------------------------------------------------------------------- corpus

_INT_OPTS = [(o, f"model.{f}") for o, f, kw in _MODEL_OPTS if kw.get("type") is whole_number] + [
    (o, f"{s}.{f}") for o, s, f, kw in _OTHER_OPTS + _LAUNCH_OPTS if kw.get("type") is whole_number
]
_FLOAT_OPTS = [
    (o, f"{s}.{f}")
    for o, s, f, kw in _OTHER_OPTS + _LAUNCH_OPTS
    if kw.get("type") not in (None, whole_number) and "choices" not in kw
]
_CHOICE_OPTS = [(o, f"{s}.{f}") for o, s, f, kw in _OTHER_OPTS + _LAUNCH_OPTS if "choices" in kw]
_LAUNCH_FLAGS = {o for o, *_ in _LAUNCH_OPTS} | {"--hosts"}

# Bad for every count: not a number, non-ASCII digits (int("٣") is 3), a fraction, negative,
# empty, a YAML-style bool, scientific notation.
_BAD_INTS = ("abc", "٣", "1.5", "-7", "", "true", "1e3", "0x10", "١٢")
# Bad for every real number: not finite, not ASCII, below every range, overflowing.
_BAD_FLOATS = ("abc", "nan", "inf", "-inf", "-1", "١٢", "1e400", "NaN", "")


def _command_for(i: int, flag: str) -> list[str]:
    """Spread the option cases over the commands that take spec options."""
    if flag in _LAUNCH_FLAGS:
        cmds = (["write", "--print", "ds_config.json"], ["launch"], ["profiles", "save", "p1"])
    else:
        cmds = (
            ["plan"],
            ["write", "--print", "ds_config.json"],
            ["launch"],
            ["profiles", "save", "p1"],
        )
    return list(cmds[i % len(cmds)])


def _option_cases() -> Iterator[Case]:
    i = 0
    for flag, field in _INT_OPTS:
        base = [] if field.startswith("model.") else ["--model", "gpt2"]
        for v in _BAD_INTS:
            yield Case((*_command_for(i, flag), *base, f"{flag}={v}"), (flag, field))
            i += 1
    for flag, field in _FLOAT_OPTS:
        for v in _BAD_FLOATS:
            yield Case((*_command_for(i, flag), "--model", "gpt2", f"{flag}={v}"), (flag, field))
            i += 1
    for flag, field in _CHOICE_OPTS:
        for v in ("nope", "", "BF16x"):
            yield Case((*_command_for(i, flag), "--model", "gpt2", f"{flag}={v}"), (flag, field))
            i += 1
    text_cases = [
        ("--gpu", "hardware.gpu", ("h999", "", "a100;rm")),
        ("--socket-ifname", "network.socket_ifname", ("eth0;rm", "$(id)", "a b")),
        ("--ib-hca", "network.ib_hca", ("mlx5 0", "`id`")),
        ("--params", "model.params", ("7X", "nan", "-5", "0", "inf", "1e99", "٧B")),
        ("--tokens", "training.tokens", ("lots", "nan", "-1", "1e30")),
        ("--model", "model.preset", ("gpt-17", "../x")),
        ("--nccl-debug", "launch.nccl_debug", ("LOUD", "info;id")),
        ("--nccl-debug-subsys", "launch.nccl_debug_subsys", ("a b", "$(id)")),
        ("--sky-cluster", "launch.sky_cluster", ("a/b", "x y")),
        ("--sky-cloud", "launch.sky_cloud", ("a;b",)),
        (
            "--master-addr",
            "launch.master_addr",
            ("10.0.0.1\n", "-oProxyCommand=x", "$(id)", "a b", "10.0.0.1;id", "\n"),
        ),
        (
            "--hosts",
            "launch.hosts",
            ("-oProxyCommand=x", "a,-b", "$(id)", "a b", "h:99999", "u@", "@h", "root@-h", "h:0"),
        ),
    ]
    for flag, field, values in text_cases:
        for v in values:
            base = [] if field.startswith("model.") else ["--model", "gpt2"]
            yield Case((*_command_for(i, flag), *base, f"{flag}={v}"), (flag, field))
            i += 1
    # Combinations the spec refuses, naming a field.
    combos = [
        (["--model", "gpt2", "--layers", "1"], ("model.layers",)),
        (["--model", "gpt2", "--vocab", "100"], ("model.vocab",)),
        (["--model", "gpt2", "--params", "7B"], ("model.params",)),
        (["--micro-batch", "1000", "--global-batch", "8", "--model", "gpt2"], ("micro_batch",)),
        (["--micro-batch", "3", "--global-batch", "8", "--model", "gpt2"], ("micro_batch",)),
        (["--layers", "2", "--hidden", "64", "--heads", "3", "--vocab", "9"], ("model.heads",)),
        (
            ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "3", "--vocab", "9"],
            ("kv_heads",),
        ),
        (["--params", "1e9", "--experts", "2", "--experts-per-token", "4"], ("experts_per_token",)),
        (["--gpus-per-node", "2"], ("model",)),
    ]
    for args, names in combos:
        for cmd in (["plan"], ["launch"], ["profiles", "save", "p2"]):
            yield Case((*cmd, *args), names)


def _file_cases(d: Path) -> Iterator[Case]:
    """Spec files, config.json files, output paths, run and bundle directories."""
    d.mkdir(parents=True, exist_ok=True)
    a_file = d / "a_file"
    a_file.write_text("x")
    (d / "dangling").symlink_to(d / "missing" / "target")
    empty = d / "empty"
    empty.mkdir()

    def put(name: str, content: str | bytes) -> Path:
        p = d / name
        p.write_bytes(content.encode() if isinstance(content, str) else content)
        return p

    # --- spec files ----------------------------------------------------------------------
    spec_files: list[tuple[str, str | bytes, tuple[str, ...]]] = [
        (
            "yes.yaml",
            "model:\n  layers: yes\n  hidden: 64\n  heads: 2\n  vocab: 9\n",
            ("model.layers",),
        ),
        ("true.yaml", "model: {preset: gpt2}\nhardware: {nodes: true}\n", ("hardware.nodes",)),
        ("boolgb.yaml", "model: {preset: gpt2}\ntraining: {global_batch: no}\n", ("global_batch",)),
        ("dup.yaml", "model:\n  preset: gpt2\n  preset: llama-3-8b\n", ("'preset'",)),
        ("dupsec.yaml", "model: {preset: gpt2}\nmodel: {preset: gpt2}\n", ("'model'",)),
        ("dup.toml", '[model]\npreset = "gpt2"\npreset = "x"\n', ("--spec",)),
        ("nan.toml", '[model]\npreset = "gpt2"\n[training]\nlr = nan\n', ("training.lr",)),
        ("inf.toml", '[model]\npreset = "gpt2"\n[training]\ngrad_clip = inf\n', ("grad_clip",)),
        (
            "ninf.toml",
            '[model]\npreset = "gpt2"\n[network]\nbandwidth_gbps = -inf\n',
            ("bandwidth_gbps",),
        ),
        (
            "nan.yaml",
            "model: {preset: gpt2}\ntraining: {price_per_gpu_hour: .nan}\n",
            ("price_per_gpu_hour",),
        ),
        ("unk.toml", '[model]\npreset = "gpt2"\nlayerz = 3\n', ("model.layerz",)),
        ("sec.toml", '[modle]\npreset = "gpt2"\n', ("modle",)),
        ("list.yaml", "- model\n- hardware\n", ("--spec",)),
        ("scalar.yaml", "42\n", ("--spec",)),
        ("syntax.toml", "[model\n", ("--spec",)),
        ("syntax.yaml", "model: [\n", ("--spec",)),
        ("tab.yaml", "model:\n\tpreset: gpt2\n", ("--spec",)),
        ("latin1.toml", b'[model]\npreset = "gpt\xe9"\n', ("--spec",)),
        ("latin1.yaml", b"model:\n  preset: \xff\xfe\n", ("--spec",)),
        ("bom16.yaml", "model: {preset: gpt2}\n".encode("utf-16"), ("--spec",)),
        ("deep.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n", ("--spec",)),
        ("deep.toml", "a = " + "[" * 5000 + "]" * 5000 + "\n", ("--spec",)),
        ("alias.yaml", "a: &x [1]\nb: *x\n", ("--spec",)),
        ("strsec.yaml", "model: gpt2\n", ("model",)),
        (
            "listhosts.toml",
            '[model]\npreset = "gpt2"\n[launch]\nhosts = "a,b"\n',
            ("launch.hosts",),
        ),
        (
            "badhost.toml",
            '[model]\npreset = "gpt2"\n[launch]\nhosts = ["-oX=y"]\n',
            ("launch.hosts",),
        ),
        (
            "nlmaster.toml",
            '[model]\npreset = "gpt2"\n[launch]\nmaster_addr = "h\\n"\n',
            ("master_addr",),
        ),
        ("env.toml", '[model]\npreset = "gpt2"\n[launch.env]\n"A B" = "x"\n', ("launch.env",)),
        ("envnl.toml", '[model]\npreset = "gpt2"\n[launch.env]\nA = "x\\ny"\n', ("launch.env",)),
        (
            "ht.toml",
            '[model]\npreset = "gpt2"\n[launch]\nhang_timeout_s = 0\n',
            ("hang_timeout_s",),
        ),
        (
            "htn.toml",
            '[model]\npreset = "gpt2"\n[launch]\nhang_timeout_s = nan\n',
            ("hang_timeout_s",),
        ),
        (
            "mb.toml",
            '[model]\npreset = "gpt2"\n[training]\nmicro_batch = 9\nglobal_batch = 8\n',
            ("micro_batch",),
        ),
        (
            "lmb.toml",
            '[model]\npreset = "gpt2"\n[layout]\nmicro_batch = 9\n[training]\nglobal_batch = 8\n',
            ("micro_batch",),
        ),
        ("both.toml", '[model]\npreset = "gpt2"\nlayers = 2\n', ("model.layers",)),
        (
            "strint.yaml",
            "model: {layers: '٣', hidden: 64, heads: 2, vocab: 9}\n",
            ("model.layers",),
        ),
        (
            "floatint.toml",
            "[model]\nlayers = 2.5\nhidden = 64\nheads = 2\nvocab = 9\n",
            ("model.layers",),
        ),
        (
            "enum.toml",
            '[model]\npreset = "gpt2"\n[training]\nprecision = "fp8"\n',
            ("training.precision",),
        ),
        ("listscalar.toml", '[model]\npreset = ["gpt2"]\n', ("model.preset",)),
        ("zero.toml", '[model]\npreset = "gpt2"\n[layout]\nzero_stage = 4\n', ("zero_stage",)),
        ("nodes.yaml", "model: {preset: gpt2}\nhardware: {nodes: 0}\n", ("hardware.nodes",)),
        ("gpu.yaml", "model: {preset: gpt2}\nhardware: {gpu: tpu-v9}\n", ("hardware.gpu",)),
        (
            "huge.yaml",
            "model: {preset: gpt2}\nhardware: {gpus_per_node: 1000000000}\n",
            ("gpus_per_node",),
        ),
    ]
    cmds = (
        ["plan"],
        ["write", "--print", "ds_config.json"],
        ["launch"],
        ["profiles", "save", "p3"],
    )
    for i, (name, content, names) in enumerate(spec_files):
        p = put(name, content)
        for cmd in (cmds[i % 4], cmds[(i + 1) % 4]):
            yield Case((*cmd, "--spec", str(p)), names)
    for cmd in cmds:
        yield Case((*cmd, "--spec", str(d / "nope.toml")), ("--spec",))
        yield Case((*cmd, "--spec", str(empty)), ("--spec",))
        yield Case((*cmd, "--spec", str(a_file / "x.toml")), ("--spec",))

    # --- Hugging Face config.json --------------------------------------------------------
    llama = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
    }
    configs: list[tuple[str, str | bytes, tuple[str, ...]]] = [
        ("deep_list.json", "[" * 200_000 + "]" * 200_000, ("model.config_path",)),
        ("deep_obj.json", '{"a":' * 200_000 + "1" + "}" * 200_000, ("model.config_path",)),
        ("notjson.json", "{model_type: llama", ("model.config_path",)),
        ("array.json", "[1, 2]", ("model.config_path",)),
        ("nomt.json", json.dumps({"hidden_size": 64}), ("model.config_path",)),
        ("unsup.json", json.dumps({"model_type": "t5"}), ("model.config_path",)),
        (
            "bigint.json",
            '{"model_type": "gpt2", "n_embd": ' + "9" * 5000 + "}",
            ("model.config_path",),
        ),
        ("latin1.json", b'{"model_type": "llama\xe9"}', ("model.config_path",)),
        ("utf16.json", json.dumps(llama).encode("utf-16"), ("model.config_path",)),
        ("empty.json", "", ("model.config_path",)),
        ("nan.json", json.dumps({**llama, "hidden_size": float("nan")}), ("model.config_path",)),
    ]
    for key, bad in [
        ("hidden_size", "64"),
        ("hidden_size", -64),
        ("hidden_size", True),
        ("hidden_size", 10**30),
        ("num_hidden_layers", 0),
        ("num_hidden_layers", 2.5),
        ("num_attention_heads", None),
        ("num_attention_heads", [4]),
        ("intermediate_size", "big"),
        ("vocab_size", {"n": 1}),
        ("head_dim", "x"),
        ("num_key_value_heads", 3),
    ]:
        configs.append(
            (
                f"llama_{key}_{bad!s:.8}.json",
                json.dumps({**llama, key: bad}),
                ("model.config_path",),
            )
        )
    for key, bad in [("n_inner", "x"), ("n_embd", 0), ("n_layer", "2")]:
        gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100}
        configs.append((f"gpt2_{key}.json", json.dumps({**gpt2, key: bad}), ("model.config_path",)))
    for i, (name, content, names) in enumerate(configs):
        p = put(name, content)
        yield Case(("model", "inspect", "--model-config", str(p)), names)
        cmd = (["plan"], ["write", "--print", "README.md"], ["launch"])[i % 3]
        yield Case((*cmd, "--model-config", str(p)), names)
    yield Case(("model", "inspect", "--model-config", str(empty)), ("model.config_path",))
    yield Case(("model", "inspect", "--model-config", str(d / "none.json")), ("model.config_path",))
    yield Case(
        (
            "model",
            "inspect",
            "--model-config",
            str(put("c1.json", json.dumps(llama))),
            "--layers",
            "3",
        ),
        ("model.layers",),
    )
    yield Case(("model", "inspect", "gpt2", "--layers", "٣"), ("--layers",))
    yield Case(("model", "inspect", "gpt2", "--hidden", "1"), ("model.hidden",))
    yield Case(("model", "inspect", "nosuchmodel"), ("model.preset",))
    yield Case(("model", "inspect", "--params", "nan"), ("model.params",))
    yield Case(("model", "inspect", "--layers", "2"), ("model.hidden",))

    # --- output paths and run directories ------------------------------------------------
    out_paths = [
        (a_file / "sub", "--out"),  # under a regular file
        (a_file / "a" / "b", "--out"),
        (d / "dangling", "--out"),  # a dangling symlink
        (a_file, "--out"),  # a file
        (Path("/proc/dtrain-nope/x"), "--out"),  # a parent that cannot be created
    ]
    for p, field in out_paths:
        yield Case(
            (
                "write",
                "--layers",
                "2",
                "--hidden",
                "64",
                "--heads",
                "2",
                "--vocab",
                "9",
                "--out",
                str(p),
            ),
            (field,),
        )
    yield Case(
        ("write", "--layers", "2", "--hidden", "64", "--heads", "2", "--vocab", "9"), ("--out",)
    )
    yield Case(
        ("write", "--model", "gpt2", "--warmup-steps", "-1", "--out", str(d / "o")),
        ("--warmup-steps",),
    )
    yield Case(("write", "--model", "gpt2", "--print", "nosuch.json"), ("--print",))
    yield Case(
        ("write", "--model", "gpt2", "--fsdp-version", "3", "--out", str(d / "o")),
        ("--fsdp-version",),
    )
    for p in (a_file, a_file / "x", d / "dangling"):
        yield Case(("launch", "--model", "gpt2", "--run-dir", str(p)), ("--run-dir",))

    # --- launch a bundle -------------------------------------------------------------------
    bundle = d / "bundle"
    assert (
        run_cli(
            [
                "write",
                "--layers",
                "2",
                "--hidden",
                "64",
                "--heads",
                "2",
                "--vocab",
                "9",
                "--out",
                str(bundle),
            ]
        ).code
        == 0
    )
    bad_bundle = d / "bad_bundle"
    bad_bundle.mkdir()
    (bad_bundle / "bundle.json").write_text("{")
    nonutf_bundle = d / "nonutf_bundle"
    nonutf_bundle.mkdir()
    (nonutf_bundle / "bundle.json").write_bytes(b"\xff\xfe{")
    for p in (d / "nope", a_file, empty, bad_bundle):
        yield Case(("launch", str(p)), ("bundle",))
    yield Case(("launch", str(nonutf_bundle)), ("bundle",))
    for flag, v, names in [
        ("--hang-timeout", "0", ("hang_timeout_s",)),
        ("--hang-timeout", "-5", ("--hang-timeout", "hang_timeout_s")),
        ("--hang-timeout", "nan", ("hang_timeout_s",)),
        ("--hang-timeout", "inf", ("hang_timeout_s",)),
        ("--hosts", "-oProxyCommand=x", ("launch.hosts",)),
        ("--master-addr", "h\n", ("master_addr",)),
        ("--master-port", "0", ("master_port",)),
        ("--master-port", "70000", ("master_port",)),
        ("--max-restarts", "-1", ("--max-restarts", "max_restarts")),
        ("--nccl-debug", "LOUD", ("nccl_debug",)),
        ("--backend", "ssh", ("--hosts",)),
        ("--run-dir", str(a_file), ("--run-dir",)),
        ("--sky-autostop", "x", ("--sky-autostop",)),
        ("--ssh-config", "", ("--hosts",)),
    ]:
        extra = ["--backend", "ssh"] if flag == "--ssh-config" else []
        yield Case(("launch", str(bundle), *extra, f"{flag}={v}"), names)
    yield Case(("launch", str(bundle), "--model", "gpt2"), ("launch",))
    yield Case(("launch",), ("launch",))

    # --- monitor -----------------------------------------------------------------------------
    def run_dir(name: str, content: str | bytes | None) -> Path:
        p = d / name
        p.mkdir()
        if content is not None:
            (p / "run.json").write_bytes(content.encode() if isinstance(content, str) else content)
        return p

    monitor_dirs = [
        d / "nope",
        a_file,
        empty,
        run_dir("rd_bad", "garbage{"),
        run_dir("rd_list", "[1]"),
        run_dir("rd_nonutf", b"\xff\xfe"),
        run_dir("rd_deep", "[" * 200_000 + "]" * 200_000),
        run_dir("rd_empty", ""),
        run_dir("rd_str", '"running"'),
    ]
    for p in monitor_dirs:
        yield Case(("monitor", str(p), "--follow"), ("RUN_DIR",))
        yield Case(("monitor", str(p)), ("RUN_DIR",))
    yield Case(("monitor", str(empty), "--hang-after", "x"), ("--hang-after",))

    # --- profiles ----------------------------------------------------------------------------
    cfg = d / "cfg"
    prof = ["profiles", "--config-dir", str(cfg)]
    for name in ("nosuch", "../etc", "a b", "x/y", "-x", "", ".hidden", "a" * 65, "é"):
        for action in (["show", name], ["delete", name], ["rename", name, "ok"], ["export", name]):
            yield Case((*prof, *action), ("--profile", "profile name", "name"))
    for name in ("../x", "a b", "x/y", "a" * 65):
        yield Case((*prof, "save", name, "--model", "gpt2"), ("profile name",))
        yield Case((*prof, "rename", "local-cpu-demo", name), ("profile name",))
    imports: list[tuple[str, str | bytes]] = [
        ("p_nonutf.toml", b"\xff\xfe"),
        ("p_syntax.toml", "[model\n"),
        ("p_unknown.toml", '[modle]\npreset = "gpt2"\n'),
        ("p_bool.toml", "[hardware]\nnodes = true\n"),
        ("p_nan.toml", "[training]\nlr = nan\n"),
        ("p_host.toml", '[launch]\nhosts = ["-oX"]\n'),
        ("p_secret.toml", '[launch.env]\nAWS_SECRET_ACCESS_KEY = "abc"\n'),
    ]
    for name, content in imports:
        p = put(name, content)
        yield Case(
            (*prof, "import", str(p)), (str(p), name, "launch", "training", "hardware", "modle")
        )
    yield Case((*prof, "import", str(d / "none.toml")), ("none.toml",))
    yield Case((*prof, "import", str(empty)), (str(empty),))
    yield Case((*prof, "export", "local-cpu-demo", "-o", str(a_file / "x")), (str(a_file),))
    yield Case((*prof, "save", "ok", "--lr", "nan", "--model", "gpt2"), ("training.lr",))


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Profiles and run directories go to a temporary place, never the user's; and no bad input
    may get as far as starting a run (a backend that is asked for fails the case)."""
    import engine.launch

    def no_backend(*args: object, **kwargs: object) -> None:
        raise AssertionError("a bad input reached the launch backend")

    monkeypatch.setenv("DTRAIN_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setattr(engine.launch, "make_backend", no_backend)


@pytest.fixture
def corpus(tmp_path: Path, _isolated: None) -> list[Case]:
    return [*_option_cases(), *_file_cases(tmp_path / "bad")]


def test_every_bad_input_is_one_line_naming_its_field_and_exit_2(corpus: list[Case]) -> None:
    assert len(corpus) >= 300, len(corpus)
    failures: list[str] = []
    for case in corpus:
        r = run_cli(case.argv)
        try:
            assert_one_line_error(r, case)
        except AssertionError as e:
            failures.append(str(e).splitlines()[0][:400])
    assert not failures, f"{len(failures)} of {len(corpus)}:\n" + "\n".join(failures)


_NUMERIC = [(o, f, True) for o, f in _INT_OPTS] + [(o, f, False) for o, f in _FLOAT_OPTS]
_NON_ASCII_DIGITS = st.text(st.sampled_from("٠١٢٣٤٥٦٧٨٩۰۱۲۳४५६௭๓"), min_size=1, max_size=4)


@st.composite
def _bad_number(draw: st.DrawFn) -> tuple[str, str, str]:
    flag, field, is_int = draw(st.sampled_from(_NUMERIC))
    junk = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8).filter(
        lambda s: not _parses(s, is_int)
    )
    negative = st.integers(max_value=-1).map(str)
    choices = [junk, negative, _NON_ASCII_DIGITS]
    if not is_int:
        choices.append(st.sampled_from(["nan", "inf", "-inf", "+inf", "NAN", "Infinity", "1e999"]))
    else:
        choices.append(
            st.floats(allow_nan=False, allow_infinity=False)
            .filter(lambda x: not x.is_integer())
            .map(repr)
        )
    return flag, field, draw(st.one_of(choices))


def _parses(s: str, is_int: bool) -> bool:
    try:
        (int if is_int else float)(s.strip())
    except ValueError:
        return False
    return s.strip().isascii()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(_bad_number(), st.sampled_from([["plan"], ["write", "--print", "README.md"], ["launch"]]))
def test_random_junk_in_any_numeric_option_is_one_line(
    bad: tuple[str, str, str], cmd: list[str]
) -> None:
    flag, field, value = bad
    if flag in _LAUNCH_FLAGS and cmd == ["plan"]:
        cmd = ["launch"]
    base = [] if field.startswith("model.") else ["--model", "gpt2"]
    case = Case((*cmd, *base, f"{flag}={value}"), (flag, field))
    assert_one_line_error(run_cli(case.argv), case)


def test_a_sample_as_real_subprocesses(corpus: list[Case]) -> None:
    """What a user sees: the real interpreter, its real recursion limit and stderr."""
    # No launch here: a subprocess has no guard against starting a run.
    safe = [c for c in corpus if "launch" not in c.argv]
    sample = safe[:: max(1, len(safe) // 12)][:12]
    for case in sample:
        p = subprocess.run(
            [sys.executable, "-m", "cli", *case.argv],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            env={**os.environ, "DTRAIN_CONFIG_DIR": "/nonexistent-dtrain-test"},
        )
        assert_one_line_error(Result(p.returncode, p.stdout, p.stderr), case)


# ------------------------------------------------------------ regressions: issue 10, point 16

TINY = ["--layers", "2", "--hidden", "64", "--heads", "2", "--vocab", "9"]


def _expect(argv: list[str], *needles: str) -> str:
    r = run_cli(argv)
    case = Case(tuple(argv), needles[:1])
    assert_one_line_error(r, case)
    for n in needles:
        assert n in r.err, f"{case}: {r.err!r} lacks {n!r}"
    return r.err


@pytest.mark.parametrize("cmd", [["model", "inspect"], ["plan"]])
def test_a_200k_deep_config_json_is_one_line(tmp_path: Path, cmd: list[str]) -> None:
    p = tmp_path / "config.json"
    p.write_text("[" * 200_000 + "]" * 200_000)
    _expect([*cmd, "--model-config", str(p)], "model.config_path", "nests too deeply")


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_a_spec_file_that_is_not_utf8_is_one_line(tmp_path: Path, suffix: str) -> None:
    p = tmp_path / f"spec{suffix}"
    p.write_bytes(
        b'[model]\npreset = "gpt\xff"\n' if suffix == ".toml" else b"model:\n  preset: \xff\n"
    )
    _expect(["plan", "--spec", str(p)], "--spec", "UTF-8")


def test_out_under_a_file_or_a_dangling_symlink_is_one_line(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    _expect(["write", *TINY, "--out", str(f / "bundle")], "--out", "Not a directory")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone" / "dir")
    _expect(["write", *TINY, "--out", str(link)], "--out", "does not exist")
    _expect(["write", *TINY, "--out", "/proc/dtrain-no-such/bundle"], "--out")


def test_run_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    _expect(["launch", *TINY, "--run-dir", str(f)], "--run-dir", "not a directory")
    _expect(["launch", *TINY, "--run-dir", str(f / "run")], "--run-dir", "not a directory")


def test_a_full_disk_in_write_is_one_line(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "small", "64k") as mnt:
        (mnt / "filler").write_bytes(b"\0" * 48 * 1024)
        err = _expect(["write", *TINY, "--out", str(mnt / "bundle")], "--out", "no space left")
        assert str(mnt / "bundle") in err
        # No temporary file is left behind by the atomic writes.
        assert not [p for p in (mnt / "bundle").glob(".*.tmp")]


@pytest.mark.parametrize(
    ("exc", "needle"),
    [
        (PermissionError(13, "Permission denied", "/x/y"), "/x/y: Permission denied"),
        (RecursionError("maximum recursion depth exceeded"), "nests too deeply"),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "not UTF-8"),
    ],
)
def test_main_turns_an_escaping_system_error_into_one_line(
    exc: BaseException, needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cli.plan_cmd as plan_cmd

    def boom(args: object) -> int:
        raise exc

    monkeypatch.setattr(plan_cmd, "run", boom)
    _expect(["plan", "--model", "gpt2"], needle)


# ------------------------------------------------------------ regressions: issue 10, point 17


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (
            ["write", "--model", "gpt2", "--hosts=-oBatchMode", "--print", "hostfile"],
            ("launch.hosts",),
        ),
        (["write", "--model", "gpt2", "--hosts=root@-x", "--print", "hostfile"], ("launch.hosts",)),
        (
            ["write", "--model", "gpt2", "--master-addr=10.0.0.1\n", "--print", "README.md"],
            ("launch.master_addr",),
        ),
        (["plan", "--model", "gpt2", "--lr", "nan"], ("training.lr", "finite")),
        (["plan", "--model", "gpt2", "--price", "nan"], ("training.price_per_gpu_hour", "finite")),
        (["plan", "--model", "gpt2", "--price", "inf"], ("training.price_per_gpu_hour", "finite")),
        (
            [
                "write",
                "--model",
                "gpt2",
                "--micro-batch",
                "1000",
                "--global-batch",
                "8",
                "--print",
                "README.md",
            ],
            ("training.micro_batch", "training.global_batch"),
        ),
        (["plan", *TINY, "--global-batch", "8", "--layers", "٣"], ("--layers", "0-9")),
        (["plan", "--model", "gpt2", "--layers", "1"], ("model.layers", "preset")),
        (["model", "inspect", "gpt2", "--layers", "1"], ("model.layers", "preset")),
    ],
)
def test_accepted_but_wrong_inputs_are_refused(argv: list[str], needles: tuple[str, ...]) -> None:
    _expect(argv, *needles)


def test_a_forced_micro_batch_that_makes_the_plan_train_another_batch_is_refused() -> None:
    # micro 8 x dp 2 = 16 per step for a global batch of 8: the bundle would train 16.
    _expect(
        ["write", *TINY, "--global-batch", "8", "--micro-batch", "8", "--print", "README.md"],
        "training.global_batch",
        "micro_batch",
    )


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (
            "model:\n  layers: yes\n  hidden: 64\n  heads: 2\n  vocab: 9\n",
            ("model.layers", "not true"),
        ),
        ("model:\n  preset: gpt2\n  preset: llama-3-8b\n", ("--spec", "duplicate key 'preset'")),
    ],
)
def test_yaml_bools_as_numbers_and_duplicate_keys_are_refused(
    tmp_path: Path, text: str, needles: tuple[str, ...]
) -> None:
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    _expect(["plan", "--spec", str(p)], *needles)


def test_grad_clip_inf_never_reaches_ds_config(tmp_path: Path) -> None:
    p = tmp_path / "spec.toml"
    p.write_text(
        '[model]\npreset = "gpt2"\n[training]\ngrad_clip = inf\n[layout]\nframework = "deepspeed"\n'
    )
    _expect(
        ["write", "--spec", str(p), "--print", "ds_config.json"], "training.grad_clip", "finite"
    )


@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_launch_of_a_bundle_refuses_a_bad_hang_timeout(tmp_path: Path, value: str) -> None:
    bundle = tmp_path / "b"
    assert run_cli(["write", *TINY, "--out", str(bundle)]).code == 0
    _expect(["launch", str(bundle), f"--hang-timeout={value}"], "launch.hang_timeout_s")


def test_ssh_backend_without_hosts_asks_for_hosts(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    assert run_cli(["write", *TINY, "--out", str(bundle)]).code == 0
    err = _expect(["launch", str(bundle), "--backend", "ssh"], "--hosts", "one host per node")
    assert "max_workers" not in err


def test_the_start_it_hint_is_shell_quoted(tmp_path: Path) -> None:
    out = tmp_path / "my runs $HOME" / "b;x"
    r = run_cli(["write", *TINY, "--out", str(out)])
    assert r.code == 0, r.err
    hint = next(x for x in r.out.splitlines() if x.startswith("start it:"))
    words = shlex.split(hint.split("(", 1)[0].removeprefix("start it:"))
    assert words == ["dtrain-tui", "launch", str(out)]


def test_help_shows_no_internal_field_names() -> None:
    for cmd in (["launch"], ["write"], ["plan"], ["profiles", "save"], ["model", "inspect"]):
        r = run_cli([*cmd, "--help"])
        assert r.code == 0
        assert "__" not in r.out, [x for x in r.out.splitlines() if "__" in x]
        assert "LAUNCH" not in r.out and "MODEL_" not in r.out

"""Property: any valid spec saved as a profile reads back equal, from a fresh file and when
written over a hand-edited one (whose comments all survive)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.plan.names import Backend, NetworkTier, Optimizer, Precision, Recompute, Strategy
from engine.plan.specs import (
    HardwareSpec,
    LaunchSpec,
    LayoutSpec,
    ModelSpec,
    NetworkSpec,
    Spec,
    TrainingSpec,
)
from profiles.schema import find_secret
from profiles.store import ProfileStore

# Free text a person might put in a profile: quotes, backslashes, unicode, '#', '=', newlines.
TEXT = st.text(
    st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\x00"), max_size=30
)
LINE = TEXT.filter(lambda s: "\n" not in s)
NAME = st.from_regex(r"[A-Z_][A-Z0-9_]{0,12}", fullmatch=True)
HOST = st.from_regex(r"(?:[a-z]{1,6}@)?[a-z][a-z0-9.\-]{0,10}(?::[1-9][0-9]{0,3})?", fullmatch=True)
opt = st.none().__or__


def _model() -> st.SearchStrategy[ModelSpec]:
    dims = st.builds(
        lambda layers, heads, mult, vocab: ModelSpec(
            layers=layers, hidden=heads * mult, heads=heads, vocab=vocab
        ),
        st.integers(1, 96),
        st.integers(1, 64),
        st.integers(8, 128),
        st.integers(2, 300_000),
    )
    presets = st.sampled_from(["llama-3-8b", "mixtral-8x7b", "gpt2"]).map(
        lambda p: ModelSpec(preset=p)
    )
    params = st.floats(1e6, 1e12).map(lambda p: ModelSpec(params=p))
    return st.one_of(dims, presets, params)


SPECS = st.builds(
    Spec,
    model=_model(),
    hardware=st.builds(
        HardwareSpec,
        gpu=st.sampled_from(["cpu", "h100-sxm", "a100-80gb", "H100", "mi300x"]),
        gpus_per_node=st.integers(1, 16),
        nodes=st.integers(1, 64),
        cpu_ram_gb=opt(st.floats(1, 4096)),
    ),
    network=st.builds(
        NetworkSpec,
        tier=st.sampled_from(list(NetworkTier)),
        bandwidth_gbps=opt(st.floats(1, 3200)),
        socket_ifname=opt(st.sampled_from(["eth0", "^lo,docker", "ens5"])),
    ),
    training=st.builds(
        TrainingSpec,
        seq_len=st.integers(1, 1 << 20),
        global_batch=st.integers(1, 4096),
        micro_batch=opt(st.integers(1, 64)),
        precision=opt(st.sampled_from(list(Precision))),
        optimizer=st.sampled_from(list(Optimizer)),
        recompute=opt(st.sampled_from(list(Recompute))),
        lr=opt(st.floats(1e-6, 1.0)),
        tokens=opt(st.floats(1e6, 1e13)),
        steps=st.integers(1, 10_000),
    ),
    layout=st.builds(
        LayoutSpec,
        strategy=opt(st.sampled_from(list(Strategy))),
        tp=opt(st.integers(1, 8)),
        pp=opt(st.integers(1, 8)),
        zero_stage=opt(st.integers(0, 3)),
    ),
    launch=st.builds(
        LaunchSpec,
        backend=st.sampled_from(list(Backend)),
        hosts=st.lists(HOST, max_size=4),
        master_port=st.integers(1, 65535),
        ssh_user=opt(st.from_regex(r"[a-z]{1,8}", fullmatch=True)),
        identity_file=opt(st.sampled_from(["~/.ssh/id_ed25519", "/keys/a b/id_rsa"]).map(Path)),
        remote_workdir=LINE.filter(bool),
        remote_setup=opt(TEXT),
        script_args=st.lists(LINE, max_size=4),
        env=st.dictionaries(NAME, LINE, max_size=4),
        hang_timeout_s=st.floats(0.5, 1e5),
        sky_autostop_min=opt(st.integers(0, 600)),
    ),
)

HAND = """\
# hand-written; every comment here must survive
schema_version = 2  # version

[profile]  # meta
name = "x"

[model]
layers = 2   # tiny
hidden = 64
heads = 2
vocab = 100

[hardware]
# which machines
gpu = "cpu"

[launch]
backend = "local"  # for now
"""


def _no_secret(spec: Spec) -> bool:
    data: Any = spec.model_dump(mode="json", exclude_none=True)
    return find_secret(data) is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=SPECS.filter(_no_secret))
def test_any_spec_round_trips(spec: Spec) -> None:
    with tempfile.TemporaryDirectory() as d:
        store = ProfileStore(Path(d))
        store.save_spec("p", spec)
        assert store.load("p").spec == spec
        # over a hand-edited file: the same spec, and every comment kept
        store.user_path("p").write_text(HAND)
        store.save_spec("p", spec)
        assert store.load("p").spec == spec
        text = store.user_path("p").read_text()
        for comment in ("# hand-written", "# version", "# meta", "# which machines"):
            assert comment in text
        if spec.model.layers is not None:  # the key stays, so its comment does
            assert "# tiny" in text

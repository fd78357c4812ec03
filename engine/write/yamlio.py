"""Deterministic YAML output: keys in insertion order, multi-line strings as literal blocks
(``run: |``), so written YAML reads like one written by hand and diffs cleanly. Every string is
written by :func:`engine.write.quoting.yaml_scalar`: one holding a character YAML reads as a line
break or refuses (``\r``, ``\x85``, U+2028, U+2029, controls) is double-quoted and escaped."""

from __future__ import annotations

from typing import Any

import yaml

from engine.write.quoting import yaml_scalar


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(str, yaml_scalar)


def dump_yaml(data: Any) -> str:
    """``data`` as block-style YAML in insertion order."""
    text: str = yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=100,
    )
    return text

"""engine.errors.one_line: the single line every surface shows for an exception."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from engine.errors import DtrainError, one_line


class _Port(BaseModel):
    port: int


def test_an_exception_without_a_message_is_named_by_its_type() -> None:
    assert one_line(RuntimeError()) == "RuntimeError"
    assert one_line(KeyboardInterrupt()) == "KeyboardInterrupt"
    assert one_line(DtrainError("")) == "DtrainError"


def test_a_message_is_kept_as_it_is() -> None:
    assert one_line(ValueError("no GPU named 'h1000'")) == "no GPU named 'h1000'"
    assert one_line(DtrainError("not a number", field="hardware.nodes")) == (
        "hardware.nodes: not a number"
    )


def test_a_validation_error_is_one_line_naming_each_field() -> None:
    with pytest.raises(ValidationError) as info:
        _Port.model_validate({"port": "x", "extra": 1})
    line = one_line(info.value, "launch")
    assert "\n" not in line and line.startswith("launch.port: ")

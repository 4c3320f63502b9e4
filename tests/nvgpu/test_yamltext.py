"""The YAML emitter: everything it writes loads back unchanged, and ambiguous strings are quoted."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from nvgpu.yamltext import dump, scalar_text

TRICKY = [
    "", "true", "yes", "on", "null", "~", "1.0", "0.1.0", "50m", "1e3", "0x1F", "0o17", "1:20", "2026-11-30", "+1",
    "-", "--x", "a: b", "x #y", "@x", "*ref", "&a", "!tag", "%x", "{x}", "[x]", "a,b", "'q'", '"q"', "key:", "=", "y",
    "ü", "nvidia.com/gpu=present:NoSchedule", "registry:5000/a/b:1.2", ".inf",
]


@pytest.mark.parametrize("text", TRICKY)
def test_strings_round_trip(text: str) -> None:
    assert yaml.safe_load(dump({"k": text, "l": [text]})) == {"k": text, "l": [text]}


@pytest.mark.parametrize("text", ["1e3", "0o17", "y", "N", "1.5"])
def test_strings_that_other_yaml_readers_take_for_numbers_are_quoted(text: str) -> None:
    assert scalar_text(text).startswith('"')


@pytest.mark.parametrize(
    "text", ["a\nb\n", "a\nb", "a\n\n", "  lead\n", "trail \nx\n", "\ttab\n", "x\r\ny", "\n", "a\n\n\nb\n", "a\n b\n"]
)
def test_multiline_strings_round_trip(text: str) -> None:
    assert yaml.safe_load(dump({"k": text, "l": [text]})) == {"k": text, "l": [text]}


def test_scripts_are_literal_blocks() -> None:
    assert dump({"content": "#!/bin/bash\necho ok\n"}) == "content: |\n  #!/bin/bash\n  echo ok\n"


@pytest.mark.parametrize(
    "data",
    [
        {},
        [],
        {"a": {}, "b": [], "c": None, "d": True, "e": 3, "f": 1.5, "g": [[1, 2], [], {}], "h": [{"x": [{"y": 1}]}]},
        [{"a": 1, "b": {"c": [1, "2"]}}],
    ],
)
def test_structures_round_trip(data: Any) -> None:
    assert yaml.safe_load(dump(data)) == data


def test_unsupported_values_are_refused() -> None:
    with pytest.raises(TypeError):
        dump({"a": object()})
    with pytest.raises(ValueError, match="non-finite"):
        dump({"a": float("nan")})

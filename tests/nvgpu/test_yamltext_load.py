"""The bounded config reader (:func:`nvgpu.yamltext.load`) and the emitter's full-match quoting.

``yaml.safe_load`` has no limits: a 5,000-digit integer raises ``ValueError`` from ``int()`` (Python's
int-string limit), a few hundred bytes of nested aliases expand to gigabytes in whatever walks the data,
``!!bool maybe`` raises ``KeyError`` and ``2026-13-45`` ``ValueError``, 10,000 nested brackets a
``RecursionError``. :func:`load` turns each into a :class:`YamlLoadError` naming the path, the line and
the column, with a bounded message.
"""

from __future__ import annotations

import re
import time

import pytest
import yaml
from hypothesis import given

from nvgpu.yamltext import MAX_DEPTH, MAX_EXPANDED_NODES, YamlLoadError, dump, load
from tests.kit import nastyyaml


def _refused(text: str, *, aliases: bool = False) -> str:
    started = time.monotonic()
    with pytest.raises(YamlLoadError) as caught:
        load(text, "cfg", aliases=aliases)
    assert time.monotonic() - started < 1
    assert len(str(caught.value)) <= 2000
    return str(caught.value)


def test_it_reads_what_safe_load_reads() -> None:
    text = "a: 1\nb: [x, 2.5, true, null, '3']\nc: {d: 2026-01-02}\n<<: {e: 1}\n"
    assert load(text, "cfg") == yaml.safe_load(text)
    assert load("", "cfg") is None


def test_a_5000_digit_integer_is_refused_at_its_path() -> None:
    assert _refused("a:\n  b: [1, " + "9" * 5000 + "]\n") == (
        "cfg: a.b[1] (line 2, column 10): an integer of 5000 characters is out of range (at most 32 characters)")


def test_aliases_are_refused_where_the_format_does_not_need_them() -> None:
    assert _refused("a: &x 1\nb: *x\n") == (
        "cfg: b (line 2, column 4): aliases (*x) are not allowed in this format: write the value out in full")
    assert load("a: &x 1\nb: *x\n", "cfg", aliases=True) == {"a": 1, "b": 1}


def test_an_alias_bomb_is_refused_by_its_expanded_size_where_aliases_are_allowed() -> None:
    text = nastyyaml.render({"bomb": nastyyaml.Bomb(9)})
    assert len(text) < 600
    assert f"expands to more than {MAX_EXPANDED_NODES} values through its aliases" in _refused(text, aliases=True)


def test_an_alias_inside_its_own_anchor_is_refused() -> None:
    assert "is inside the node it names" in _refused("a: &x [1, *x]\n", aliases=True)


def test_deep_nesting_is_refused() -> None:
    assert f"nested deeper than {MAX_DEPTH} levels" in _refused("a: " + "[" * 500 + "]" * 500 + "\n")
    assert "not valid YAML" in _refused("[" * 100_000)


@pytest.mark.parametrize(("text", "expected"), [
    ("a: !!int abc\n", "cfg: a (line 1, column 4): 'abc' is not a valid int"),
    ("a: !!bool maybe\n", "cfg: a (line 1, column 4): 'maybe' is not a valid bool"),
    ("a: 2026-13-45\n", "cfg: a (line 1, column 4): '2026-13-45' is not a valid timestamp (month must be in 1..12)"),
    ("a: !!timestamp x\n", "cfg: a (line 1, column 4): 'x' is not a valid timestamp"),
    ("a: !local x\n", "cfg: a (line 1, column 4): the tag '!local' is not allowed"),
    ("? [a]\n: b\n", "cfg: line 1, column 3: a mapping key must be a plain value, not a list or a mapping"),
    ("a: \x07\n", "cfg: character 4: not valid YAML: the character #x0007 is not allowed"),
    ("a: \ud800\n", "cfg: character 4: not text: a lone surrogate cannot be encoded as UTF-8"),
    ("a: [\n", "cfg: line 2, column 1: not valid YAML: while parsing a flow node"),
    ("a: 1\n---\nb: 2\n", "cfg: line 2, column 1: not valid YAML: expected a single document"),
])
def test_what_safe_load_raises_on_is_a_load_error(text: str, expected: str) -> None:
    assert _refused(text).startswith(expected)


def test_size_is_bounded() -> None:
    assert _refused("x" * (2 << 20)).startswith("cfg: 2097152 characters is too long for a config")


def test_a_key_ending_in_a_newline_is_quoted_by_the_emitter() -> None:
    """``re.match`` with ``$`` took ``a\\n`` for a plain scalar: the key was written bare, and read back as
    ``a`` with the newline gone."""
    for data in ({"a\n": 1}, {"b": {"key\n": "v"}}, ["x\n"]):
        assert yaml.safe_load(dump(data)) == data
        assert yaml.safe_load(dump(data, single_quotes=True)) == data


LOCATED = re.compile(r"cfg: \S")


@nastyyaml.SETTINGS
@given(text=nastyyaml.documents([{"a": [1, "x", {"b": None}], "c": {"d": 2.5}}]))
def test_any_text_is_read_or_refused_within_bounds(text: str) -> None:
    nastyyaml.check_bounded(lambda: load(text, "cfg"), YamlLoadError, LOCATED, lambda e: [str(e)])
    nastyyaml.check_bounded(lambda: load(text, "cfg", aliases=True), YamlLoadError, LOCATED, lambda e: [str(e)])

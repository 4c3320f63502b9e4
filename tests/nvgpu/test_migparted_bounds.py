"""mig-parted configs that crashed or exhausted the parser, and values that slipped past its patterns.

Found by fuzzing: a 5,000-digit GPU index gave a ``ValueError`` traceback (Python's int-string limit);
a YAML alias bomb of about 500 bytes took 19 s and ended in ``MemoryError``, the error message writing
out the expanded list; a profile or PCI ID ending in a newline passed ``re.match(...$)``. Each is now a
:class:`MigPartedError` naming the path, quickly and in a bounded message.
"""

from __future__ import annotations

import time

import pytest

from nvgpu.migparted import MigPartedError, load_config_text, parse_config


def _refused(text: str) -> str:
    started = time.monotonic()
    with pytest.raises(MigPartedError) as caught:
        load_config_text(text, "mig.yaml")
    assert time.monotonic() - started < 1
    assert len(str(caught.value)) <= 2000
    return str(caught.value)


def alias_bomb(levels: int = 9) -> str:
    """A config whose ``devices`` expands to 9**levels integers through nested anchors and aliases."""
    anchors = ["&a0 [0,0,0,0,0,0,0,0,0]"]
    anchors += [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return ("version: v1\nmig-configs:\n  bomb:\n  - mig-enabled: false\n    devices: [" + ", ".join(anchors)
            + "]\n")


def test_the_alias_bomb_is_small() -> None:
    assert len(alias_bomb()) < 600


def test_an_alias_bomb_is_refused_quickly_with_a_bounded_message() -> None:
    message = _refused(alias_bomb())
    assert message == ("mig.yaml: mig-configs.bomb[0].devices[1][0] (line 5, column 45): aliases (*a0) are not "
                       "allowed in this format: write the value out in full")


def test_a_5000_digit_gpu_index_is_a_config_error() -> None:
    message = _refused("version: v1\nmig-configs:\n  x:\n  - mig-enabled: false\n    devices: [" + "1" * 5000 + "]\n")
    assert message == ("mig.yaml: mig-configs.x[0].devices[0] (line 5, column 15): an integer of 5000 characters is "
                       "out of range (at most 32 characters)")


def test_a_5000_digit_count_given_as_data_is_shown_by_size() -> None:
    with pytest.raises(MigPartedError) as caught:
        parse_config({"version": "v1", "mig-configs": {"x": [
            {"devices": [10**4999, 10**4999], "mig-enabled": False}]}})
    assert "devices lists GPU index an integer of about 5000 digits twice" in str(caught.value)


@pytest.mark.parametrize(("entry", "where"), [
    ("{devices: all, mig-enabled: true, mig-devices: {\"1g.10gb\\n\": 7}}", "mig-devices profile '1g.10gb\\n'"),
    ("{devices: all, mig-enabled: false, device-filter: \"0x233010DE\\n\"}", "device-filter '0x233010DE\\n'"),
])
def test_values_ending_in_a_newline_are_refused(entry: str, where: str) -> None:
    assert where in _refused(f"version: v1\nmig-configs:\n  x:\n  - {entry}\n")


def test_a_config_name_ending_in_a_newline_is_refused() -> None:
    message = _refused('version: v1\nmig-configs:\n  "all-1g.10gb\\n":\n  - {devices: all, mig-enabled: false}\n')
    assert "config name 'all-1g.10gb\\n' is not usable as a label value" in message


def test_a_long_value_is_quoted_cut() -> None:
    message = _refused("version: v1\nmig-configs:\n  x:\n  - {devices: all, mig-enabled: false, device-filter: "
                       + "x" * 100_000 + "}\n")
    assert "(100000 characters)" in message

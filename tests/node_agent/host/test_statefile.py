"""The agent's one state-file format (node_agent.host.statefile), shared by the MIG journal and the DRA checkpoint."""

from __future__ import annotations

import json

import pytest

from node_agent.host import statefile
from node_agent.host.atomic import content_checksum


def test_round_trip_keeps_the_data_and_checks_it() -> None:
    raw = statefile.encode({"phase": "layout", "gpus": [1, 2]}, 3)
    doc = json.loads(raw)
    assert doc == {"version": 3, "checksum": content_checksum(doc["data"]), "data": {"phase": "layout", "gpus": [1, 2]}}
    assert statefile.decode(raw, 3) == (3, {"phase": "layout", "gpus": [1, 2]})


def test_an_older_format_is_read_and_a_newer_one_refused() -> None:
    raw = statefile.encode({"a": 1}, 2)
    assert statefile.decode(raw, 5) == (2, {"a": 1})
    with pytest.raises(statefile.StateFileProblem, match="format version 2 was written by a newer agent; this agent "
                                                         "reads up to 1"):
        statefile.decode(raw, 1)


def test_fields_a_newer_agent_adds_keep_the_checksum_valid() -> None:
    """The checksum covers the data as stored, not as this agent's model would write it (NVIDIA issue #1080)."""
    data = {"known": 1, "addedLater": {"x": True}}
    assert statefile.decode(statefile.encode(data, 1), 1)[1] == data


@pytest.mark.parametrize(("raw", "problem"), [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "no data object"),
    (b'{"version": 1, "data": []}', "no data object"),
    (b'{"data": {}, "checksum": "x"}', "no format version"),
    (b'{"version": true, "data": {}}', "no format version"),
    (b'{"version": 1, "data": {"a": 1}, "checksum": "sha256:00"}', "checksum mismatch"),
])
def test_a_file_that_must_not_be_acted_on_says_why(raw: bytes, problem: str) -> None:
    with pytest.raises(statefile.StateFileProblem, match=problem):
        statefile.decode(raw, 1)


def test_one_changed_byte_is_caught() -> None:
    raw = statefile.encode({"phase": "approval"}, 1).replace(b"approval", b"layout")
    with pytest.raises(statefile.StateFileProblem, match="checksum mismatch"):
        statefile.decode(raw, 1)

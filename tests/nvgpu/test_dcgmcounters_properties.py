"""dcgm-exporter counters files: any text is read or refused with a bounded :class:`CountersError`.

The stack config's ``cluster.monitoring.counters`` and the agent's exporter both read this format. A
refused line used to be quoted whole (a 1 MiB line made a 1 MiB error); a field name is now matched
whole (``fullmatch``) and at most 80 characters after ``DCGM_``.
"""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from nvgpu import dcgmcounters
from nvgpu.dcgmcounters import CountersError, read
from tests.kit import nastyyaml

LOCATED = re.compile(r"counters( line \d+)?: \S")
VALID_LINES = [line for line in dcgmcounters.default_text().splitlines() if line.strip()][:40]

lines = st.one_of(
    st.sampled_from(VALID_LINES),
    st.sampled_from(VALID_LINES).flatmap(lambda line: st.sampled_from(nastyyaml.SUFFIXES).map(lambda s: line + s)),
    st.sampled_from(["# comment", "", "   ", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL, histogram, x",
                     "dcgm_fi_dev_gpu_util, gauge, lower case", ",,,", "DCGM_, gauge, empty name"]),
    st.tuples(st.text(max_size=40), st.sampled_from(["gauge", "counter", "label", "x"]), st.text(max_size=40))
    .map(", ".join),
    nastyyaml.long_text,
    st.integers(1, 5000).map(lambda n: "DCGM_" + "A" * n + ", gauge, long name"),
    st.text(max_size=80),
)
texts = st.tuples(st.lists(lines, max_size=30), st.sampled_from(["\n", "\r\n", "\r", "\x0b", "\u2028"])).map(
    lambda t: t[1].join(t[0]))


def _problems(e: Exception) -> list[str]:
    return [str(e)]


@nastyyaml.SETTINGS
@given(text=texts)
def test_any_counters_text_is_read_or_refused_within_bounds(text: str) -> None:
    nastyyaml.check_bounded(lambda: read(text, "counters"), CountersError, LOCATED, _problems)


def test_a_one_mebibyte_line_is_quoted_cut() -> None:
    try:
        read("DCGM_FI_DEV_GPU_UTIL, gauge, ok\n" + "x" * (1 << 20) + "\n", "counters")
    except CountersError as e:
        assert len(str(e)) < 300, len(str(e))
        assert str(e).startswith("counters line 2: 'xxxx")
        assert "(1048576 characters)" in str(e)
    else:
        raise AssertionError("accepted")


def test_a_field_name_of_5000_capitals_is_refused_in_a_short_message() -> None:
    try:
        read("DCGM_" + "A" * 5000 + ", gauge, x\n", "counters")
    except CountersError as e:
        assert len(str(e)) < 400, len(str(e))
        assert "is not a DCGM field name (DCGM_ and up to 80 capitals" in str(e)
    else:
        raise AssertionError("accepted")

"""Global options may follow the command, as users type them (``node_agent check --json``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.cli import build_parser


def test_global_options_are_accepted_after_the_command(tmp_path: Path) -> None:
    before = build_parser("check").parse_args(["--host-root", str(tmp_path), "--json", "check"])
    after = build_parser("check").parse_args(["check", "--json", "--host-root", str(tmp_path)])
    assert (after.json, after.host_root) == (before.json, before.host_root) == (True, str(tmp_path))


def test_a_value_before_the_command_is_kept_when_not_repeated(tmp_path: Path) -> None:
    args = build_parser("check").parse_args(["--host-root", str(tmp_path), "--nvml", "simulated:l4x2", "check"])
    assert (args.host_root, args.nvml, args.json) == (str(tmp_path), "simulated:l4x2", False)
    later = build_parser("check").parse_args(["--nvml", "real", "check", "--nvml", "simulated:l4x2"])
    assert later.nvml == "simulated:l4x2"  # after the command wins, as the last value given


def test_subcommands_take_them_too_and_keep_their_own(tmp_path: Path) -> None:
    args = build_parser("mig").parse_args(["mig", "assert", "--config", "c.yaml", "--name", "all-disabled",
                                           "--host-root", str(tmp_path), "--json"])
    assert (args.host_root, args.json, args.name) == (str(tmp_path), True, "all-disabled")


def test_an_unknown_option_after_the_command_is_still_a_usage_error() -> None:
    with pytest.raises(SystemExit) as e:
        build_parser("check").parse_args(["check", "--no-such-option"])
    assert e.value.code == 2

"""The preview's speed-ups change nothing but time: same YAML text, same collector settings afterwards."""

from __future__ import annotations

import gc

import yaml

from nvgpu.migparted import MigConfigSpec, build_config
from preview import engine
from preview.engine import program_gc, run_in_engine


def test_mig_config_yaml_is_pure_pythons_text() -> None:
    custom = {"custom-g-1234abcd": [MigConfigSpec(devices=[0, 1], mig_enabled=True, mig_devices={"1g.10gb": 7}),
                                    MigConfigSpec(devices="all", mig_enabled=False, mig_devices={})]}
    cfg = build_config(None, custom)
    expected = yaml.dump(cfg.to_yaml_dict(), Dumper=yaml.SafeDumper, sort_keys=False, default_flow_style=False)
    assert cfg.to_yaml() == expected
    assert "'0x" in expected  # device filters stay single-quoted, as PyYAML writes them


def test_program_gc_restores_the_collector_even_when_nested_or_failing() -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    try:
        with program_gc():
            outer = gc.get_threshold()
            assert outer[0] > before[0]
            assert gc.get_freeze_count() > 0
            with program_gc():
                assert gc.get_threshold() == outer
                raise RuntimeError("program failed")
    except RuntimeError:
        pass
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == frozen


def test_run_in_engine_restores_the_collector() -> None:
    before = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []
    run_in_engine(lambda: seen.append(gc.get_threshold()))
    assert seen and seen[0][0] > before[0]
    assert gc.get_threshold() == before


class _Innermost:
    def __init__(self) -> None:
        self.traces = (engine._SDK_STACK_TRACE(), engine.stack_trace())


class _Middle:
    def __init__(self) -> None:
        self.inner = _Innermost()


class _Outer:
    def __init__(self) -> None:
        self.inner = _Middle()


def _registered_from_a_helper() -> _Outer:
    return _Outer()


def test_stack_trace_is_the_sdks_message() -> None:
    sdk, ours = _registered_from_a_helper().inner.inner.traces
    assert len(sdk.frames) > 2 and sdk == ours
    assert sdk.frames[0].pc.uri.endswith("test_preview_speedups.py")


def test_stack_trace_is_empty_without_three_constructors() -> None:
    assert engine._SDK_STACK_TRACE() == engine.stack_trace()
    assert len(engine.stack_trace().frames) == 0

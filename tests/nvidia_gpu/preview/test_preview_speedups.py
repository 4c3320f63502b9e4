"""The preview's speed-ups change nothing but time: same YAML text, same collector settings afterwards."""

from __future__ import annotations

import copy
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from nvgpu.migparted import MigConfigSpec, MigPartedConfig, build_config, load_config_text
from nvgpu.yamltext import single_quoted_text
from nvidia_gpu.preview import crds, validate
from nvidia_gpu.preview.engine import program_gc, run_in_engine
from nvidia_gpu.preview.pipeline import DEFAULT_STEPS, run_preview
from nvidia_gpu.sdk import stacktraces

ROOT = Path(__file__).resolve().parents[3]


def _pyyaml(cfg: MigPartedConfig) -> str:
    return yaml.dump(cfg.to_yaml_dict(), Dumper=yaml.SafeDumper, sort_keys=False, default_flow_style=False)


def test_mig_config_yaml_is_pyyamls_text() -> None:
    custom = {"custom-g-1234abcd": [MigConfigSpec(devices=[0, 1], mig_enabled=True, mig_devices={"1g.10gb": 7}),
                                    MigConfigSpec(devices="all", mig_enabled=False, mig_devices={})]}
    cfg = build_config(None, custom)
    assert cfg.to_yaml() == _pyyaml(cfg)
    assert "'0x" in cfg.to_yaml()  # device filters stay single-quoted, as PyYAML writes them


def test_nvidias_shipped_mig_config_is_written_as_pyyaml_writes_it() -> None:
    cfg = load_config_text((ROOT / "tests" / "nvgpu" / "nvidia-mig-parted-config-default.yaml").read_text())
    assert len(cfg.mig_configs) > 10
    assert cfg.to_yaml() == _pyyaml(cfg)


def test_single_quoted_text_falls_back_to_double_quotes_for_what_pyyaml_would_not_single_quote() -> None:
    assert single_quoted_text("0x20B010DE") == "'0x20B010DE'"
    assert single_quoted_text("it's: x") == "'it''s: x'"
    assert single_quoted_text("all") == "all"
    assert single_quoted_text(" padded") == '" padded"'
    assert single_quoted_text("tab\there") == '"tab\\there"'


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
        self.traces = (stacktraces.sdk_stack_trace(), stacktraces.stack_trace())


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
    assert stacktraces.sdk_stack_trace() == stacktraces.stack_trace()
    assert len(stacktraces.stack_trace().frames) == 0


def _leaf_mutations(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(path, replacement): every leaf with a value of another type, every object with an unknown key."""
    if isinstance(obj, dict):
        yield (*path, "zzUnknown"), 1
        for key, value in obj.items():
            yield from _leaf_mutations(value, (*path, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _leaf_mutations(value, (*path, i))
    else:
        yield path, ("text" if isinstance(obj, bool | int | float) or obj is None else 7)


def _mutated(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(obj)
    node = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


def test_quick_check_agrees_with_jsonschema_on_the_stacks_manifests_and_their_mutations(tmp_path: Path) -> None:
    result = run_preview(ROOT, "dev", tmp_path, [s for s in DEFAULT_STEPS if s.name in ("config", "program", "render")])
    by_kind: dict[tuple[str, bool], Any] = {}
    for m in result.manifests:
        by_kind.setdefault((m.kind, m.patch), m)
    checked = 0
    drafts: set[type[Any]] = set()
    for m in by_kind.values():
        v = crds.validator(m.api_version, m.kind, m.patch) or validate.builtin_validator(
            "1.34", m.api_version, m.kind)
        assert v is not None
        deferred = validate.DEFERRED.get(type(v))
        if deferred is None:
            continue
        drafts.add(type(v))
        for obj in [m.object] + [_mutated(m.object, p, x) for p, x in _leaf_mutations(m.object)]:
            try:
                quick = validate.quick_valid(v.schema, obj, deferred)
            except validate._Unsupported:
                continue
            assert quick == (next(v.iter_errors(obj), None) is None), (m.filename, obj)
            checked += 1
    assert checked > 400
    assert drafts == {jsonschema.Draft7Validator, jsonschema.Draft202012Validator}  # built-in kinds and CRDs

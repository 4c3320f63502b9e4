"""nvidia_gpu.sdk's contract with the Pulumi SDKs: pinned to the releases it was read against, and every internal
it relies on still there with the shape it needs. A failure here names what an SDK upgrade changed, before
the preview, the policy runner or the component package breaks in a less readable way.
"""

# No ``from __future__ import annotations``: the component provider host reads Probe's annotations at run time.

import ast
import importlib
import inspect
import json
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import pulumi
import pytest
from google.protobuf import struct_pb2
from pulumi.errors import InputPropertiesError
from pulumi.provider import main
from pulumi.provider.experimental.component import ComponentProvider
from pulumi.provider.server import ComponentInitError
from pulumi.runtime import config as sdk_config
from pulumi.runtime import mocks as sdk_mocks
from pulumi.runtime import resource as sdk_resource
from pulumi.runtime import settings as sdk_settings
from pulumi.runtime.proto import analyzer_pb2, resource_pb2, source_pb2
from pulumi.type_token import get_type_token

from nvidia_gpu import sdk
from nvidia_gpu.sdk import analyzer, componenthost, k8stypes, runtime, stacktraces

ROOT = Path(__file__).resolve().parents[3]
ADAPTERS = (ROOT / "nvidia_gpu" / "sdk", ROOT / "nvidia_gpu" / "policies" / "sdk.py")
#: The adapters' own contract tests: they read the internals the adapters use, to pin their shapes.
CONTRACT_TESTS = (Path(__file__).resolve(), ROOT / "tests" / "nvidia_gpu" / "policies" / "test_policy_sdk.py")


def _params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


# --- the pins ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dist", sorted(sdk.PINNED_VERSIONS))
def test_the_adapter_is_pinned_to_the_installed_sdk(dist: str) -> None:
    installed = metadata.version(dist)
    assert installed == sdk.PINNED_VERSIONS[dist], (
        f"{dist} {installed} is installed, nvidia_gpu.sdk was written against {sdk.PINNED_VERSIONS[dist]}: re-read "
        "the internals each nvidia_gpu.sdk module names, then move the pin in nvidia_gpu/sdk/__init__.py")


# --- nothing outside the adapter reaches into the SDKs --------------------------------------------------


def _project_modules() -> Iterator[Path]:
    """The Pulumi side's modules, the program and provider entry points the engine runs, and the tests (but
    the adapters' contract tests): a test that drives the SDK's internals itself breaks on an SDK upgrade the
    contract test does not name."""
    paths = [ROOT / "__main__.py", ROOT / "provider" / "__main__.py", *sorted((ROOT / "nvidia_gpu").rglob("*.py")),
             *sorted((ROOT / "tests").rglob("*.py"))]
    for path in paths:
        if not any(path == a or a in path.parents for a in ADAPTERS) and path not in CONTRACT_TESTS:
            yield path


_SDK_MODULES = ("pulumi", "pulumi_kubernetes")
_INTERNAL_PACKAGES = ("pulumi.runtime", "pulumi.provider")


def _internal(module: str) -> bool:
    """``pulumi.runtime``, ``pulumi.provider`` and what is under them, or a private name of an SDK."""
    top, *rest = module.split(".")
    if any(module == p or module.startswith(f"{p}.") for p in _INTERNAL_PACKAGES):
        return True
    return top in _SDK_MODULES and any(part.startswith("_") for part in rest)


def _reaches_in(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Imports of internals, private names of the SDKs, and ``pulumi.runtime``/``pulumi.provider`` as attributes."""
    aliases: dict[str, str] = {}  # local name -> SDK module it names
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _internal(a.name):
                    yield node.lineno, f"import {a.name}"
                if a.name.split(".")[0] in _SDK_MODULES:
                    if a.asname:  # import pulumi_kubernetes as k8s
                        aliases[a.asname] = a.name
                    else:  # import pulumi.x binds pulumi
                        aliases[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _internal(node.module):
                yield node.lineno, f"from {node.module} import ..."
            elif node.module.split(".")[0] in _SDK_MODULES:
                for a in node.names:
                    if a.name.startswith("_") or _internal(f"{node.module}.{a.name}"):
                        yield node.lineno, f"from {node.module} import {a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            dotted = f"{aliases[node.value.id]}.{node.attr}"
            if node.attr.startswith("_") or _internal(dotted):
                yield node.lineno, dotted


def test_only_the_adapters_reach_into_the_sdks() -> None:
    """What import-linter cannot see: ``pulumi.runtime.x`` after ``import pulumi``, and private names
    (``pulumi_kubernetes.__file__``, ``pulumi._x``)."""
    found = [f"{path.relative_to(ROOT)}:{line}: {what}"
             for path in _project_modules() for line, what in _reaches_in(ast.parse(path.read_text()))]
    assert not found, "Pulumi internals outside nvidia_gpu.sdk:\n" + "\n".join(found)


def test_the_scan_sees_each_kind_of_reach() -> None:
    source = ("import pulumi\nimport pulumi_kubernetes as k8s\nfrom pulumi.runtime import mocks\n"
              "from pulumi import _utils\nx = pulumi.runtime.test\ny = k8s.__file__\nz = pulumi.Output\n")
    assert sorted(what for _, what in _reaches_in(ast.parse(source))) == [
        "from pulumi import _utils", "from pulumi.runtime import ...", "pulumi.runtime", "pulumi_kubernetes.__file__"]


# --- runtime: the mock engine and the runtime settings --------------------------------------------------


def test_the_mock_monitor_has_the_hooks_the_echo_monitor_overrides() -> None:
    monitor = sdk_mocks.MockMonitor
    assert _params(monitor.__init__) == ["self", "mocks"]
    assert _params(monitor.make_urn) == ["self", "parent", "type_", "name"]
    assert _params(monitor.RegisterResource) == ["self", "request"]
    assert _params(monitor.ReadResource) == ["self", "request"]
    # Both make the URN through make_urn and the state through the mocks' new_resource, which is what the
    # EchoMonitor's URNs and echo rely on.
    for method in (monitor.RegisterResource, monitor.ReadResource):
        source = inspect.getsource(method)
        assert "self.make_urn(" in source and "self.mocks.new_resource(" in source
    assert sdk_mocks.Mocks.__abstractmethods__ == {"new_resource", "call"}
    args = sdk_mocks.MockResourceArgs(typ="t", name="n", inputs={"a": 1}, provider="", resource_id="")
    assert (args.name, args.inputs) == ("n", {"a": 1})
    assert {"mocks", "project", "stack", "preview", "monitor"} <= set(_params(sdk_mocks.set_mocks))
    assert callable(sdk_mocks.test)


def test_the_register_request_has_the_fields_a_registration_reads() -> None:
    fields = set(resource_pb2.RegisterResourceRequest.DESCRIPTOR.fields_by_name)
    assert {"type", "name", "parent", "custom", "provider", "dependencies", "retainOnDelete",
            "deleteBeforeReplace", "ignoreChanges"} <= fields
    assert "urn" in resource_pb2.RegisterResourceResponse.DESCRIPTOR.fields_by_name


def test_the_runtime_settings_are_there() -> None:
    assert _params(sdk_settings.set_root_resource) == ["root"]
    assert _params(sdk_settings.get_monitor) == [] and _params(sdk_settings.is_dry_run) == []
    assert _params(sdk_config.set_all_config)[0] == "config" and _params(sdk_config.get_config_env) == []
    assert isinstance(sdk_config.CONFIG.get(), dict)


class _Child(pulumi.CustomResource):
    def __init__(self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions) -> None:
        super().__init__("kubernetes:core/v1:ConfigMap", name, props, opts)


class _Parent(pulumi.ComponentResource):
    def __init__(self, name: str) -> None:
        super().__init__("test:index:Parent", name)
        first = _Child("first", {"data": {"a": "1"}}, pulumi.ResourceOptions(parent=self))
        _Child("second", {"n": 2}, pulumi.ResourceOptions(parent=self, depends_on=[first], retain_on_delete=True,
                                                          delete_before_replace=True, ignore_changes=["n"]))


class _Recorder(runtime.EchoMonitor):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[runtime.Registration] = []

    def on_register(self, registration: runtime.Registration) -> None:
        self.seen.append(registration)


def test_a_program_under_the_echo_monitor() -> None:
    monitor = _Recorder()
    runtime.install(monitor, "proj", "dev", {"proj:key": "value"})
    seen_config: list[Any] = []

    def program() -> None:
        seen_config.append((pulumi.Config().get("key"), runtime.program_config().get("proj:key"),
                            runtime.is_preview(), runtime.under_mock_engine()))
        _Parent("p")

    runtime.run_as_program(program)
    assert seen_config == [("value", "value", True, True)]
    by_name = {r.name: r for r in monitor.seen}
    assert sorted(by_name) == ["first", "p", "second"]  # never the root stack
    parent, first, second = by_name["p"], by_name["first"], by_name["second"]
    assert parent.urn == "urn:pulumi:dev::proj::test:index:Parent::p" and parent.parent_urn is not None
    assert parent.parent_urn.endswith(f"::{sdk.ROOT_STACK_TYPE}::proj-dev") and not parent.custom
    assert first.urn == "urn:pulumi:dev::proj::test:index:Parent$kubernetes:core/v1:ConfigMap::first"
    assert first.custom and first.parent_urn == parent.urn and first.inputs == {"data": {"a": "1"}}
    assert second.dependencies == (first.urn,) and second.retain_on_delete and second.delete_before_replace
    assert second.ignore_changes == ("n",) and second.inputs == {"n": 2}


# --- stacktraces ----------------------------------------------------------------------------------------


def test_the_sdk_builds_stack_traces_where_the_adapter_replaces_them() -> None:
    assert _params(stacktraces.sdk_stack_trace) == []
    assert _params(sdk_resource._get_source_position_for_frame) == ["frame"]
    # Called through the module's globals, so the replacement is what every registration runs.
    module = inspect.getsource(sdk_resource)
    assert module.count("_get_stack_trace()") >= 3
    assert "_get_source_position_for_frame(" in inspect.getsource(stacktraces.sdk_stack_trace)
    assert "frames" in source_pb2.StackTrace.DESCRIPTOR.fields_by_name
    assert "pc" in source_pb2.StackFrame.DESCRIPTOR.fields_by_name


# --- analyzer -------------------------------------------------------------------------------------------


class _Channel:
    """Stands in for a gRPC channel: records each call's request and answers from ``responses``."""

    def __init__(self, responses: dict[str, Any]) -> None:
        self.responses = responses
        self.requests: dict[str, Any] = {}

    def unary_unary(self, path: str, **_: Any) -> Any:
        method = path.rsplit("/", 1)[1]
        assert path == f"/pulumirpc.Analyzer/{method}"

        def call(request: Any, timeout: float | None = None, wait_for_ready: bool | None = None) -> Any:
            request.SerializeToString()  # every field set is one the message has
            self.requests[method] = request
            return self.responses.get(method)

        return call

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self.unary_unary(args[0], **kwargs)


class _Resource:
    def __init__(self, urn: str, parent: str = "") -> None:
        self.type, self.urn, self.name, self.props = "kubernetes:apps/v1:Deployment", urn, urn[-1], {"spec": {"a": 1}}
        self.parent, self.dependencies = parent, ("urn:x",)


def test_the_analyzer_stub_speaks_the_protocol_in_plain_values() -> None:
    schema = analyzer_pb2.PolicyConfigSchema(required=["limit"])
    schema.properties.update({"limit": {"type": "integer"}})
    diagnostic = analyzer_pb2.AnalyzeDiagnostic(
        policyName="p", policyPackName="pack", policyPackVersion="1", description="d", message="m",
        enforcementLevel=analyzer_pb2.MANDATORY, urn="urn:a")
    channel = _Channel({
        "GetAnalyzerInfo": analyzer_pb2.AnalyzerInfo(name="pack", version="1", policies=[
            analyzer_pb2.PolicyInfo(name="p", description="d", enforcementLevel=analyzer_pb2.REMEDIATE,
                                    configSchema=schema, policy_type=analyzer_pb2.POLICY_TYPE_STACK)]),
        "Analyze": analyzer_pb2.AnalyzeResponse(diagnostics=[diagnostic]),
        "AnalyzeStack": analyzer_pb2.AnalyzeResponse(diagnostics=[diagnostic]),
    })
    stub = analyzer.AnalyzerStub(channel)  # type: ignore[arg-type]
    stub.handshake(engine_address="e", root_directory="/r", program_directory="/p", timeout=1)
    stub.configure_stack(stack="dev", project="proj", organization="org", dry_run=True, config={"k": "v"}, timeout=1)
    info = stub.get_analyzer_info(timeout=1)
    assert info == analyzer.PackInfo("pack", "1", (analyzer.PolicyInfo(
        "p", "d", "remediate", {"limit": {"type": "integer"}}, ("limit",), True),))
    stub.configure({"p": analyzer.policy_config("disabled", {"limit": 3})}, timeout=1)
    reported = analyzer.ReportedDiagnostic("p", "pack", "1", "d", "m", "mandatory", "urn:a")
    assert stub.analyze(_Resource("urn:a", parent="urn:s"), timeout=1) == [reported]
    assert stub.analyze_stack([_Resource("urn:a"), _Resource("urn:b")], timeout=1) == [reported]
    sent = channel.requests
    assert sent["Handshake"].program_directory == "/p" and sent["ConfigureStack"].config == _struct({"k": "v"})
    assert sent["Configure"].policyConfig["p"].enforcementLevel == analyzer_pb2.DISABLED
    assert sent["Analyze"].options.parent == "urn:s" and sent["Analyze"].properties == _struct({"spec": {"a": 1}})
    stack = sent["AnalyzeStack"].resources
    assert [r.urn for r in stack] == ["urn:a", "urn:b"] and list(stack[0].dependencies) == ["urn:x"]


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


def test_every_level_round_trips() -> None:
    for level in analyzer.LEVELS:
        assert analyzer.policy_level(analyzer.policy_config(level, {})) == level
    assert analyzer.policy_config("advisory", {"a": 1}).properties == _struct({"a": 1})


# --- componenthost --------------------------------------------------------------------------------------


def test_the_component_provider_host_has_the_shape_the_package_uses() -> None:
    assert _params(ComponentProvider.__init__) == ["self", "components", "name", "namespace", "version"]
    assert _params(ComponentProvider.construct) == ["self", "name", "resource_type", "inputs", "options"]
    assert "raise ComponentInitError(" in inspect.getsource(ComponentProvider.construct)
    assert ComponentInitError(ValueError("x")).inner.args == ("x",)
    assert _params(main) == ["provider", "args"]


class ProbeArgs(TypedDict):
    size: NotRequired[int]
    """How big."""


class Probe(pulumi.ComponentResource):
    """A component that refuses a size above 3."""

    def __init__(self, name: str, args: ProbeArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        if args.get("size", 0) > 3:
            raise ValueError("size: at most 3")
        if args.get("size", 0) < 0:
            raise RuntimeError("negative")
        super().__init__("probe:index:Probe", name, {}, opts)


def _problems(error: Exception) -> list[tuple[str, str]] | None:
    return [("size", "at most 3")] if isinstance(error, ValueError) else None


def test_the_host_infers_a_schema_and_reports_input_problems() -> None:
    assert '"probe:index:Probe"' in componenthost.schema([Probe], "probe", "1.2.3")
    host = componenthost.host([Probe], "probe", "1.2.3", _problems)
    with pytest.raises(InputPropertiesError) as refused:
        host.construct("p", "probe:index:Probe", {"size": 4})
    assert refused.value.errors == [{"property_path": "size", "reason": "at most 3"}]
    with pytest.raises(ComponentInitError):
        host.construct("p", "probe:index:Probe", {"size": -1})


class MapProbeArgs(TypedDict):
    settings: dict[str, Any]
    """A settings object the component validates itself."""


class MapProbe(pulumi.ComponentResource):
    """Refuses whatever it gets, quoting it."""

    def __init__(self, name: str, args: MapProbeArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        raise ValueError(json.dumps(args["settings"], sort_keys=True))


def test_the_host_serves_the_refined_schema_and_passes_a_map_through() -> None:
    """The package types its settings objects in the served schema only (nvidia_gpu.sdk.schematypes): the host
    must keep handing a ``dict[str, Any]`` input to the constructor as the engine sent it, keys unrenamed and
    unknown keys kept, for the component's own models to judge."""
    def refine(schema: dict[str, Any]) -> dict[str, Any]:
        return {**schema, "description": "refined"}

    assert json.loads(componenthost.schema([MapProbe], "probe", "1.2.3", refine=refine))["description"] == "refined"
    host = componenthost.host([MapProbe], "probe", "1.2.3", lambda e: [("settings", str(e))], refine=refine)
    assert json.loads(host.schema)["description"] == "refined"  # what GetSchema answers
    sent = {"kubernetesVersion": "1.34", "gpu": {"timeSlicng": {"partitionCount": 4.0}}}
    with pytest.raises(InputPropertiesError) as refused:
        host.construct("p", "probe:index:MapProbe", {"settings": sent})
    assert refused.value.errors is not None and json.loads(refused.value.errors[0]["reason"]) == sent


# --- k8stypes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("module", "kind", "group"), [
    ("core.v1", "Namespace", ""),
    ("apps.v1", "DaemonSetPatch", "apps"),
    ("resource.v1beta2", "DeviceClass", "resource.k8s.io"),
    ("rbac.v1", "ClusterRole", "rbac.authorization.k8s.io"),
])
def test_the_sdk_layout_the_token_table_reads(module: str, kind: str, group: str) -> None:
    """A typed class lives in ``<group's first label>/<version>/<Class>.py`` and declares its token there."""
    cls = getattr(importlib.import_module(f"pulumi_kubernetes.{module}"), kind)
    package, version = module.split(".")
    assert Path(inspect.getfile(cls)) == k8stypes.SDK_DIR / package / version / f"{kind}.py"
    assert version in k8stypes.typed_versions(group, kind)
    token = get_type_token(cls)
    assert token is not None and token in k8stypes.known_type_tokens()
    assert token == f"kubernetes:{group or 'core'}/{version}:{kind}"


def test_the_token_table_is_the_whole_sdk() -> None:
    assert len(k8stypes.known_type_tokens()) > 500
    assert k8stypes.typed_versions("deckhouse.io", "NodeGroup") == ()
    assert k8stypes.typed_versions("resource.k8s.io", "DeviceClass")[:1] == ("v1",)

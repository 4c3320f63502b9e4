"""The analyzer protocol's client side: the SDK's generated messages and stub behind plain values.

The offline policy runner (``nvidia_gpu.preview.policyrun.analyzer_client``) drives the policy pack
over gRPC exactly as the Pulumi CLI does. The protocol's Python bindings ship inside the SDK, as
``pulumi.runtime.proto.analyzer_pb2`` (messages) and ``analyzer_pb2_grpc`` (the stub): generated code,
not API, whose message and field names follow ``analyzer.proto`` of the release. :class:`AnalyzerStub`
makes each call the runner needs from plain values and answers in plain values (:class:`PackInfo`,
:class:`ReportedDiagnostic`); a call's failure is the stub's ``grpc.RpcError``, as the CLI sees it.
Only :func:`policy_config` hands back a message (``PolicyConfig``), which the runner passes on to
:meth:`AnalyzerStub.configure` unchanged. ``tests/nvidia_gpu/sdk`` checks every message, field and
method used here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from google.protobuf import empty_pb2, json_format, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

from nvgpu.protostruct import integral

#: The enforcement levels, as ``PulumiPolicy.yaml`` and ``--policy-pack-config`` spell them.
LEVELS = ("advisory", "mandatory", "remediate", "disabled")
_LEVEL_BY_PROTO = {
    analyzer_pb2.ADVISORY: "advisory",
    analyzer_pb2.MANDATORY: "mandatory",
    analyzer_pb2.REMEDIATE: "remediate",
    analyzer_pb2.DISABLED: "disabled",
}
_PROTO_BY_LEVEL = {v: k for k, v in _LEVEL_BY_PROTO.items()}

#: One policy's resolved ``--policy-pack-config`` (its level and properties), as ``Configure`` sends it.
PolicyConfig = analyzer_pb2.PolicyConfig


class AnalyzerResource(Protocol):
    """One resource as the engine describes it to an analyzer (type token, URN, name, inputs, parent URN and
    the URNs it depends on): what the runner's own resource type provides."""

    @property
    def type(self) -> str: ...
    @property
    def urn(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def props(self) -> Mapping[str, Any]: ...
    @property
    def parent(self) -> str: ...
    @property
    def dependencies(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class PolicyInfo:
    """One policy as ``GetAnalyzerInfo`` describes it; ``config_schema`` is its properties' JSON schema (whole
    numbers as ints: ``Struct`` carries every number as a float)."""

    name: str
    description: str
    enforcement_level: str
    config_schema: Mapping[str, Any]
    required: tuple[str, ...] = ()
    stack_policy: bool = False


@dataclass(frozen=True)
class PackInfo:
    """``GetAnalyzerInfo``'s answer: the pack's name, the version it reports, its policies."""

    name: str
    version: str
    policies: tuple[PolicyInfo, ...]

    def policy(self, name: str) -> PolicyInfo | None:
        return next((p for p in self.policies if p.name == name), None)


@dataclass(frozen=True)
class ReportedDiagnostic:
    """One diagnostic as the pack sent it (``urn`` is empty when ``Analyze`` left it to the analyzed resource)."""

    policy_name: str
    pack_name: str
    pack_version: str
    description: str
    message: str
    enforcement_level: str
    urn: str


def _struct(values: Mapping[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(dict(values))
    return s


def policy_config(level: str, properties: Mapping[str, Any]) -> PolicyConfig:
    """One policy's config as ``Configure`` sends it: ``level`` (one of :data:`LEVELS`) and its properties."""
    pc = analyzer_pb2.PolicyConfig(enforcementLevel=_PROTO_BY_LEVEL[level])
    if properties:
        pc.properties.update(dict(properties))
    return pc


def policy_level(config: PolicyConfig) -> str:
    """The enforcement level a :func:`policy_config` carries (one of :data:`LEVELS`)."""
    return _LEVEL_BY_PROTO[config.enforcementLevel]


def _diagnostics(raw: Iterable[Any]) -> list[ReportedDiagnostic]:
    return [ReportedDiagnostic(
        policy_name=d.policyName,
        pack_name=d.policyPackName,
        pack_version=d.policyPackVersion,
        description=d.description,
        message=d.message,
        enforcement_level=_LEVEL_BY_PROTO.get(d.enforcementLevel, "advisory"),
        urn=d.urn,
    ) for d in raw]


def _resource_options(parent: str) -> Any:
    return analyzer_pb2.AnalyzerResourceOptions(parent=parent)


class AnalyzerStub:
    """The calls the CLI makes to a policy pack, over ``channel`` (the pack's port)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._stub = analyzer_pb2_grpc.AnalyzerStub(channel)

    def handshake(self, *, engine_address: str, root_directory: str, program_directory: str,
                  timeout: float) -> None:
        """``Handshake``, waiting for the pack to listen; a pack that predates it answers UNIMPLEMENTED."""
        self._stub.Handshake(analyzer_pb2.AnalyzerHandshakeRequest(
            engine_address=engine_address, root_directory=root_directory, program_directory=program_directory,
        ), timeout=timeout, wait_for_ready=True)

    def configure_stack(self, *, stack: str, project: str, organization: str, dry_run: bool,
                        config: Mapping[str, str], timeout: float) -> None:
        """``ConfigureStack``: the stack, project, organization and config (full keys to the CLI's strings)."""
        self._stub.ConfigureStack(analyzer_pb2.AnalyzerStackConfigureRequest(
            stack=stack, project=project, organization=organization, dry_run=dry_run, config=_struct(config),
        ), timeout=timeout)

    def get_analyzer_info(self, *, timeout: float) -> PackInfo:
        """``GetAnalyzerInfo``, waiting for the pack to listen."""
        resp = self._stub.GetAnalyzerInfo(empty_pb2.Empty(), timeout=timeout, wait_for_ready=True)
        return PackInfo(resp.name, resp.version, tuple(
            PolicyInfo(
                name=p.name,
                description=p.description,
                enforcement_level=_LEVEL_BY_PROTO[p.enforcementLevel],
                config_schema=integral(json_format.MessageToDict(p.configSchema.properties)),
                required=tuple(p.configSchema.required),
                stack_policy=p.policy_type == analyzer_pb2.POLICY_TYPE_STACK,
            )
            for p in resp.policies
        ))

    def configure(self, policy_config: Mapping[str, PolicyConfig], *, timeout: float) -> None:
        """``Configure``: every policy's config (see :func:`policy_config`)."""
        self._stub.Configure(analyzer_pb2.ConfigureAnalyzerRequest(policyConfig=dict(policy_config)),
                             timeout=timeout)

    def analyze(self, resource: AnalyzerResource, *, timeout: float) -> list[ReportedDiagnostic]:
        """``Analyze`` of one resource."""
        resp = self._stub.Analyze(analyzer_pb2.AnalyzeRequest(
            type=resource.type, urn=resource.urn, name=resource.name, properties=_struct(resource.props),
            options=_resource_options(resource.parent),
        ), timeout=timeout)
        return _diagnostics(resp.diagnostics)

    def analyze_stack(self, resources: Sequence[AnalyzerResource], *, timeout: float) -> list[ReportedDiagnostic]:
        """``AnalyzeStack`` of the whole stack, in one call."""
        resp = self._stub.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(resources=[
            analyzer_pb2.AnalyzerResource(
                type=r.type, urn=r.urn, name=r.name, properties=_struct(r.props), parent=r.parent,
                dependencies=list(r.dependencies), options=_resource_options(r.parent),
            )
            for r in resources
        ]), timeout=timeout)
        return _diagnostics(resp.diagnostics)

"""The one place the Pulumi side touches the Pulumi SDKs' internals, so an SDK upgrade has one place to check.

Everything here leans on something the SDKs do not promise to keep: modules under ``pulumi.runtime``
(its mock engine, its settings, its generated protocol stubs) and ``pulumi.provider`` (the component
provider host), private names of ``pulumi`` and ``pulumi_kubernetes``, and the installed
``pulumi_kubernetes``' file layout. The rest of ``nvidia_gpu`` uses only the SDKs' public API
(``pulumi.ComponentResource``, ``pulumi.Output``, ``pulumi.ResourceOptions``, ``pulumi.Config``, the
typed ``pulumi_kubernetes`` classes) and calls the small functions and classes below for the rest;
``.importlinter`` (contract ``pulumi-internals-in-sdk``) and ``tests/nvidia_gpu/sdk`` hold it to that.

One module per SDK concern:

* :mod:`nvidia_gpu.sdk.runtime`: the mock engine the offline preview and the tests run programs
  under, and the runtime settings a program reads (``pulumi.runtime.mocks``, ``.settings``, ``.config``);
* :mod:`nvidia_gpu.sdk.stacktraces`: the faster stack traces a registration sends
  (``pulumi.runtime.resource``'s private ``_get_stack_trace``, ``pulumi.runtime.proto.source_pb2``);
* :mod:`nvidia_gpu.sdk.analyzer`: the analyzer protocol's messages and stub
  (``pulumi.runtime.proto.analyzer_pb2*``), for the offline policy runner;
* :mod:`nvidia_gpu.sdk.componenthost`: the provider-side component host that serves the components to
  other languages (``pulumi.provider``), and :mod:`nvidia_gpu.sdk.schematypes`, the typed settings objects
  of the schema it serves (JSON Schema as the package schema's types, where the host's inference falls short);
* :mod:`nvidia_gpu.sdk.k8stypes`: which API versions of a kind ``pulumi_kubernetes`` has a typed class
  for, read from the installed SDK's files.

The other half is :mod:`nvidia_gpu.policies.sdk`, the policy pack's adapter to ``pulumi_policy``'s
servicer: it stays inside ``nvidia_gpu.policies``, because the publishable pack is a wheel of that
package alone.

:data:`PINNED_VERSIONS` names the releases this adapter was read against; ``tests/nvidia_gpu/sdk``
fails when the installed ones differ, and checks that every internal used here still has the shape
it needs. This package imports none of its modules, so importing it costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

#: The distributions (as ``importlib.metadata`` names them) whose internals this package uses, and the
#: release of each it was written against. An upgrade re-reads the internals named in each module's
#: docstring, then moves the pin (``tests/nvidia_gpu/sdk/test_contract.py`` says which check failed).
PINNED_VERSIONS: Mapping[str, str] = MappingProxyType({
    "pulumi": "3.272.0",
    "pulumi-kubernetes": "4.34.2",
})

#: The type of a stack's root resource, the parent of every top-level resource (``resource.RootStackType``
#: in the engine): the mock engine does not record it, and the engine sends it first to ``AnalyzeStack``.
ROOT_STACK_TYPE = "pulumi:pulumi:Stack"

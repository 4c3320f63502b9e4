"""The one documented place that loads the official client (node_agent.kube.official) keeps its promise.

Agent processes load the client's configuration, REST transport, exceptions and in-cluster loader only:
never its models, its API classes, its ``ApiClient`` or its kubeconfig loader (that is where the
memory goes). A later full ``import kubernetes`` in the same process (tests, benchmarks, the exec-plugin
fallback) still works and shares the very same module objects.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
#: What each agent process imports to talk to the API server, and one call through it.
ENTRY_POINTS = {
    "device plugin": "import node_agent.kubelet.deviceplugin.process, node_agent.deviceplugin.nodewatch",
    "DRA plugin": "import node_agent.kubelet.dra.process",
    "MIG manager": "import node_agent.cli.mig",
    "labeller": "import node_agent.labeller.labels, node_agent.labeller.nodepatch",
}
PROBE = """
import json, sys
{imports}
from node_agent.kube.transport import Kube
try:
    Kube.for_url("http://127.0.0.1:9").get("/api/v1/nodes/x")
except Exception as e:
    kind = type(e).__name__
print(json.dumps({{"error": kind, "modules": sorted(m for m in sys.modules if m.startswith("kubernetes"))}}))
"""
HEAVY = ("kubernetes.client.models", "kubernetes.client.api", "kubernetes.client.api_client", "kubernetes.watch",
         "kubernetes.dynamic", "kubernetes.config.kube_config", "kubernetes.utils.create_from_yaml")


def _run(code: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.parametrize("agent", sorted(ENTRY_POINTS))
def test_agents_never_import_the_models_or_api_classes(agent: str) -> None:
    seen = _run(PROBE.format(imports=ENTRY_POINTS[agent]))
    assert seen["error"] == "Unreachable"
    modules = list(seen["modules"])  # type: ignore[call-overload]
    assert "kubernetes.client.rest" in modules
    assert not [m for m in modules if m.startswith(HEAVY)], modules
    assert "kubernetes" not in modules  # the placeholder packages are gone again


def test_a_full_import_afterwards_shares_the_same_modules() -> None:
    seen = _run("""
import json
from node_agent.kube import official
import kubernetes
from kubernetes import client, config
from kubernetes.client import rest, exceptions
print(json.dumps({"error": "", "modules": [], "same": [
    client.Configuration is official.Configuration, rest.RESTClientObject is official.RESTClientObject,
    exceptions.ApiException is official.ApiException, hasattr(client, "CoreV1Api"),
    config.load_incluster_config is not None]}))
""")
    assert seen["same"] == [True] * 5

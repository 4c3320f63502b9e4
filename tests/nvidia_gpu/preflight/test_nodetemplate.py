"""When ``up`` releases other managers' claims on the NodeGroups' node template (``preflight.nodetemplate``):
only under the Deckhouse backend and only where a kubeconfig names the cluster. The release itself runs
against the real API server in ``tests/cluster/test_day_two_nodegroup.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nvgpu.stackconfig import StackConfig, load_stack_config
from nvidia_gpu.preflight import nodetemplate


def config(**cluster: Any) -> StackConfig:
    return load_stack_config({
        "cluster": {"kubernetesVersion": "1.34", "agentImage": "registry.example.com/agent:1.0", **cluster},
        "nodeGroups": [{"name": "a30", "nodeGroup": "gpu-a30", "gpu": {"model": "A30-24GB"}}],
    })


def test_nothing_to_release_under_the_daemonset_backend(tmp_path: Path) -> None:
    # Not even a connection: the kubeconfig below points nowhere.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\ncurrent-context: x\ncontexts: [{name: x, context: "
                          "{cluster: x, user: x}}]\nclusters: [{name: x, cluster: {server: 'https://127.0.0.1:9'}}]\n"
                          "users: [{name: x, user: {}}]\n")
    assert nodetemplate.run(config(nodeSetup="daemonset"), [kubeconfig]) == []


def test_without_a_kubeconfig_file_the_provider_says_why_it_cannot_connect(tmp_path: Path) -> None:
    assert nodetemplate.run(config(nodeSetup="deckhouse"), [tmp_path / "missing"]) == []

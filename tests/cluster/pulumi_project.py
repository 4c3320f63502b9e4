"""The dev stack's project run by the real Pulumi CLI against a control plane prepared as a Deckhouse
user's cluster (used by ``test_pulumi_engine.py`` and ``bench/bench_engine.py``).

The project is a copy of the entry files in a temporary directory (the repository's packages on
``PYTHONPATH``), so config changes never touch the committed ``Pulumi.<stack>.yaml``; state lives in a
file backend there, and the CLI, language host and provider are the pinned ones (``make tools``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster import ApiError, ControlPlane, Kube
from localcluster.dryrun import install_crds
from localcluster.objects import create_kwok_node, wait_for
from tests.cluster.stack import rendered
from tests.kit.tools import required_bin

REPO = Path(__file__).resolve().parents[2]
SETUP = "node.deckhouse.io/gpu-setup-complete"
NODE_GROUPS = ("gpu-a100", "gpu-a30", "gpu-h100", "gpu-h200", "gpu-l4")
#: What the cluster held before the stack, compared after ``destroy`` (kinds the stack creates or patches).
KINDS = [("v1", "Namespace"), ("v1", "ConfigMap"), ("v1", "ServiceAccount"), ("v1", "ResourceQuota"),
         ("apps/v1", "DaemonSet"), ("rbac.authorization.k8s.io/v1", "ClusterRole"),
         ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"), ("rbac.authorization.k8s.io/v1", "Role"),
         ("rbac.authorization.k8s.io/v1", "RoleBinding"), ("node.k8s.io/v1", "RuntimeClass"),
         ("resource.k8s.io/v1", "DeviceClass"), ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
         ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
         ("deckhouse.io/v1alpha1", "NodeGroupConfiguration"), ("deckhouse.io/v1", "NodeGroup"),
         ("v1", "Service"), ("monitoring.coreos.com/v1", "ServiceMonitor"),
         ("monitoring.coreos.com/v1", "PrometheusRule"), ("apiextensions.k8s.io/v1", "CustomResourceDefinition")]


@dataclass
class Project:
    """The stack's project in a temporary directory, and the CLI's environment."""

    directory: Path
    env: dict[str, str]
    stack: str = "dev"

    def pulumi(self, *args: str, timeout: float = 600.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["pulumi", *args, "--non-interactive"], cwd=self.directory, env=self.env,
                              capture_output=True, text=True, timeout=timeout, check=False)
        if check:
            assert done.returncode == 0, f"pulumi {' '.join(args)}: rc {done.returncode}\n{done.stdout[-6000:]}\n" \
                                         f"{done.stderr[-3000:]}"
        return done

    def config_file(self) -> Path:
        return self.directory / f"Pulumi.{self.stack}.yaml"


def _served(kube: Kube, kinds: list[tuple[str, str]]) -> bool:
    try:
        for api, kind in kinds:
            kube.list(api, kind)
    except ApiError:
        return False  # 429 "storage is (re)initializing" right after a CRD is established
    return True


def prepare_cluster(cp: ControlPlane, kinds: list[tuple[str, str]] = KINDS) -> None:
    """What a Deckhouse user's cluster has before the stack: the NodeGroups (the stack only patches their
    node template), the claim quota's tenant namespace, and a set-up kwok Node per group, so that every
    GPU DaemonSet really rolls out under the provider's await."""
    kube = cp.admin()
    install_crds(kube, sorted((REPO / "nvidia_gpu" / "preview" / "crds").glob("*.yaml")))
    wait_for(lambda: _served(kube, kinds), timeout=60, what="the Deckhouse and Prometheus Operator CRDs served")
    for ng in NODE_GROUPS:
        kube.create({"apiVersion": "deckhouse.io/v1", "kind": "NodeGroup", "metadata": {"name": ng},
                     "spec": {"nodeType": "Static"}})
        create_kwok_node(kube, f"engine-{ng}", {"node.deckhouse.io/group": ng, SETUP: ""})
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "research"}})


def make_project(cluster: ControlPlane, work: Path, stack: str = "dev") -> Project:
    """The project under ``work`` with a CLI environment that reaches ``cluster`` through the kubeconfig
    context the stack's config names (``cluster.kubeContext``)."""
    bin_dir = required_bin("pulumi", "pulumi-language-python", "pulumi-resource-kubernetes")
    directory = work / "project"
    directory.mkdir(parents=True)
    meta = yaml.safe_load((REPO / "Pulumi.yaml").read_text())
    meta["runtime"]["options"]["virtualenv"] = str(REPO / ".venv")
    (directory / "Pulumi.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    shutil.copy(REPO / "__main__.py", directory / "__main__.py")
    # The committed stack config, without the secrets salt a developer's own `pulumi stack init` may
    # have written into it (this project's backend and passphrase are its own).
    config = yaml.safe_load((REPO / f"Pulumi.{stack}.yaml").read_text())
    config.pop("encryptionsalt", None)
    (directory / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    context = (config.get("config", {}).get("nvidia-gpu:cluster") or {}).get("kubeContext") or "admin"
    kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
    kubeconfig["contexts"][0]["name"] = context
    kubeconfig["current-context"] = context
    (work / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    (work / "state").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_")}
    # HOME too: the provider keeps its discovery cache under ~/.kube, which another clone's run shares.
    env.update(PATH=f"{bin_dir}:{env.get('PATH', '')}", PYTHONPATH=str(REPO), KUBECONFIG=str(work / "kubeconfig"),
               HOME=str(work / "home"), PULUMI_HOME=str(work / "home"), PULUMI_BACKEND_URL=f"file://{work / 'state'}",
               PULUMI_CONFIG_PASSPHRASE="engine-test", PULUMI_SKIP_UPDATE_CHECK="true",
               PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION="true")
    return Project(directory, env, stack)


def object_key(inputs: dict[str, Any], type_token: str) -> tuple[str, str, str]:
    meta = inputs.get("metadata") or {}
    return inputs.get("kind", type_token.rsplit(":", 1)[-1]), meta.get("namespace", ""), meta.get("name", "")


def assert_same_objects(steps: list[dict[str, Any]], stack: str) -> None:
    """The objects ``pulumi preview`` would create are the ones the offline preview renders for ``stack``."""
    engine = {object_key(s["newState"]["inputs"], s["newState"]["type"]) for s in steps
              if s["op"] == "create" and s["newState"]["type"].startswith("kubernetes:")}
    offline = {(m.object["kind"], m.object["metadata"].get("namespace", ""), m.object["metadata"]["name"])
               for m in rendered(stack).manifests}
    # The provider's check gives a patch of a custom resource it has no schema for the namespace
    # ``default`` even when the kind is cluster-scoped (the Deckhouse NodeGroup); the server ignores it.
    cluster_scoped = {(k, n) for k, ns, n in offline if not ns}
    engine = {(k, "" if (k, n) in cluster_scoped and ns == "default" else ns, n) for k, ns, n in engine}
    assert engine == offline, f"engine only: {sorted(engine - offline)}; offline only: {sorted(offline - engine)}"


def settled(kube: Kube, expected: dict[str, Any], kinds: list[tuple[str, str]] = KINDS,
            timeout: float = 60.0) -> dict[str, Any]:
    """The snapshot once it equals ``expected``, or the last one after ``timeout``: the shared definitions
    (the GPU CRD, the RuntimeClass, the DeviceClasses) are retained by Pulumi and deleted by the garbage
    collector once their owning namespace is gone, a moment after ``destroy`` returns."""
    last: dict[str, Any] = {}

    def same() -> bool:
        nonlocal last
        last = snapshot(kube, kinds)
        return last == expected

    with contextlib.suppress(TimeoutError):
        wait_for(same, timeout=timeout, interval=1.0, what="the cluster as it was")
    return last


def snapshot(kube: Kube, kinds: list[tuple[str, str]] = KINDS) -> dict[str, Any]:
    """What the cluster holds of ``kinds`` (a NodeGroup with its spec: the stack patches it), compared
    before the stack and after ``destroy``."""
    out: dict[str, Any] = {}
    for api, kind in kinds:
        for o in kube.list(api, kind):
            meta = o["metadata"]
            if meta["name"].startswith(("kube-", "system:", "default", "extension-apiserver")):
                continue
            out[f"{kind}/{meta.get('namespace', '')}/{meta['name']}"] = o.get("spec") if kind == "NodeGroup" else None
    return out

"""The real pack process over gRPC, started the way the Pulumi CLI starts a Python pack.

Never constructs ``PolicyPack`` in this process: :class:`PackProcess` runs ``python -u -m pulumi.policy``
in the pack directory and talks to the port it prints.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

from nvgpu.version import VERSION
from nvidia_gpu.policies.pack import POLICIES
from nvidia_gpu.preview.policyrun.analyzer_client import (
    AnalyzerResource,
    Diagnostic,
    PackError,
    PackProcess,
    PolicyConfigError,
    StackContext,
)
from nvidia_gpu.preview.policyrun.report import format_policies
from tests.nvidia_gpu.policies.policy_fixtures import CM_TYPE, DS_TYPE, config_map, container, daemonset

pytestmark = pytest.mark.slow

EXPORTER = daemonset("exporter", role="exporter",
                     containers=[container("exporter", securityContext={"privileged": True})])
EXPORTER_URN = "urn:pulumi:dev::nvidia-gpu::kubernetes:apps/v1:DaemonSet::exporter"


def _mps(replicas: int) -> AnalyzerResource:
    cm = config_map({"MPS": {"version": "v1", "flags": {"plugin": {"deviceListStrategy": ["volume-mounts"]}},
                             "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}}},
                    name="dp")
    return AnalyzerResource(CM_TYPE, "urn:pulumi:dev::nvidia-gpu::kubernetes:core/v1:ConfigMap::dp", "dp", cm)


@pytest.fixture
def pack() -> Iterator[PackProcess]:
    with PackProcess(stack=StackContext("nvidia-gpu", "dev")) as p:
        yield p


def test_pack_serves_every_policy_with_its_level_and_schema(pack: PackProcess) -> None:
    info = pack.info
    assert info is not None
    assert (info.name, info.version) == ("nvidia-gpu", VERSION)
    served = {p.name: p for p in info.policies}
    assert set(served) == {p.name for p in POLICIES}
    for p in POLICIES:
        assert served[p.name].enforcement_level == (p.enforcement_level.value if p.enforcement_level else "advisory")
        assert served[p.name].description == p.description
    assert served["node-groups-disjoint"].stack_policy and not served["pinned-images"].stack_policy
    assert served["sharing-parameters-valid"].config_schema["mpsMaxReplicas"]["maximum"] == 48
    assert pack.start_seconds < 10


def test_analyze_reports_the_violation_as_the_cli_receives_it(pack: PackProcess) -> None:
    diags = pack.analyze(AnalyzerResource(DS_TYPE, EXPORTER_URN, "exporter", EXPORTER))
    assert diags == [Diagnostic(
        policy_name="host-access-allow-listed",
        pack_name="nvidia-gpu",
        pack_version=VERSION,
        description="Privileged containers, hostPath volumes and host namespaces only for allow-listed agent roles.",
        message="Privileged containers, hostPath volumes and host namespaces only for allow-listed agent roles.\n"
                "DaemonSet 'exporter' (role 'exporter'): container 'exporter' is privileged",
        enforcement_level="mandatory",
        urn=EXPORTER_URN,
        resource_type=DS_TYPE,
        resource_name="exporter",
    )]


def test_clean_resource_has_no_diagnostics(pack: PackProcess) -> None:
    assert pack.analyze(AnalyzerResource(DS_TYPE, "urn:x", "device-plugin-h100", daemonset())) == []


def test_unknown_value_during_preview_is_an_advisory_note(pack: PackProcess) -> None:
    ds = daemonset()
    ds["spec"]["template"]["spec"]["containers"][0]["image"] = UNKNOWN_STRING_VALUE
    (diag,) = pack.analyze(AnalyzerResource(DS_TYPE, "urn:x", "x", ds))
    assert diag.enforcement_level == "advisory"
    assert diag.message == (
        "can't run policy 'pinned-images' from policy pack 'nvidia-gpu@v0.0.1' during preview: string value at "
        ".spec.template.spec.containers.0.image can't be known during preview"
    )


def test_analyze_stack_sees_the_stack_config_from_the_environment() -> None:
    config = {"nvidia-gpu:nodeGroups": [{"name": "h200", "nodeGroup": "gpu-h200",
                                         "gpu": {"model": "H200-141GB", "driverVersion": "535.104.05"}}]}
    with PackProcess(stack=StackContext("nvidia-gpu", "dev", config)) as pack:
        diags = pack.analyze_stack([AnalyzerResource(DS_TYPE, EXPORTER_URN, "exporter", EXPORTER)])
    assert [(d.policy_name, d.message.splitlines()[-1], d.urn, d.mandatory) for d in diags] == [(
        "driver-meets-gpu-minimum",
        "nvidia-gpu:nodeGroups[h200].gpu.driverVersion: driver 535.104.05 is below the H200-141GB minimum 550.54.14",
        "",
        True,
    )]
    text = format_policies(pack.info, diags, source="local: policies", project="nvidia-gpu", stack="dev")  # type: ignore[arg-type]
    assert text == (
        "Policies:\n"
        f"    ❌ nvidia-gpu@v{VERSION} (local: policies)\n"
        "        - [mandatory]  driver-meets-gpu-minimum  (pulumi:pulumi:Stack: nvidia-gpu-dev)\n"
        "          A declared NVIDIA driver must meet the GPU model's minimum.\n"
        "          nvidia-gpu:nodeGroups[h200].gpu.driverVersion: driver 535.104.05 is below the H200-141GB "
        "minimum 550.54.14"
    )


def test_dra_version_unknown_still_reports_device_class_cel(pack: PackProcess) -> None:
    dc = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu"},
          "spec": {"selectors": [{"cel": {"expression": "true"}}]}}
    urn = "urn:pulumi:dev::nvidia-gpu::kubernetes:resource.k8s.io/v1:DeviceClass::gpu"
    diags = pack.analyze_stack([AnalyzerResource("kubernetes:resource.k8s.io/v1:DeviceClass", urn, "gpu", dc)])
    assert [(d.policy_name, d.message.splitlines()[-1], d.urn) for d in diags] == [(
        "dra-objects-valid",
        "DeviceClass 'gpu': no CEL selector tests device.driver; add device.driver == \"gpu.nvidia.com\"",
        urn,
    )]


def test_configure_sets_levels_and_properties_like_policy_pack_config(pack: PackProcess) -> None:
    pack.configure({"all": "advisory", "sharing-parameters-valid": {"mpsMaxReplicas": 8},
                    "host-access-allow-listed": "disabled"})
    (mps,) = pack.analyze(_mps(16))
    assert mps.enforcement_level == "advisory"
    assert mps.message.endswith("replicas must be an integer from 2 to 8 (got 16)")
    assert pack.analyze(AnalyzerResource(DS_TYPE, EXPORTER_URN, "exporter", EXPORTER)) == []


def test_policy_without_a_level_in_config_keeps_its_default(pack: PackProcess) -> None:
    pack.configure({"sharing-parameters-valid": {"mpsMaxReplicas": 8}})
    (mps,) = pack.analyze(_mps(16))
    assert mps.enforcement_level == "mandatory"


def test_configure_rejects_what_the_cli_would(pack: PackProcess) -> None:
    with pytest.raises(PolicyConfigError) as err:
        pack.configure({"no-such-policy": "advisory", "pinned-images": "loud",
                        "sharing-parameters-valid": {"mpsMaxReplicas": 100, "typo": 1}})
    assert err.value.problems[0].startswith("no-such-policy: no policy of that name in nvidia-gpu; policies: ")
    assert err.value.problems[1:] == [
        "pinned-images: enforcement level 'loud' is not one of advisory, mandatory, remediate, disabled",
        "sharing-parameters-valid.mpsMaxReplicas: 100 is greater than the maximum of 48",
        "sharing-parameters-valid: Additional properties are not allowed ('typo' was unexpected)",
    ]


def test_pack_that_fails_to_start_reports_its_stderr(tmp_path: Path) -> None:
    (tmp_path / "PulumiPolicy.yaml").write_text("runtime: python\nversion: 0.0.1\n")
    (tmp_path / "__main__.py").write_text("raise SystemExit('broken pack: ' + 'no policies')\n")
    with pytest.raises(PackError) as err:
        PackProcess(tmp_path).start()
    assert "failed to start (exit 1)" in str(err.value)
    assert "broken pack: no policies" in str(err.value)


_NOISY_PACK = """
import sys
from pulumi_policy import PolicyPack, ResourceValidationPolicy

def noisy(args, report):
    sys.stdout.write("x" * 200_000 + "\\n")
    sys.stdout.flush()
    report("seen " + args.name)

PolicyPack("noisy", [ResourceValidationPolicy("noisy", "Prints a lot.", noisy)])
"""


def test_a_pack_that_prints_a_lot_never_blocks(tmp_path: Path) -> None:
    (tmp_path / "PulumiPolicy.yaml").write_text("runtime: python\nversion: 0.0.2\n")
    (tmp_path / "__main__.py").write_text(_NOISY_PACK)
    with PackProcess(tmp_path, call_timeout=20) as pack:
        resources = [AnalyzerResource("t:m:R", f"urn:{i}", f"r{i}", {}) for i in range(3)]
        messages = [d.message for r in resources for d in pack.analyze(r)]
    assert messages == ["Prints a lot.\nseen r0", "Prints a lot.\nseen r1", "Prints a lot.\nseen r2"]


def test_analyze_stack_sees_a_config_larger_than_one_environment_string() -> None:
    """2,000 node groups: the config passes Linux's 128 KiB limit for one environment string, so the pack
    gets it by file, and a problem in the last group is still found."""
    groups = [{"name": f"g{i:04d}", "nodeGroup": f"gpu-{i:04d}", "gpu": {"model": "H100-80GB"}} for i in range(2000)]
    groups[-1]["gpu"] = {"model": "H200-141GB", "driverVersion": "535.104.05"}
    stack = StackContext("nvidia-gpu", "dev", {"nvidia-gpu:nodeGroups": groups})
    assert len(stack.flat_config()["nvidia-gpu:nodeGroups"]) > 128 * 1024
    with PackProcess(stack=stack) as pack:
        diags = pack.analyze_stack([AnalyzerResource(DS_TYPE, EXPORTER_URN, "exporter", EXPORTER)])
    assert [d.message.splitlines()[-1] for d in diags] == [
        "nvidia-gpu:nodeGroups[g1999].gpu.driverVersion: driver 535.104.05 is below the H200-141GB minimum 550.54.14"]


def test_stack_config_by_file_leaves_the_environment_small(tmp_path: Path) -> None:
    stack = StackContext("nvidia-gpu", "dev", {"nvidia-gpu:flag": "x"})
    env = stack.environment(tmp_path / "config.json")
    assert "PULUMI_CONFIG" not in env
    assert json.loads(Path(env["NVIDIA_GPU_STACK_CONFIG_FILE"]).read_text()) == {"nvidia-gpu:flag": "x"}


_SLOW_PACK = """
import time
from pulumi_policy import PolicyPack, ResourceValidationPolicy

def slow(args, report):
    time.sleep(3)

PolicyPack("slow", [ResourceValidationPolicy("slow", "Takes its time.", slow)])
"""


def test_a_pack_call_out_of_time_is_an_error_naming_it(tmp_path: Path) -> None:
    """Not a gRPC traceback: the preview's policy step reports which call ran out of time."""
    (tmp_path / "PulumiPolicy.yaml").write_text("runtime: python\nversion: 0.0.3\n")
    (tmp_path / "__main__.py").write_text(_SLOW_PACK)
    with PackProcess(tmp_path, call_timeout=0.5) as pack, pytest.raises(PackError) as err:
        pack.analyze_all([AnalyzerResource("t:m:R", "urn:slow", "slow", {})])
    assert "Analyze of urn:slow failed: DEADLINE_EXCEEDED" in str(err.value)


def test_pack_manifest_is_required(tmp_path: Path) -> None:
    with pytest.raises(PackError, match="failed to load Pulumi policy project"):
        PackProcess(tmp_path)


def test_stack_environment_matches_the_cli() -> None:
    env = StackContext("nvidia-gpu", "dev", {"nvidia-gpu:cluster": {"kubernetesVersion": "1.34"},
                                             "nvidia-gpu:flag": "x"}).environment()
    assert env["PULUMI_STACK"] == "dev" and env["PULUMI_PROJECT"] == "nvidia-gpu" and env["PULUMI_DRY_RUN"] == "true"
    assert json.loads(env["PULUMI_CONFIG"]) == {"nvidia-gpu:cluster": '{"kubernetesVersion":"1.34"}',
                                                "nvidia-gpu:flag": "x"}

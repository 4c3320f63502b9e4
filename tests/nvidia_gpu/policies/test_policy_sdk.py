"""The pack's one reach into ``pulumi_policy``: pinned to the SDK it was read against, and it changes nothing
a policy sees while converting each resource once per request instead of once per policy."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from pulumi_policy import policy

from nvidia_gpu.policies import sdk

ROOT = Path(__file__).resolve().parents[3]

# Runs in its own interpreter: ``install`` patches the SDK for the whole process, as the pack's
# ``__main__`` does, and the first half needs the SDK as it ships.
_PROBE = r"""
import json
from google.protobuf import json_format as real_json_format
from pulumi.runtime.proto import analyzer_pb2
from pulumi_policy import policy, ResourceValidationPolicy, StackValidationPolicy, EnforcementLevel
from nvidia_gpu.policies import sdk

conversions = 0
original = real_json_format.MessageToDict
def counting(message, *args, **kwargs):
    global conversions
    conversions += 1
    return original(message, *args, **kwargs)
real_json_format.MessageToDict = counting

def rule(tag):
    def validate(args, report):
        report(f"{tag} saw {args.props['spec']['replicas']} of {args.resource_type}")
    return validate

def stack_rule(tag):
    def validate(args, report):
        report(f"{tag} saw " + ",".join(str(r.props["spec"]["replicas"]) for r in args.resources))
    return validate

policies = [ResourceValidationPolicy(f"r{i}", "d", rule(f"r{i}")) for i in range(3)]
policies += [StackValidationPolicy(f"s{i}", "d", stack_rule(f"s{i}")) for i in range(2)]
servicer = policy._PolicyAnalyzerServicer(
    "probe", "0.0.1", policies, EnforcementLevel.ADVISORY, None, "d", None, None, None, None, None)

def resource(i):
    props = json_format_struct({"spec": {"replicas": i, "template": {"a": [1, 2, {"b": "c"}]}}})
    return props

def json_format_struct(value):
    from google.protobuf import struct_pb2
    s = struct_pb2.Struct(); s.update(value); return s

def run():
    global conversions
    out = {}
    conversions = 0
    req = analyzer_pb2.AnalyzeRequest(type="kubernetes:apps/v1:Deployment", urn="urn:a", name="a",
                                      properties=resource(2))
    out["analyze"] = [d.message for d in servicer.Analyze(req, None).diagnostics]
    out["analyze_conversions"] = conversions
    conversions = 0
    stack = analyzer_pb2.AnalyzeStackRequest(resources=[
        analyzer_pb2.AnalyzerResource(type="kubernetes:apps/v1:Deployment", urn=f"urn:{i}", name=str(i),
                                      properties=resource(i)) for i in range(4)])
    out["stack"] = [d.message for d in servicer.AnalyzeStack(stack, None).diagnostics]
    out["stack_conversions"] = conversions
    return out

before = run()
sdk.install()
sdk.install()
after = run()
print(json.dumps({"before": before, "after": after, "installed": sdk.installed()}))
"""


def test_the_adapter_is_pinned_to_the_installed_sdk() -> None:
    """A new ``pulumi-policy`` must be read again before the adapter may patch it."""
    assert metadata.version("pulumi-policy") == sdk.SDK_VERSION


def test_each_resource_is_converted_once_per_request_and_policies_see_the_same() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    before, after = result["before"], result["after"]
    assert result["installed"]
    seen = [f"d\nr{i} saw 2.0 of kubernetes:apps/v1:Deployment" for i in range(3)]  # the SDK prefixes descriptions
    assert after["analyze"] == before["analyze"] == seen
    assert after["stack"] == before["stack"] == [f"d\ns{i} saw 0.0,1.0,2.0,3.0" for i in range(2)]
    assert before["analyze_conversions"] == 3 and after["analyze_conversions"] == 1
    assert before["stack_conversions"] == 8 and after["stack_conversions"] == 4


@pytest.mark.parametrize(
    ("method", "call"),
    [
        ("Analyze", "deserialize_properties(json_format.MessageToDict(request.properties))"),
        ("Analyze", "unknown_checking_proxy(deserialized)"),
        ("AnalyzeStack", "deserialize_properties(json_format.MessageToDict(r.properties))"),
        ("AnalyzeStack", "unknown_checking_proxy(deserialized)"),
    ],
)
def test_the_calls_the_adapter_memoises_are_the_ones_the_servicer_makes(method: str, call: str) -> None:
    """If the SDK stops calling these module-level names, the memo would silently do nothing."""
    assert call in inspect.getsource(getattr(policy._PolicyAnalyzerServicer, method))

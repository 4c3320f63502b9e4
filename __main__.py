"""Pulumi entry point: read the ``nvidia-gpu:`` stack config, validate it, check the cluster, build the stack.

An invalid config stops here with every problem listed, before any resource is registered; so does a
collision with what the target cluster already holds (another stack, another installer): see
:mod:`nvidia_gpu.preflight`.
"""

import os

import pulumi

from nvgpu.stackconfig import StackConfigError, load_namespaced_config
from nvidia_gpu import build_stack
from nvidia_gpu.components.program import decode_config_value
from nvidia_gpu.components.register import recording
from nvidia_gpu.preflight import check as preflight
from nvidia_gpu.preflight import nodetemplate
from nvidia_gpu.preview.kubecontext import context_problem, kubeconfig_files
from nvidia_gpu.sdk import runtime

try:
    stack_config = load_namespaced_config(runtime.program_config(), decode_config_value)
except StackConfigError as e:
    raise pulumi.RunError(str(e)) from None
# A context the kubeconfig lacks fails deep in the provider with pages of traceback: say it in one line.
# Not under the offline preview's mock engine: no provider connects there, and no cluster is needed.
real_engine = not runtime.under_mock_engine()
wrong = context_problem(stack_config.cluster.kube_context, kubeconfig_files(os.environ),
                        f"Pulumi.{pulumi.get_stack()}.yaml") if real_engine else None
if wrong is not None:
    raise pulumi.RunError(wrong)
if real_engine:
    report = preflight.run(stack_config, stack=f"{pulumi.get_project()}/{pulumi.get_stack()}",
                           kubeconfigs=kubeconfig_files(os.environ))
    for line in report.warnings:
        pulumi.log.warn(line)
    if report.errors:
        raise pulumi.RunError("\n".join(f.line() for f in report.errors))
# `up` only (destroy does not run the program): other managers' claims on the NodeGroups' node template
# containers released, so that destroy can withdraw this stack's labels (nvidia_gpu.preflight.nodetemplate).
if real_engine and not runtime.is_preview():
    try:
        for line in nodetemplate.run(stack_config, kubeconfig_files(os.environ)):
            pulumi.log.info(line)
    except nodetemplate.ReleaseFailed as e:
        raise pulumi.RunError(str(e)) from None

with recording() as registered:
    build_stack(stack_config)
if real_engine and runtime.is_preview():
    # The server's validation is what a preview against the cluster is for: say where it will not run.
    applied = [(r.manifest["apiVersion"], r.manifest["kind"], (r.manifest.get("metadata") or {}).get("namespace"))
               for r in registered if r.mode != "read"]
    for line in preflight.dry_run_warnings(stack_config, kubeconfigs=kubeconfig_files(os.environ), applied=applied):
        pulumi.log.warn(line)

"""Pulumi entry point: read the ``nvidia-gpu:`` stack config, validate it, build the stack.

An invalid config stops here with every problem listed, before any resource is registered.
"""

import os

import pulumi
from pulumi.runtime.config import CONFIG, get_config_env
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.settings import get_monitor

from nvgpu.stackconfig import StackConfigError, load_namespaced_config
from nvidia_gpu import build_stack
from nvidia_gpu.components.program import decode_config_value
from nvidia_gpu.preview.kubecontext import context_problem, kubeconfig_files

try:
    stack_config = load_namespaced_config({**get_config_env(), **CONFIG.get()}, decode_config_value)
except StackConfigError as e:
    raise pulumi.RunError(str(e)) from None
# A context the kubeconfig lacks fails deep in the provider with pages of traceback: say it in one line.
# Not under the offline preview's mock engine: no provider connects there, and no cluster is needed.
real_engine = not isinstance(get_monitor(), MockMonitor)
wrong = context_problem(stack_config.cluster.kube_context, kubeconfig_files(os.environ),
                        f"Pulumi.{pulumi.get_stack()}.yaml") if real_engine else None
if wrong is not None:
    raise pulumi.RunError(wrong)

build_stack(stack_config)

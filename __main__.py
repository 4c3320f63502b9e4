"""Pulumi entry point: read the ``nvidia-gpu:`` stack config, validate it, build the stack.

An invalid config stops here with every problem listed, before any resource is registered.
"""

import pulumi
from pulumi.runtime.config import CONFIG, get_config_env

from nvgpu.stackconfig import StackConfigError, load_stack_config
from nvidia_gpu import build_stack
from nvidia_gpu.components.program import runtime_config_values

try:
    stack_config = load_stack_config(runtime_config_values({**get_config_env(), **CONFIG.get()}))
except StackConfigError as e:
    raise pulumi.RunError(str(e)) from None

build_stack(stack_config)

"""The kubelet device plugin API v1beta1: generated messages and service stubs, loaded once.

Everything else imports the protocol from here (``api.pb``, ``api.grpc_api``), never the generated
modules directly, so the stubs are (re)generated before first use. The generated modules are typed
``Any`` on purpose: mypy must pass on a clean clone before any stub exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from node_agent.kubelet import codegen
from nvgpu import hostpaths

#: Generated next to ``deviceplugin_v1beta1.proto`` in this directory (``make proto`` generates every protocol).
_pb2, _pb2_grpc = codegen.load("deviceplugin_v1beta1", Path(__file__).resolve().parent)

pb: Any = _pb2
grpc_api: Any = _pb2_grpc

VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
DEVICE_PLUGIN_PATH = hostpaths.KUBELET_DEVICE_PLUGINS_DIR + "/"
KUBELET_SOCKET_NAME = "kubelet.sock"
SUPPORTED_VERSIONS = ("v1beta1",)

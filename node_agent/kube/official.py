"""The one place the agent loads the official client: its transport modules, without the packages' ``__init__``s.

Why: ``import kubernetes`` (or any ``import kubernetes.client.rest``, which runs ``kubernetes/__init__``
first) loads the dynamic client, the watch, the stream, the utils and the kubeconfig loader with requests,
oauthlib and jsonschema: 48 MiB of RSS against 19 MiB for ``urllib.request, ssl, json``. The device
plugin has a budget; the agent still wants the official client's tested pieces. Those pieces are
cheap on their own (about 25 MiB in all, 2 MiB over urllib3 itself): ``kubernetes.client.configuration``
(TLS, proxies, the bearer-token refresh hook), ``kubernetes.client.rest`` (the urllib3 pool, timeouts,
retries), ``kubernetes.client.exceptions`` and ``kubernetes.config.incluster_config`` (the ServiceAccount
loader that re-reads projected tokens). ``kubernetes.client``'s own ``__init__`` is lazy since v33 (models
and API classes load on first attribute access), so only three ``__init__``s are in the way:
``kubernetes``, ``kubernetes.config`` and ``kubernetes.utils``.

How: while the four modules load, each of those three package names not already imported is a bare
placeholder module whose ``__path__`` is the real directory, so submodule imports find the real files;
then the placeholders are removed again. The loaded submodules stay in ``sys.modules``, so a later full
``import kubernetes`` (a test, a benchmark, the exec-plugin kubeconfig fallback in
:mod:`node_agent.kube.credentials`) runs the real ``__init__``s and reuses these very module objects:
one ``Configuration`` class, one ``ApiException``. When ``kubernetes`` is already imported, nothing is
faked. ``tests/node_agent/kube/test_imports.py`` proves that agent processes never import
``kubernetes.client.models`` or the API classes and that a full import afterwards still works.
Pinned to the kubernetes release in requirements-agent.txt; a release that moves these modules fails
that test, not a node.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

#: Packages whose ``__init__`` imports (nearly) the whole client.
_HEAVY_PACKAGES = ("kubernetes", "kubernetes.config", "kubernetes.utils")


def _load() -> tuple[Any, Any, Any, Any]:
    placed: list[str] = []
    if "kubernetes" not in sys.modules:
        spec = importlib.util.find_spec("kubernetes")
        if spec is None or spec.origin is None:
            raise ImportError("the kubernetes package is not installed (requirements-agent.txt)")
        root = Path(spec.origin).parent
        for name in _HEAVY_PACKAGES:
            if name in sys.modules:
                continue
            package = types.ModuleType(name, "placeholder while node_agent.kube.official loads the transport")
            package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            package.__package__ = name
            sys.modules[name] = package
            placed.append(name)
    try:
        configuration = importlib.import_module("kubernetes.client.configuration")
        exceptions = importlib.import_module("kubernetes.client.exceptions")
        rest = importlib.import_module("kubernetes.client.rest")
        incluster = importlib.import_module("kubernetes.config.incluster_config")
    finally:
        for name in placed:
            del sys.modules[name]
    return configuration, exceptions, rest, incluster


_configuration, _exceptions, _rest, _incluster = _load()

#: ``kubernetes.client.Configuration``: host, TLS files, ``api_key``, ``retries``, proxy.
Configuration: Any = _configuration.Configuration
#: ``kubernetes.client.rest.RESTClientObject``: the urllib3 pool every call goes through.
RESTClientObject: Any = _rest.RESTClientObject
#: ``kubernetes.client.exceptions.ApiException``: what the transport raises for TLS errors (status 0).
ApiException: type[Exception] = _exceptions.ApiException
#: ``kubernetes.config.incluster_config.InClusterConfigLoader`` and its ``ConfigException``.
InClusterConfigLoader: Any = _incluster.InClusterConfigLoader
ConfigException: type[Exception] = _incluster.ConfigException

"""The node agent's one Kubernetes layer: the only package of the agent that imports ``kubernetes``.

Every agent process talks to the API server through here: the device plugin (its node label watch),
the DRA kubelet plugin, the MIG manager, the labeller and the one-shot commands. Consumers keep narrow
Protocols of their own (``node_agent.dra.api.DraApi``, ``node_agent.mig.kube.NodeApi``, the labeller's
``node_agent.labeller.nodepatch.NodeApi``) implemented over these modules, and fakes of those in tests.

* :mod:`.credentials`: ``--kubeconfig``, the pod's ServiceAccount, or the default kubeconfig;
* :mod:`.transport`: :class:`~.transport.Kube`, raw JSON over the official client's urllib3 transport,
  bounded timeouts and retries;
* :mod:`.errors`: one hierarchy (``NotFound``, ``Conflict``, ``Gone``, ``Unreachable``...): callers catch
  classes, never status integers;
* :mod:`.watch`: list then watch, bookmarks, 410 re-list, backoff with jitter, stop;
* :mod:`.nodes`, :mod:`.events`, :mod:`.pods`, :mod:`.resource_v1`: the few resources the agents touch;
* :mod:`.nodeowner`: whose keys on a Node are whose, and the one way a service changes its Node (every
  Node write of the labeller, node setup, the MIG manager and the driver upgrade controller);
* :mod:`.ownnode`: the own Node kept current by a watch.

The official client, but not all of it (decision and measurements in :mod:`.official`): ``import
kubernetes`` costs 48 MiB of RSS, more than half the device plugin's budget, and its typed models drop
fields they do not know. The agent uses the client's ``Configuration``, its urllib3 ``RESTClientObject``,
its exceptions and its in-cluster loader (about 25 MiB with Python itself), loaded in exactly one place,
:mod:`.official`, without the package ``__init__``s that import the rest. Every call is raw JSON. Agent
processes never import ``kubernetes.client.models`` or the API classes (tested).

Measured (``bench/bench_agent_memory.py``, peak RSS, simulated DGX H100, kubeconfig to a loopback
emulator), before this layer -> with it: device plugin watching its config label 67 -> 62 MiB (serving one
fixed config it never loads this layer: 61 MiB either way), DRA kubelet plugin 80 -> 60 MiB, MIG manager
73 -> 44 MiB, labeller loop 54 -> 42 MiB, one-shot ``labels --patch-node`` 54 -> 42 MiB. The device plugin
loads the layer only when it watches a label (``node_agent.deviceplugin.nodewatch``).

The trick in :mod:`.official` is the fragile part: it depends on where the pinned release keeps four
modules and on ``kubernetes.client``'s ``__init__`` staying lazy (it is since v33).
``tests/node_agent/kube/test_imports.py`` fails, in CI and not on a node, when an upgrade breaks either; the fallback
then is a plain ``import kubernetes`` here (+23 MiB per process, nothing else changes).

This ``__init__`` imports only :mod:`.errors`, so ``from node_agent.kube import KubeError`` in a command
that may never call the API server costs nothing.
"""

from __future__ import annotations

from node_agent.kube.errors import (
    BadRequest,
    BadResponse,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    KubeError,
    MethodNotAllowed,
    NoCredentials,
    NotFound,
    ServerError,
    TooManyRequests,
    Unauthorized,
    Unreachable,
)

__all__ = ["BadRequest", "BadResponse", "Conflict", "Forbidden", "Gone", "Invalid", "KubeError", "MethodNotAllowed",
           "NoCredentials", "NotFound", "ServerError", "TooManyRequests", "Unauthorized", "Unreachable"]

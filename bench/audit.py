"""The API server's audit log as the fleet benches read it: who sent how many requests of which verb.

``bench_fleet.py`` (the agents of GPU nodes) and ``bench_controllers.py`` (the cluster-wide controllers)
run a real kube-apiserver with an audit policy of their own and count, per ServiceAccount of one
namespace, the requests received in a window. One ``RequestReceived`` event is one request.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any


def apiserver_args(policy: str, work: Path) -> tuple[tuple[str, ...], Path]:
    """kube-apiserver's flags for ``policy`` (written under ``work``), and where the log will be."""
    policy_file, log = work / "audit-policy.yaml", work / "audit.log"
    policy_file.write_text(policy)
    return ("--audit-policy-file", str(policy_file), "--audit-log-path", str(log), "--audit-log-format", "json",
            "--audit-log-maxsize", "0"), log


def count(audit: Path, namespace: str, since: datetime, until: datetime) -> Counter[tuple[str, str, str]]:
    """``(account, verb, resource)`` -> requests received in ``[since, until)`` from the ServiceAccounts of
    ``namespace`` (a subresource counts as ``resource/subresource``)."""
    out: Counter[tuple[str, str, str]] = Counter()
    prefix = f"system:serviceaccount:{namespace}:"
    for line in audit.read_text().splitlines():
        with contextlib.suppress(ValueError):
            event: dict[str, Any] = json.loads(line)
            user = str((event.get("user") or {}).get("username") or "")
            when = datetime.fromisoformat(str(event.get("requestReceivedTimestamp")).replace("Z", "+00:00"))
            if not user.startswith(prefix) or not since <= when < until:
                continue
            ref = event.get("objectRef") or {}
            resource = str(ref.get("resource") or "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            out[(user.removeprefix(prefix), str(event.get("verb")), resource)] += 1
    return out

"""The agent's one Kubernetes error hierarchy: callers catch a class, never compare status integers.

Every call through :mod:`node_agent.kube.transport` fails with a :class:`KubeError` subclass chosen by
what the caller can do about it: a :class:`NotFound` object is "already gone" to a delete and "absent" to
a read, a :class:`Conflict` means "re-read and decide again", :class:`Gone` means "list again" to a
watch, :class:`TooManyRequests` (a PodDisruptionBudget refusing an eviction, or API priority and
fairness) means "not yet", and :class:`Unreachable` means no answer came at all (refused connection,
timeout, TLS failure). The original exception is chained (``raise ... from e``) so logs keep the cause.
"""

from __future__ import annotations


class KubeError(RuntimeError):
    """An API call failed. ``status`` is the HTTP status, ``None`` when no HTTP answer came."""

    status: int | None = None

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class NoCredentials(KubeError):
    """No usable kubeconfig or in-cluster ServiceAccount: nothing to connect with."""


class Unreachable(KubeError):
    """No HTTP answer: connection refused or reset, a timeout, a TLS failure."""


class BadResponse(KubeError):
    """The API server answered, but not with the JSON the call expects."""


class BadRequest(KubeError):
    """400: the request itself is wrong (a bad selector, a malformed body): a bug, not worth a retry."""

    status = 400


class Unauthorized(KubeError):
    """401: the token was not accepted (expired, or its ServiceAccount or pod is gone)."""

    status = 401


class Forbidden(KubeError):
    """403: RBAC or an admission policy refuses this identity; it can pass (a ClusterRole being replaced)."""

    status = 403


class NotFound(KubeError):
    """404: already gone to a delete, absent to a read."""

    status = 404


class MethodNotAllowed(KubeError):
    """405: the verb is not served for this resource (a watch an API server refuses)."""

    status = 405


class Conflict(KubeError):
    """409: a ``resourceVersion`` precondition failed (re-read, decide again) or the object exists."""

    status = 409


class Gone(KubeError):
    """410: a watch's or list's resourceVersion is older than the API server keeps; list again."""

    status = 410


class Invalid(KubeError):
    """422: the object fails validation or a ValidatingAdmissionPolicy: the message says which field."""

    status = 422


class TooManyRequests(KubeError):
    """429: not now (a PodDisruptionBudget refusing an eviction, API priority and fairness): retry later."""

    status = 429


class ServerError(KubeError):
    """5xx: the API server (or something in front of it) failed; worth retrying later."""


_BY_STATUS: dict[int, type[KubeError]] = {
    c.status: c for c in (BadRequest, Unauthorized, Forbidden, NotFound, MethodNotAllowed, Conflict, Gone, Invalid,
                          TooManyRequests) if c.status is not None
}


def for_status(status: int, message: str) -> KubeError:
    """The error for an HTTP ``status`` of 400 or more (a plain :class:`KubeError` for the rare others)."""
    if status >= 500:
        return ServerError(message, status)
    return _BY_STATUS.get(status, KubeError)(message, status)

"""The agent's one transport to the API server: raw JSON over the official client's urllib3 pool.

:class:`Kube` sends a method, a path and a JSON body through ``kubernetes.client.rest.RESTClientObject``
(TLS, client certificates, proxies and the connection pool come from the official client) and answers
the decoded JSON. No typed API classes or models: ``CoreV1Api`` alone costs 0.3 s of import time and
20 MiB of RSS, and the models' deserialisation drops fields they do not know (a taint's ``timeAdded``
survives a raw read and re-send, not a model round trip).

Bounded, so a frozen API server cannot hold a caller for minutes:

* every call has a (connect, read) timeout, :data:`REQUEST_TIMEOUT` unless the caller says otherwise;
* urllib3 retries each call up to three more times by default, so a stated timeout held per attempt:
  against a frozen API server a 30 s read took 120 s. :data:`RETRIES` allows one more try for a
  connection that could not be opened and none for a read: every caller has its own loop with backoff.

Failures raise the classes of :mod:`node_agent.kube.errors`, the cause chained.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlencode

from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.util.retry import Retry

from node_agent.kube import credentials, official
from node_agent.kube.errors import BadResponse, KubeError, Unreachable, for_status

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
#: (connect, read) seconds of one call.
REQUEST_TIMEOUT: tuple[float, float] = (5.0, 30.0)
#: One more try for a connection that could not be opened, none for a read (see the module docs).
RETRIES = Retry(total=1, connect=1, read=0, redirect=0, status=0, other=0)

Timeout = tuple[float, float] | float
Query = Mapping[str, str | int | bool]


class Kube:
    """One API server connection: credentials (a ``Configuration``) and the official urllib3 transport.

    Thread-safe (urllib3's pool is); ``calls`` counts requests for the benchmarks' calls-per-operation.
    """

    def __init__(self, configuration: Any, *, timeout: Timeout = REQUEST_TIMEOUT) -> None:
        configuration.retries = RETRIES
        self.configuration = configuration
        self.host = str(configuration.host).rstrip("/")
        self.timeout = timeout
        self.calls = 0
        self._rest = official.RESTClientObject(configuration)

    @classmethod
    def connect(cls, kubeconfig: str | Path | None = None, *, timeout: Timeout = REQUEST_TIMEOUT) -> Kube:
        """Credentials from :func:`node_agent.kube.credentials.load` (``--kubeconfig``, the pod's
        ServiceAccount, else the default kubeconfig)."""
        return cls(credentials.load(kubeconfig), timeout=timeout)

    @classmethod
    def for_url(cls, url: str, *, timeout: Timeout = REQUEST_TIMEOUT) -> Kube:
        """No credentials, plain HTTP: a loopback emulator or ``kubectl proxy``."""
        cfg = official.Configuration()
        cfg.host = url
        return cls(cfg, timeout=timeout)

    # -- calls ---------------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, *, query: Query | None = None,
                content_type: str = MERGE_PATCH, timeout: Timeout | None = None, what: str = "") -> Any:
        """One call; answers the decoded JSON (``None`` for an empty body). ``what`` names it in errors;
        ``content_type`` applies to PATCH (other bodies are plain JSON)."""
        what = what or f"{method} {path}"
        resp = self._send(method, path, body, query, content_type=content_type, timeout=timeout, what=what)
        try:
            data = resp.read()
        except (Urllib3Error, OSError) as e:
            raise Unreachable(f"{what}: {e}") from e
        if resp.status >= 400:
            raise for_status(resp.status, f"{what}: {resp.status} {_message(data, resp.reason)}")
        try:
            return json.loads(data) if data else None
        except ValueError as e:
            raise BadResponse(f"{what}: the API server sent no JSON ({e})", resp.status) from e

    def get(self, path: str, *, query: Query | None = None, timeout: Timeout | None = None, what: str = "") -> Any:
        return self.request("GET", path, query=query, timeout=timeout, what=what)

    def get_object(self, path: str, *, timeout: Timeout | None = None, what: str = "") -> dict[str, Any]:
        """A GET that must answer a JSON object."""
        obj = self.get(path, timeout=timeout, what=what)
        if not isinstance(obj, dict):
            raise BadResponse(f"{what or path}: the API server sent no JSON object")
        return obj

    def items(self, path: str, *, query: Query | None = None, what: str = "") -> list[dict[str, Any]]:
        """A list call's ``items``."""
        data = self.get(path, query=query, what=what)
        return [i for i in (data or {}).get("items") or [] if isinstance(i, dict)]

    def create(self, path: str, body: Mapping[str, Any], *, what: str = "") -> Any:
        return self.request("POST", path, dict(body), what=what)

    def merge_patch(self, path: str, body: Mapping[str, Any], *, what: str = "") -> Any:
        """A JSON merge patch: a key set to ``None`` is deleted, lists are replaced whole, keys not named
        are left alone (so labels owned by others are never clobbered by a read-modify-write)."""
        return self.request("PATCH", path, dict(body), what=what)

    def delete(self, path: str, *, what: str = "") -> Any:
        return self.request("DELETE", path, what=what)

    def stream(self, path: str, *, query: Query | None = None, read_timeout_s: float, what: str = "") -> Stream:
        """A streaming GET (a watch); the caller closes the :class:`Stream`. Raises like :meth:`request`."""
        what = what or f"GET {path}"
        resp = self._send("GET", path, None, query, content_type=MERGE_PATCH,
                          timeout=(_connect(self.timeout), read_timeout_s), what=what)
        if resp.status >= 400:
            try:
                data = resp.read()
            except (Urllib3Error, OSError):
                data = b""
            finally:
                resp.response.release_conn()
            raise for_status(resp.status, f"{what}: {resp.status} {_message(data, resp.reason)}")
        return Stream(resp.response, what)

    def _send(self, method: str, path: str, body: Any, query: Query | None, *, content_type: str,
              timeout: Timeout | None, what: str) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type if method == "PATCH" else "application/json"
        token = self.configuration.get_api_key_with_prefix("BearerToken")
        if token:
            headers["Authorization"] = token
        url = self.host + path
        if query:
            url += ("&" if "?" in path else "?") + urlencode({k: _query_value(v) for k, v in query.items()})
        self.calls += 1
        try:
            return self._rest.request(method, url, headers=headers, body=body,
                                      _request_timeout=self.timeout if timeout is None else timeout)
        except official.ApiException as e:  # TLS failures (status 0)
            raise Unreachable(f"{what}: {getattr(e, 'reason', e)}") from e
        except (Urllib3Error, OSError) as e:
            raise Unreachable(f"{what}: {e}") from e


class Stream:
    """An open streaming response: its lines as JSON, and a :meth:`shutdown` that works from any thread.

    ``shutdown`` shuts the socket's read side (urllib3's ``HTTPResponse.shutdown``, made to stop a read from
    elsewhere): a read blocked in another thread, or in this one between a signal handler's returns, sees
    end-of-stream at once. Closing the response instead would race the reader.
    """

    def __init__(self, response: Any, what: str) -> None:
        self._response = response
        self.what = what
        self._closed = threading.Event()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Each non-empty line decoded; a dead connection or a line that is no JSON raises."""
        buffer = b""
        try:
            for chunk in self._response.stream(amt=None, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield _event(line, self.what)
        except (Urllib3Error, OSError) as e:
            if self._closed.is_set():
                return
            raise Unreachable(f"{self.what}: {e}") from e
        if buffer.strip() and not self._closed.is_set():
            yield _event(buffer, self.what)

    def shutdown(self) -> None:
        """Break off the reads; never raises (the caller may be a signal handler)."""
        self._closed.set()
        try:
            self._response.shutdown()
        except (OSError, ValueError, RuntimeError, AttributeError) as e:  # already closed or released
            log.debug("event=stream-shutdown-skipped error=%s", e)

    def close(self) -> None:
        self._closed.set()
        try:
            self._response.release_conn()
            self._response.close()
        except (OSError, ValueError, RuntimeError, Urllib3Error) as e:
            log.debug("event=stream-close-failed error=%s", e)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _event(line: bytes, what: str) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except ValueError as e:
        raise BadResponse(f"{what}: a watch line is no JSON ({e})") from e
    if not isinstance(event, dict):
        raise BadResponse(f"{what}: a watch line is no JSON object")
    return event


def _message(data: bytes | None, reason: str | None) -> str:
    """The API server's ``Status.message`` when it sent one, else the HTTP reason."""
    try:
        status = json.loads(data or b"")
    except ValueError:
        status = None
    if isinstance(status, dict) and status.get("message"):
        return str(status["message"])
    return str(reason or "")


def _query_value(value: str | int | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _connect(timeout: Timeout) -> float:
    return timeout[0] if isinstance(timeout, tuple) else timeout


__all__ = ["MERGE_PATCH", "REQUEST_TIMEOUT", "RETRIES", "Kube", "KubeError", "Stream"]

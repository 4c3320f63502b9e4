"""``admission.k8s.io/v1`` AdmissionReview: the request as the API server sends it, and the answer.

Only the fields a decision reads are modelled; the rest is ignored (the API server adds fields across
releases). A review that is not one the guard can judge is refused with a 400 by the server, never
answered ``allowed``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

API_VERSION = "admission.k8s.io/v1"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class GroupVersionResource(_Model):
    group: str = ""
    version: str = ""
    resource: str = ""


class UserInfo(_Model):
    username: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, tuple[str, ...]] = Field(default_factory=dict)


class Request(_Model):
    uid: str = Field(min_length=1)
    resource: GroupVersionResource
    sub_resource: str = Field(default="", alias="subResource")
    name: str = ""
    namespace: str = ""
    operation: str
    user_info: UserInfo = Field(alias="userInfo")
    dry_run: bool = Field(default=False, alias="dryRun")


class AdmissionReview(_Model):
    api_version: str = Field(alias="apiVersion", pattern=f"^{API_VERSION}$")
    kind: str = Field(pattern="^AdmissionReview$")
    request: Request


def answer(uid: str, allowed: bool, *, code: int = 200, message: str = "") -> dict[str, Any]:
    """The AdmissionReview the API server expects back; a refusal carries its HTTP code and message."""
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        reason = {403: "Forbidden", 500: "InternalError"}.get(code, "BadRequest")
        response["status"] = {"code": code, "reason": reason, "message": message}
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}

"""What every section of the stack config shares: the base model, the value checks several sections use,
and how a problem is raised and reported.

Patterns validate with ``re.fullmatch`` (``re.match`` with ``$`` also accepts a trailing newline, so
``a100-mig\n`` was a second group beside ``a100-mig`` and the API server refused its objects halfway
through ``up``). Errors stay bounded whatever the input: a value is quoted cut
(:func:`nvgpu.errortext.shown`), the message lists as many problems as fit in 2,000 characters.
A model's check across its fields raises :class:`FieldProblems`, so each problem lands at the path of
the field to change rather than at the model.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Hashable, Mapping
from typing import Annotated, Any, ClassVar, Literal, Self, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ModelWrapValidatorHandler,
    model_validator,
)
from pydantic.alias_generators import to_camel

from nvgpu.errortext import capped, listed
from nvgpu.k8snames import check_dns_label
from nvgpu.stackconfig import renames

CONFIG_NAMESPACE = "nvidia-gpu"
#: The environment variable naming a file that holds the stack config as ``PULUMI_CONFIG`` would (a JSON
#: object of full keys to strings): how the offline preview hands a policy pack the config, since one
#: environment string may not pass 128 KiB on Linux (about 800 node groups).
CONFIG_FILE_ENV = "NVIDIA_GPU_STACK_CONFIG_FILE"

#: The largest integer a Kubernetes quantity or count holds (int64): a larger one renders, and the API
#: server refuses it.
INT64_MAX = 2**63 - 1

#: A path below the model that raised the problem, in the config's own key names.
Loc = tuple[int | str, ...]
_K = TypeVar("_K", bound=Hashable)


class FieldProblems(ValueError):
    """Problems a model validator finds across fields, each at the path of the field to change.

    A validator of the whole model is reported by pydantic at the model's own location (the top-level
    one printed as the empty path ``nvidia-gpu:``); raising this instead puts each problem where the
    user has to look, relative to that model (:func:`_problems` joins the two).
    """

    def __init__(self, problems: list[tuple[Loc, str]]):
        self.problems = problems
        super().__init__("; ".join(message for _, message in problems))


def raise_all(problems: list[tuple[Loc, str]]) -> None:
    if problems:
        raise FieldProblems(problems)


def first_indices(items: list[_K]) -> dict[_K, int]:
    """Where each item first appears: duplicates found in one pass (``list.index`` per item was
    quadratic, minutes for a list of 50,000 entries)."""
    first: dict[_K, int] = {}
    for i, item in enumerate(items):
        first.setdefault(item, i)
    return first


def _strict_bool(v: Any) -> Any:
    """A boolean, never its spelling: pydantic would read ``"false"``, ``"no"`` or ``0`` as False, but a
    quoted ``"false"`` in YAML is a string, and a reader that is not this program (a policy, kubectl,
    another Pulumi language) may take it as true."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        raise ValueError("must be a boolean, not a string: write true or false without quotes")
    raise ValueError("must be a boolean: true or false")


Bool = Annotated[bool, BeforeValidator(_strict_bool)]
DnsLabel = Annotated[str, AfterValidator(check_dns_label)]


_REPOSITORY = re.compile(r"[a-z0-9]+([._/:-][a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def check_repository(v: str) -> str:
    if len(v) > 255 or not _REPOSITORY.fullmatch(v):
        raise ValueError("must be an image repository without tag or digest, like "
                         "registry.example.com/platform/nvidia-gpu-agent (lowercase, at most 255 characters)")
    return v


def check_tag(v: str) -> str:
    if not _TAG.fullmatch(v):
        raise ValueError("must be an image tag: letters, digits, '_', '.' or '-', at most 128 characters, "
                         "not starting with '.' or '-'")
    return v


def check_digest(v: str) -> str:
    if not _DIGEST.fullmatch(v):
        raise ValueError("must be an image digest: 'sha256:' and 64 lowercase hexadecimal digits")
    return v


#: The parts of an image reference as the stack config writes them, each judged where it is written.
Repository = Annotated[str, AfterValidator(check_repository)]
Tag = Annotated[str, AfterValidator(check_tag)]
Digest = Annotated[str, AfterValidator(check_digest)]
#: A container's ``imagePullPolicy``, for every image the stack runs.
PullPolicy = Literal["IfNotPresent", "Always", "Never"]


def image_ref(repository: str, tag: str | None, digest: str | None) -> str:
    """``repository[:tag][@digest]``: the reference a container's ``image`` takes (by digest when there is
    one; the tag then only tells a reader which release it is)."""
    return repository + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")


class StackConfigError(ValueError):
    """Raised with every problem found, one per line, each naming its config path."""

    def __init__(self, problems: list[str]):
        self.problems = capped(problems, CONFIG_NAMESPACE)
        super().__init__(listed(self.problems, "invalid stack config:"))


class ConfigModel(BaseModel):
    """Every model of the stack config: unknown keys refused, camelCase keys (snake_case accepted), frozen,
    and the model's renamed keys read through the one deprecation path (:mod:`nvgpu.stackconfig.renames`)."""

    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True, use_enum_values=False
    )
    #: Keys of this model that an older release spelled otherwise: moved to their new place before validation.
    renamed_keys: ClassVar[tuple[renames.Rename, ...]] = ()

    @classmethod
    def config_where(cls, data: Mapping[str, Any]) -> str:
        """How a deprecation warning names this model's place in the config (``data``: its raw input), as a
        prefix of the renamed key's path; nothing by default (the model does not know where it is)."""
        return ""

    @model_validator(mode="wrap")
    @classmethod
    def _renamed_keys(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        if not cls.renamed_keys:
            return handler(data)
        try:
            moved, applied = renames.apply(cls.renamed_keys, data)
        except renames.BothSpellings as e:
            raise FieldProblems([(r.old, renames.both_message(r)) for r in e.renamed]) from None
        model = handler(moved)
        for rename, value in applied:  # after validation: a config that fails reports its errors alone
            warnings.warn(renames.ConfigDeprecationWarning(
                renames.deprecation_message(rename, value, cls.config_where(data))), stacklevel=2)
        return model



def absolute_path(v: str, example: str) -> str:
    parts = v.split("/")
    if not v.startswith("/") or ".." in parts or any(c in v for c in "\0\n"):
        raise ValueError(f"must be an absolute path without '..', {example}")
    return "/" + "/".join(p for p in parts if p not in ("", "."))


"""Kubernetes' own rules for label keys, label values and taint keys, checked when the config is read.

The real API server refuses a DaemonSet whose node affinity or tolerations break these rules (found
by the server dry-run: ``extraTaints[].key: "dedicated for ml"`` passed the schemas and failed at
``pulumi up``). Checking them here turns that into a config error that names the path, the value and
the rule, before anything is rendered. The rules are apimachinery's ``IsQualifiedName`` and
``IsValidLabelValue``.

Patterns are matched with ``fullmatch``: apimachinery's Go regexps end at ``$``, which in Go is the end of
the text, while Python's ``re.match`` with ``$`` also accepts a trailing newline. ``a100-mig`` and
``a100-mig\n`` both passed here, as two different node groups, and the API server refused the objects
named after the second halfway through ``pulumi up``. A refused value is quoted bounded
(:func:`nvgpu.errortext.shown`), whatever its length.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from nvgpu.errortext import shown

_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

QUALIFIED_NAME_RULE = ("an optional DNS-subdomain prefix and '/' (at most 253 characters), then a name of at most "
                       "63 characters: alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric")
DNS_SUBDOMAIN_RULE = ("at most 253 characters: lowercase alphanumerics, '-' or '.', starting and ending with an "
                      "alphanumeric")
DNS_LABEL_RULE = ("at most 63 characters: lowercase letters, digits or '-', starting and ending with a letter or "
                  "digit (no dots)")
LABEL_VALUE_RULE = ("empty, or at most 63 characters: alphanumerics, '-', '_' or '.', starting and ending with an "
                    "alphanumeric")


def qualified_name_problem(key: str) -> str | None:
    """Why ``key`` is not a valid label or taint key, or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return (f"{shown(key)} is not a valid key: the prefix {shown(prefix)} must be a DNS subdomain "
                f"({QUALIFIED_NAME_RULE})")
    if not name or len(name) > 63 or not _NAME_PART.fullmatch(name):
        return f"{shown(key)} is not a valid key: {QUALIFIED_NAME_RULE}"
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a valid label value (or taint value), or None."""
    if value == "":
        return None
    if len(value) > 63 or not _NAME_PART.fullmatch(value):
        return f"{shown(value)} is not a valid label value: {LABEL_VALUE_RULE}"
    return None


def dns_label_problem(name: str) -> str | None:
    """Why ``name`` is not a DNS label (a namespace or node group name: apimachinery's ``IsDNS1123Label``)."""
    if not name or len(name) > 63 or not _DNS_LABEL.fullmatch(name):
        return f"{shown(name)} is not a lowercase DNS label: {DNS_LABEL_RULE}"
    return None


def dns_subdomain_problem(name: str) -> str | None:
    """Why ``name`` is not a valid DNS-subdomain object name (apimachinery's ``IsDNS1123Subdomain``), or None."""
    if not name or len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        return f"{shown(name)} is not a valid object name: {DNS_SUBDOMAIN_RULE}"
    return None


def _validator(problem_of: Callable[[str], str | None]) -> Callable[[str], str]:
    """A pydantic ``AfterValidator`` raising what ``problem_of`` finds."""

    def check(value: str) -> str:
        problem = problem_of(value)
        if problem:
            raise ValueError(problem)
        return value

    return check


#: Pydantic validators: a label or taint key, a label or taint value, a DNS-subdomain object name, a DNS label.
check_key = _validator(qualified_name_problem)
check_label_value = _validator(label_value_problem)
check_dns_subdomain = _validator(dns_subdomain_problem)
check_dns_label = _validator(dns_label_problem)

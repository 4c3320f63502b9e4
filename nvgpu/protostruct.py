"""Values that crossed protobuf's ``Struct`` (Pulumi's engine protocol: config, policy config, component inputs).

``Struct`` has one number type, a double, so every integer arrives as a float: ``4`` as ``4.0``. Models
that want integers (a partition count, a JSON-schema bound) would refuse or mis-render those, so the
values are given back their integer spelling before they are validated.
"""

from __future__ import annotations

from typing import Any


def integral(value: Any) -> Any:
    """``value`` with every whole float, at any depth of dicts and lists, turned back into an int."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integral(v) for v in value]
    return value

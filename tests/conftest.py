"""Guards for the whole suite (see :mod:`tests.kit.ports`): no test may depend on a fixed TCP port."""

from __future__ import annotations

from tests.kit import ports

ports.install()

"""Guards and wiring for the whole suite.

No test may depend on a fixed TCP port (see :mod:`tests.kit.ports`). The simulated machines (``nvml_sim``)
are registered for every test, as ``node_agent.cli`` registers them for ``--nvml simulated:<machine>``: the
tests open ``simulated:<machine>`` sessions, resets and hosts in-process, without going through the CLI.
"""

from __future__ import annotations

from nvml_sim import provider
from tests.kit import ports

ports.install()
provider.register()

"""``python -m node_agent``: see ``node_agent.cli``."""

import sys

from node_agent.cli import main

sys.exit(main())

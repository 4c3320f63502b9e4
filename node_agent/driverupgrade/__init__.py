"""Driver upgrades one node at a time: a version change walks each node through cordon, drain, driver pod
replacement and validation, with the state kept on the node (``machine`` decides, ``controller`` acts)."""

"""Tests of node_agent.driverupgrade."""

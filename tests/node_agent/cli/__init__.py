"""Tests of node_agent.cli."""

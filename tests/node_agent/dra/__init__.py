"""Tests of node_agent.dra."""

"""Tests of node_agent.cdi."""

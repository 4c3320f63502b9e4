"""Tests of node_agent.host."""

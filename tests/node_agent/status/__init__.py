"""Tests of node_agent.status."""

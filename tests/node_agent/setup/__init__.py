"""Tests of node_agent.setup."""

"""Tests of node_agent.admission."""

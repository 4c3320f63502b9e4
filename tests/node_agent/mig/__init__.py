"""Tests of node_agent.mig."""

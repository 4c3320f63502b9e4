"""Tests of node_agent."""

"""Tests of nvgpu, the shared core."""

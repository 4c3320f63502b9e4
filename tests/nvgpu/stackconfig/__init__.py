"""Tests of nvgpu.stackconfig."""

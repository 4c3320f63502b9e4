"""Tests of nvidia_gpu.preflight."""

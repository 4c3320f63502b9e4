"""Tests of nvidia_gpu.sdk."""

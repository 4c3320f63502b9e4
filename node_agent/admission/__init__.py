"""Admission webhooks the API server calls: the eviction guard (see :mod:`nvgpu.evictionguard`)."""

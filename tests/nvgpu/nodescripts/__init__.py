"""Tests of nvgpu.nodescripts: the Deckhouse node scripts rendered, run on fake hosts, and against the agent's setup."""

//go:build tools

// NVIDIA's toolkit container's installer and the toolkit programs it installs, at the release the stack's
// toolkit image runs (nvgpu/toolkit.py DEFAULT_TAG): the tests run nvidia-ctk-installer with the arguments the
// stack renders against a fake host, from an artifacts tree of these programs, and point node setup at what
// it installed.
package main

import (
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook"
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime"
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime-hook"
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime.cdi"
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime.legacy"
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk"
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk-installer"
)

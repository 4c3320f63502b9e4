//go:build tools

// Package tools pins NVIDIA's device plugin and GPU feature discovery (see tools/build.sh).
package tools

import (
	_ "github.com/NVIDIA/k8s-device-plugin/cmd/gpu-feature-discovery"
	_ "github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin"
)

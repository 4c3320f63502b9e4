//go:build tools

// Package tools pins the NVIDIA DRA driver's GPU kubelet plugin (see tools/build.sh).
package tools

import _ "sigs.k8s.io/dra-driver-nvidia-gpu/cmd/gpu-kubelet-plugin"

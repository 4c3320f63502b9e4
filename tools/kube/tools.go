//go:build tools

// Package tools pins the Kubernetes commands the cluster tests build (see tools/build.sh), and kubectl,
// the client the README and the tests use, from the same release.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)

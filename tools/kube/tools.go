//go:build tools

// Package tools pins the Kubernetes commands the cluster tests build (see tools/build.sh): the control
// plane, kubectl (the client the README and the tests use) and the kubelet of the real nodes, from one release.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)

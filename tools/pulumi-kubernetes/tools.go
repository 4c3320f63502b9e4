//go:build tools

// Package tools pins the Kubernetes provider plugin the stack tests run (see tools/build.sh).
package tools

import _ "github.com/pulumi/pulumi-kubernetes/provider/v4/cmd/pulumi-resource-kubernetes"
